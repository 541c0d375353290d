"""Running the pinned llama.cpp (build.py): targets converted by llama.cpp's own converter, drafters exported by
`export gguf`, and decoding through the harness (harness.cpp: llama-speculative-simple's loop, recording).

Conversion of a target is llama.cpp's `convert_hf_to_gguf.py --outtype f32` from the pinned tree, run with this
Python: the GGUF holds the HF directory's exact weights. llama.cpp names a BPE tokenizer's pre-tokenizer by a hash
of its ids on a test text and refuses one it does not know (a custom vocabulary such as the fixture target's);
the harness is fed token ids and never tokenizes, so such a tokenizer is written as GPT-2's (`tokenizer.ggml.pre`
only steers text tokenization) and the conversion says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from portable_spec.adapters.llamacpp import build
from portable_spec.core.spec import SpecError

RESULT_PREFIX = "PORTABLE_SPEC_RESULT "
# llama.cpp's defaults keep the KV caches in F16 and may run flash attention, which rounds K/V (and the drafter's
# context) to F16: draft logits then differ from the reference by ~1e-2 on SmolLM2. With F32 caches and no flash
# attention they agree to ~1e-5 (measured): what conformance compares. Speed is measured with the defaults.
EXACT = ("-fa", "off", "-ctk", "f32", "-ctv", "f32", "-ctkd", "f32", "-ctvd", "f32")
CONVERT = """
import sys
root, args = sys.argv[1], sys.argv[2:]
sys.path[:0] = [root, root + "/gguf-py"]
from conversion import base
known = base.TextModel.get_vocab_base_pre
def named(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        print("portable-spec: pre-tokenizer not known to llama.cpp, written as gpt-2 (ids only)", file=sys.stderr)
        return "gpt-2"
base.TextModel.get_vocab_base_pre = named
sys.argv = [root + "/convert_hf_to_gguf.py", *args]
import convert_hf_to_gguf
convert_hf_to_gguf.main()
"""


def convert_target(hf_dir: Path, out: Path, root: Path | None = None) -> Path:
    """`out` = llama.cpp's F32 GGUF of the HF target directory (skipped when `out` exists)."""
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".part")
    command = [sys.executable, "-c", CONVERT, str(build.source_dir(root)), str(hf_dir), "--outtype", "f32"]
    done = subprocess.run([*command, "--outfile", str(partial)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SpecError(f"llama.cpp's convert_hf_to_gguf.py failed on {hf_dir}: {done.stderr.strip()[-600:]}")
    _give_merges(partial)
    partial.replace(out)
    return out


def _give_merges(path: Path) -> None:
    """A target saved without a tokenizer (the suite's tiny random target) converts to a `gpt2` vocabulary with no
    merges, which llama.cpp refuses to load ("cannot find tokenizer merges"); it gets a one-entry merge list (the
    `gguf` writer drops an empty array), the weights copied unchanged. Ids in, ids out: the harness never
    tokenizes."""
    from gguf import GGUFReader, GGUFWriter

    from portable_spec.adapters.llamacpp.gguf_export import copy_field

    reader = GGUFReader(str(path))
    fields = reader.fields
    if fields["tokenizer.ggml.model"].contents() != "gpt2" or "tokenizer.ggml.merges" in fields:
        return
    rewritten = path.with_suffix(".merges")
    writer = GGUFWriter(str(rewritten), fields["general.architecture"].contents())
    for name, field in fields.items():
        if not name.startswith("GGUF.") and name != "general.architecture":
            copy_field(writer, name, field)
    tokens = fields["tokenizer.ggml.tokens"].contents()
    writer.add_array("tokenizer.ggml.merges", [f"{tokens[1]} {tokens[2]}"])
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    rewritten.replace(path)


@dataclass(frozen=True)
class HarnessRun:
    """One request through llama.cpp: tokens, each round's draft, accepted count and per-slot margins, and the
    first round's draft logits."""

    prompt_tokens: int
    tokens: list[int]
    drafts: list[list[int]]
    accepted: list[int]
    margins: list[list[float]]  # per round, per draft slot: best - second-best draft logit (near 0: a near-tie)
    first_draft_logits: list[list[tuple[int, float]]]  # per slot: (token id, logit), best first
    prefill_seconds: float
    decode_seconds: float


def run_harness(
    target_gguf: Path,
    prompt: list[int],
    max_new_tokens: int,
    draft_gguf: Path | None = None,
    spec_type: str | None = None,
    n_max: int | None = None,
    threads: int = 2,
    root: Path | None = None,
    extra: tuple[str, ...] = (),
    exact: bool = False,
) -> HarnessRun:
    """Greedy decode of one prompt; speculative with `draft_gguf` (draft-dflash) or an ngram `spec_type`; `exact`:
    F32 KV caches and no flash attention (EXACT), as conformance runs it."""
    command = [
        str(build.bin_dir(root) / build.HARNESS),
        "-m", str(target_gguf), "-p", ",".join(map(str, prompt)), "-n", str(max_new_tokens),
        "--temp", "0", "-t", str(threads), "-tb", str(threads), "-c", str(len(prompt) + max_new_tokens + 64),
        "--seed", "0", "-lv", "1",
    ]  # fmt: skip
    if draft_gguf is not None:
        command += ["-md", str(draft_gguf), "--spec-type", spec_type or "draft-dflash"]
    elif spec_type is not None:
        command += ["--spec-type", spec_type]
    if n_max is not None:
        command += ["--spec-draft-n-max", str(n_max)]
    done = subprocess.run([*command, *(EXACT if exact else ()), *extra], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"llama.cpp harness exited {done.returncode}: {done.stderr.strip()[-800:]}")
    data = json.loads(lines[-1][len(RESULT_PREFIX) :])
    return HarnessRun(
        prompt_tokens=data["prompt_tokens"],
        tokens=data["tokens"],
        drafts=[round_["draft"] for round_ in data["rounds"]],
        accepted=[round_["accepted"] for round_ in data["rounds"]],
        margins=[round_["margins"] for round_ in data["rounds"]],
        first_draft_logits=[[(int(i), float(v)) for i, v in slot] for slot in data["first_draft_logits"]],
        prefill_seconds=data["prefill_seconds"],
        decode_seconds=data["decode_seconds"],
    )
