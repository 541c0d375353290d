"""Held-out acceptance while training, without running the decode loop.

On greedy self-distilled data the reply *is* what greedy decoding emits, so a round needs no target pass: the
drafter drafts after the anchor from the target's features of every earlier position (cached), the accepted
length is how many drafts equal the reply's next tokens, and the next anchor is the token after them. One
teacher-forced drafter pass over every reply position gives the drafts of every possible anchor; walking the
rounds over them gives the decode loop's accepted lengths round by round (tests/test_heldout.py checks that on the
fixture against SpeculativeDecoder). Drafts past the end of a reply count as rejected (the target's continuation
there is unknown): at most one round per sequence is cut short.

This is exact for every kind: a causal block (depth_causal) drafts the same tokens whether it runs n + 1 slots or
all k; a bidirectional one (parallel) always runs all k when decoding too; and the autoregressive kind, fed the
true tokens, drafts what it would have drafted itself up to its first mismatch, which is where acceptance stops.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from portable_spec.core.checkpoint import write_drafter_files
from portable_spec.core.decode import acceptance_by_position
from portable_spec.core.drafter import Drafter, load_drafter
from portable_spec.core.outputs import check_output_dir, results_json, write_dir_atomically
from portable_spec.core.spec import SpecError
from portable_spec.training.features import FeatureDataset
from portable_spec.training.loss import teacher_forced_blocks

ANCHORS_PER_PASS = 64  # teacher-forced blocks per drafter pass: bounds the dense [A*k, T + A*k] attention mask


@torch.no_grad()
def greedy_drafts_at(drafter: Drafter, features: torch.Tensor, tokens: torch.Tensor, first: int) -> torch.Tensor:
    """Greedy drafts [n - first, max_draft_tokens] (target ids) after every anchor position first .. n - 1 of one
    sequence: tokens [n], features [n, F] (the target's, position by position)."""
    config, n = drafter.config, len(tokens)
    drafts = config.max_draft_tokens
    padded = torch.cat((tokens, tokens.new_zeros(config.label_span)))[None]  # slots past the end: never matched
    ids = drafter.draft_token_ids()  # draft index -> target id, None for the full vocabulary
    rows = []
    for start in range(first, n, ANCHORS_PER_PASS):
        anchors = torch.arange(start, min(start + ANCHORS_PER_PASS, n), device=tokens.device)[None]
        hidden, _ = teacher_forced_blocks(drafter, features[None], padded, anchors)  # [1, A, k, H]
        anchor_tokens = padded[0, anchors[0]]
        if drafter.behaviour.sequential_head:  # dflash2, dspark, domino: the head's greedy chain after each anchor
            rows.append(drafter.head_drafts(hidden[0], anchor_tokens, drafts)[0])
            continue
        logits = drafter.scored_logits(hidden[0, :, drafter.draft_slots(drafts)])  # [A, n, V_draft]
        draft = logits.argmax(dim=-1)
        rows.append(draft if ids is None else ids.to(draft.device)[draft])
    return torch.cat(rows)


def simulate_rounds(reply: list[int], drafts: torch.Tensor, num_drafts: int, max_new_tokens: int | None = None):
    """Accepted drafts per round of greedy decoding whose output is `reply` (the prefill emits reply[0]);
    drafts [len(reply), >= num_drafts] are the drafts after each reply token. Generation ends after
    min(len(reply), max_new_tokens) tokens, as the decode loop ends at max_new_tokens or the reply's EOS."""
    limit = len(reply) if max_new_tokens is None else min(len(reply), max_new_tokens)
    proposals = drafts[:, :num_drafts].tolist()
    accepted_per_round, anchor = [], 0  # anchor: index in reply of the last emitted token
    while anchor + 1 < limit:
        accepted = 0
        for draft, true in zip(proposals[anchor], reply[anchor + 1 : anchor + 1 + num_drafts]):
            if draft != true:
                break
            accepted += 1
        accepted_per_round.append(accepted)
        anchor += accepted + 1
    return accepted_per_round


@dataclass(frozen=True)
class HeldoutAcceptance:
    """Held-out greedy sequences with their cached target features; calling it measures a drafter on them."""

    dataset: FeatureDataset
    blocks: tuple[int, ...] = (4, 16)
    autocast: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    @staticmethod
    def load(
        data_dir: Path,
        layer_ids: list[int],
        fingerprint: str,
        device: torch.device | str,
        blocks: tuple[int, ...] = (4, 16),
        autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
    ) -> "HeldoutAcceptance":
        """The held-out sequences of data_dir (features cached for these layers of this target) on `device`."""
        dataset = FeatureDataset.load(data_dir, layer_ids, fingerprint).to(device)
        return HeldoutAcceptance(dataset, tuple(blocks), autocast or contextlib.nullcontext)

    def __call__(self, drafter: Drafter) -> dict:
        """{"tau": {block: tau}, "acceptance_by_position": {block: [...]}, "sequences", "rounds": {block: n}}."""
        was_training = drafter.training
        drafter.eval()
        accepted: dict[int, list[int]] = {block: [] for block in self.blocks}
        sequences = self.dataset.sequences
        try:
            with self.autocast():
                for index in range(len(sequences)):
                    tokens = sequences.sequence(index).to(self.dataset.features.device)
                    start, prompt_len = int(sequences.offsets[index]), int(sequences.prompt_lens[index])
                    if len(tokens) <= prompt_len:
                        continue
                    features = self.dataset.features[start : start + len(tokens)].float()
                    drafts = greedy_drafts_at(drafter, features, tokens, prompt_len)
                    reply = tokens[prompt_len:].tolist()
                    for block in self.blocks:
                        accepted[block] += simulate_rounds(reply, drafts, block - 1)
        finally:
            drafter.train(was_training)
        return {
            "tau": {block: _mean_emitted(rounds) for block, rounds in accepted.items()},
            "acceptance_by_position": {
                block: [round(p, 4) for p in acceptance_by_position([a + 1 for a in rounds], block - 1)]
                for block, rounds in accepted.items()
            },
            "rounds": {block: len(rounds) for block, rounds in accepted.items()},
            "sequences": len(sequences),
        }


def _mean_emitted(accepted: list[int]) -> float:
    return round(sum(a + 1 for a in accepted) / len(accepted), 4) if accepted else float("nan")


@dataclass
class HeldoutTracker:
    """Held-out tau every `every` seconds of training: logged as JSON lines beside the loss, the best drafter (by
    tau at the first of `evaluate.blocks`) kept in best_dir, where a resumed run finds it; `plateau` evaluations
    without a gain end the run early."""

    evaluate: HeldoutAcceptance
    every: float
    log_file: Path
    best_dir: Path
    plateau: int | None = None
    eval_prompts: int | None = None  # --heldout-eval-prompts, logged so that a resumed run can be held to it
    last_seconds: float = field(default=-float("inf"))
    last_step: int | None = None
    since_best: int = 0

    @property
    def metric_block(self) -> int:
        return self.evaluate.blocks[0]

    def best_tau(self) -> float:
        record = self.best_dir / "heldout.json"
        return json.loads(record.read_text())["tau"] if record.is_file() else -float("inf")

    def reset(self) -> None:
        """A fresh run (no training state): forget a best drafter an earlier run kept (ours by its marker)."""
        if self.best_dir.is_dir():
            check_output_dir(self.best_dir, "best-drafter")  # refuses what is not a best drafter of ours
            shutil.rmtree(self.best_dir)

    def due(self, seconds: float) -> bool:
        return seconds - self.last_seconds >= self.every

    def record(self, drafter: Drafter, step: int, seconds: float) -> bool:
        """Evaluate, log, keep the drafter if it is the best so far; True when the run should stop (plateau)."""
        began = time.perf_counter()
        report = self.evaluate(drafter)
        tau = report["tau"][self.metric_block]
        best = tau > self.best_tau()
        if best:

            def write(tmp: Path) -> None:
                write_drafter_files(tmp, drafter.config, drafter.state_dict())
                (tmp / "heldout.json").write_text(json.dumps({"step": step, "tau": tau}) + "\n")

            write_dir_atomically(self.best_dir, write, kind="best-drafter")
            self.since_best = 0
        else:
            self.since_best += 1
        entry = {"step": step, "seconds": round(seconds, 1), **report, "best": best, "eval_prompts": self.eval_prompts}
        entry["eval_seconds"] = round(time.perf_counter() - began, 2)
        with open(self.log_file, "a") as handle:
            handle.write(results_json(entry) + "\n")
        self.last_seconds, self.last_step = seconds, step
        return self.plateau is not None and self.since_best >= self.plateau

    def load_best(self, drafter: Drafter) -> dict | None:
        """Put the best drafter's weights into `drafter`; its record ({"step", "tau"}), or None if none was kept."""
        record = self.best_dir / "heldout.json"
        if not record.is_file():
            return None
        best = load_drafter(self.best_dir)
        drafter.load_state_dict({name: t.to(drafter.fc.weight.device) for name, t in best.state_dict().items()})
        return json.loads(record.read_text())


def summarize_heldout_log(log: Path) -> dict:
    """A held-out log in brief: the best tau (what the written drafter reaches), the step it came at, and the tau at
    the first evaluation (where training started: the --init-from drafter when warm-started), at the block that
    picks the best; {} when there is no log."""
    if not log.is_file():
        return {}
    entries = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    starts = [i for i, entry in enumerate(entries) if entry["step"] == 0]  # a fresh run evaluates before step 1
    entries = entries[starts[-1] :] if starts else entries  # this run's, not an earlier one's in the same work dir
    if not entries:
        return {}
    block = next(iter(entries[0]["tau"]))
    entries = [entry for entry in entries if block in entry["tau"]]
    best = max(entries, key=lambda e: e["tau"][block])
    return {
        "heldout_block": int(block),
        "heldout_tau": best["tau"][block],
        "heldout_tau_best_step": best["step"],
        "heldout_tau_at_start": entries[0]["tau"][block],
        "heldout_sequences": entries[0]["sequences"],
    }


def check_resumed_evaluation(log: Path, state_dir: Path, blocks: tuple[int, ...], eval_prompts: int) -> None:
    """A resumed run (its training state exists) must measure held-out tau as the run it resumes did: the best
    drafter is picked by tau at the first block, and tau at another block, or on other prompts, is another number.
    Checked before any model loads, from the run's held-out log."""
    if not (state_dir.is_dir() and log.is_file()):
        return
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    if not lines:
        return
    try:
        last = json.loads(lines[-1])
        saved_blocks = tuple(int(block) for block in last["tau"])
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise SpecError(f"{log}: not a held-out log portable-spec wrote ({type(error).__name__}: {error})") from None
    flags = []
    if saved_blocks != tuple(blocks):
        flags.append(f"--eval-blocks {' '.join(map(str, saved_blocks))} (asked {' '.join(map(str, blocks))})")
    saved_prompts = last.get("eval_prompts")
    if saved_prompts is not None and saved_prompts != eval_prompts:
        flags.append(f"--heldout-eval-prompts {saved_prompts} (asked {eval_prompts})")
    if flags:
        raise SpecError(
            f"--work-dir: the run in {state_dir} measured held-out tau with {' and '.join(flags)}, and resuming picks "
            "its best drafter by comparing with those figures; pass the saved settings, or another --work-dir"
        )


def improved_on_start(summary: dict) -> bool:
    """Whether training beat where it started on its held-out sequences (summarize_heldout_log's figures): what a
    warm-started drafter must show before it replaces the one it started from."""
    return summary.get("heldout_tau", 0.0) > summary.get("heldout_tau_at_start", float("inf"))
