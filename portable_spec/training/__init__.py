"""Drafter training for any HF causal LM: `portable-spec train` runs recipe.run_recipe, the stages below in order,
each resumable in one work directory (work_dir.WorkDir names every path) and each owned by the module named after
it. Imports the core (and kernels through it) only.

| stage     | module                                  | settings (config.TrainRun)  | files in the work dir                  |
|-----------|-----------------------------------------|-----------------------------|----------------------------------------|
| prompts   | prompts.py (sharegpt.py, target_prompts)| prompts                     | train_prompts.json, heldout_prompts.json, prompt_settings.json |
| replies   | replies.py                              | replies                     | data/shard-*.safetensors, heldout/, distill.json |
| features  | features.py                             | features                    | data/features-*.safetensors, heldout/features-* |
| train     | drafter_shape.py, draft_vocab.py, batches.py, loss.py, state.py, loop.py, heldout.py | drafter, train, eval | state-<name>/, best-<name>/, <name>-loss.jsonl, <name>-heldout.jsonl |

Across stages: config.py (TrainRun; <name>-run.json), parallel.py (torchrun's ranks and where weights live),
work_dir.py (the layout and the one "same settings or refuse" rule). The fixture drafters are trained on a raw
token stream by scripts/fixture_training.py, outside this package.
"""
