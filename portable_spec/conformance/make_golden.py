"""Write the golden verification vectors from the reference verifier. Run once; the files are checked in.

    python -m portable_spec.conformance.make_golden            # writes golden/*.json; refuses to change existing files
    python -m portable_spec.conformance.make_golden --check    # only reports which files would differ

Logits are multiples of 1/32 and draft probabilities multiples of 1/256, so the stored values are exact in
float32 and short to read. Each case asserts the property its name promises before it is written.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np
import torch

from portable_spec.conformance.golden import FORMAT_VERSION, GOLDEN_DIR, NoiseKey, dumps, noise_sha256, regenerate_noise
from portable_spec.core.sampling import SamplingBatch, SamplingParams, target_probs
from portable_spec.core.verify import verify

VOCAB = 16


def _logits(g: torch.Generator, batch: int, chain: int, vocab: int = VOCAB) -> torch.Tensor:
    """[B, chain, V] multiples of 1/32 in [-3, 3] with a unique maximum per slot (ties are their own case)."""
    logits = torch.randint(-96, 97, (batch, chain, vocab), generator=g).float() / 32
    top = logits.argmax(dim=-1, keepdim=True)
    return logits.scatter_add(-1, top, torch.full_like(top, 0.5, dtype=torch.float32))


def _greedy(batch: int) -> list[SamplingParams]:
    return [SamplingParams()] * batch


def _case(
    name,
    description,
    tags,
    logits,
    drafts,
    sampling,
    seed,
    request_ids,
    first_positions,
    draft_probs=None,
    num_drafts=None,
) -> dict:
    batch, chain, vocab = logits.shape
    drafts = torch.as_tensor(drafts, dtype=torch.int64).reshape(batch, chain - 1)
    key = NoiseKey(seed=seed, request_ids=request_ids, first_positions=first_positions, sha256="0" * 64)
    noise = regenerate_noise(key, chain - 1, vocab)
    num = None if num_drafts is None else torch.tensor(num_drafts)
    q = None if draft_probs is None else torch.as_tensor(draft_probs, dtype=torch.float32)
    result = verify(logits, drafts, SamplingBatch.from_params(sampling), noise, q, num)
    probs = target_probs(logits, SamplingBatch.from_params(sampling)).numpy()
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "description": description,
        "tags": tags,
        "written_with": {"torch": torch.__version__, "python": platform.python_version()},
        "inputs": {
            "target_logits": logits.tolist(),
            "draft_tokens": drafts.tolist(),
            "draft_probs": None if q is None else q.tolist(),
            "num_drafts": num_drafts,
            "sampling": [s.model_dump() for s in sampling],
            "noise": {**key.model_dump(), "sha256": noise_sha256(noise)},
        },
        "expected": {
            "accepted_len": result.accepted_len.tolist(),
            "next_token": result.next_token.tolist(),
            "output_tokens": result.output_tokens.tolist(),
            "target_probs": [[[float(str(v)) for v in slot] for slot in row] for row in probs.astype(np.float32)],
        },
    }


def build_cases() -> list[dict]:
    g = torch.Generator().manual_seed(2026)
    cases = []

    logits = _logits(g, 2, 5)
    cases.append(
        _case(
            "greedy_all_accept",
            "Every draft is the argmax: all accepted, bonus token from the last slot.",
            ["greedy", "all_accept", "batch"],
            logits,
            logits[:, :4].argmax(-1),
            _greedy(2),
            0,
            [0, 1],
            [10, 3],
        )
    )

    logits = _logits(g, 2, 5)
    drafts = logits[:, :4].argmax(-1)
    drafts[:, 0] = (drafts[:, 0] + 1) % VOCAB
    cases.append(
        _case(
            "greedy_first_reject",
            "First draft differs from the argmax, later ones match: nothing accepted.",
            ["greedy", "first_reject", "batch"],
            logits,
            drafts,
            _greedy(2),
            0,
            [0, 1],
            [7, 7],
        )
    )

    logits = _logits(g, 4, 6)
    drafts = logits[:, :5].argmax(-1)
    drafts[0, 2] = (drafts[0, 2] + 3) % VOCAB
    cases.append(
        _case(
            "greedy_ragged_batch",
            "num_drafts [5, 3, 0, 2]; padding slots match the argmax and must be ignored.",
            ["greedy", "ragged", "batch", "all_accept"],
            logits,
            drafts,
            _greedy(4),
            0,
            [0, 1, 2, 3],
            [4, 9, 2, 30],
            num_drafts=[5, 3, 0, 2],
        )
    )

    logits = _logits(g, 3, 3)
    logits[0, 0, 3] = logits[0, 0, 9] = 4.0  # tie: argmax is the first index (3)
    logits[1, 0, 3] = logits[1, 0, 9] = 4.0
    logits[1, 1, 0] = logits[1, 1, 15] = 4.0
    logits[2, :2] = 1.0  # uniform slots: argmax 0
    drafts = torch.tensor([[9, 0], [3, 15], [0, 0]])
    cases.append(
        _case(
            "greedy_ties",
            "Tied maxima: greedy takes the first index; the later tied index is rejected.",
            ["greedy", "ties", "batch"],
            logits,
            drafts,
            _greedy(3),
            0,
            [0, 1, 2],
            [5, 5, 5],
        )
    )

    logits = _logits(g, 4, 5)
    drafts = (logits[:, :4] + torch.randn(4, 4, VOCAB, generator=g)).argmax(-1)
    cases.append(
        _case(
            "temperature",
            "T=0.7, one-hot drafts near the target's choice.",
            ["temperature", "batch"],
            logits,
            drafts,
            [SamplingParams(temperature=0.7)] * 4,
            11,
            [0, 5, 2, 9],
            [17, 3, 64, 30],
        )
    )

    logits = _logits(g, 2, 5)
    drafts = torch.randint(0, VOCAB, (2, 4), generator=g)
    logits[:, :4].scatter_(-1, drafts[..., None], 12.0)  # p(draft) ~ 1
    cases.append(
        _case(
            "temperature_all_accept",
            "T=1, drafts with p ~ 1: all accepted; seed uses both 32-bit halves.",
            ["temperature", "all_accept", "batch"],
            logits,
            drafts,
            [SamplingParams(temperature=1.0)] * 2,
            2**40 + 3,
            [3, 4],
            [100, 200],
        )
    )

    logits = _logits(g, 2, 4)
    drafts = logits[:, :3].argmax(-1)
    drafts[:, 0] = logits[:, 0].argmin(-1)  # outside the top 4: p = 0, rejected for any noise
    cases.append(
        _case(
            "temperature_first_reject",
            "T=1, top-k 4, first draft outside the top-k: rejected.",
            ["temperature", "top_k", "first_reject", "batch"],
            logits,
            drafts,
            [SamplingParams(temperature=1.0, top_k=4)] * 2,
            12,
            [0, 1],
            [8, 40],
        )
    )

    logits = _logits(g, 3, 5)
    order = logits[:, :4].argsort(-1, descending=True)
    drafts = torch.stack((order[0, :, 0], order[1, :, 2], order[2, :, 5]))  # top-1, top-3, outside top-3
    cases.append(
        _case(
            "top_k",
            "T=0.9, top-k 3; drafts ranked 1st, 3rd and 6th.",
            ["temperature", "top_k", "batch"],
            logits,
            drafts,
            [SamplingParams(temperature=0.9, top_k=3)] * 3,
            13,
            [0, 1, 2],
            [6, 12, 18],
        )
    )

    logits = _logits(g, 3, 5)
    order = logits[:, :4].argsort(-1, descending=True)
    drafts = torch.stack((order[0, :, 0], order[1, :, 0], order[2, :, 3]))
    cases.append(
        _case(
            "top_p",
            "T=0.5, top-p 0.6; drafts ranked 1st, 1st and 4th.",
            ["temperature", "top_p", "batch"],
            logits,
            drafts,
            [SamplingParams(temperature=0.5, top_p=0.6)] * 3,
            14,
            [7, 8, 9],
            [1, 2, 3],
        )
    )

    logits = torch.full((3, 3, VOCAB), -1.0)
    logits[:, :, 0], logits[:, :, 1] = 3.0, 2.5
    logits[:, :, 4] = logits[:, :, 11] = 2.0  # tie at the top-k boundary: the stable sort keeps token 4
    logits[2, :, 2] = 2.5  # row 2: top-p boundary inside a tie of 1 and 2
    drafts = torch.tensor([[11, 4], [4, 11], [2, 1]])
    sampling = [
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_k=3),
        SamplingParams(temperature=1.0, top_p=0.5),
    ]
    cases.append(
        _case(
            "top_k_top_p_ties",
            "Ties at the top-k / top-p boundary: the lower token id is kept.",
            ["temperature", "top_k", "top_p", "ties", "batch"],
            logits,
            drafts,
            sampling,
            15,
            [0, 1, 2],
            [9, 9, 9],
        )
    )

    logits = _logits(g, 4, 5)
    drafts = logits[:, :4].argmax(-1)
    sampling = [
        SamplingParams(),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.5, top_k=2),
        SamplingParams(temperature=1.3, top_k=5, top_p=0.5),
    ]
    cases.append(
        _case(
            "mixed_params_batch",
            "One batch, four sampling settings (greedy, T, top-k, top-k + top-p).",
            ["mixed_params", "greedy", "temperature", "top_k", "top_p", "batch"],
            logits,
            drafts,
            sampling,
            16,
            [0, 1, 2, 3],
            [20, 21, 22, 23],
        )
    )

    logits = _logits(g, 3, 4)
    q = torch.randint(1, 9, (3, 3, VOCAB), generator=g).float()
    q = torch.floor(q / q.sum(-1, keepdim=True) * 256) / 256
    q[..., 0] += 1 - q.sum(-1)  # exactly normalised, multiples of 1/256
    drafts = torch.multinomial(q.reshape(-1, VOCAB), 1, generator=g).reshape(3, 3)
    cases.append(
        _case(
            "draft_probs_ragged",
            "Dense draft distribution q, T=1, num_drafts [3, 1, 2].",
            ["draft_probs", "temperature", "ragged", "batch"],
            logits,
            drafts,
            [SamplingParams(temperature=1.0)] * 3,
            17,
            [0, 1, 2],
            [50, 60, 70],
            draft_probs=q,
            num_drafts=[3, 1, 2],
        )
    )

    logits = _logits(g, 3, 1)
    sampling = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.6, top_p=0.9)]
    cases.append(
        _case(
            "no_drafts",
            "n = 0 (prefill / non-speculative step): sample the next token from p.",
            ["no_drafts", "greedy", "temperature", "top_p", "batch"],
            logits,
            torch.zeros(3, 0),
            sampling,
            18,
            [0, 1, 2],
            [48, 48, 48],
        )
    )

    logits = _logits(g, 5, 6)
    drafts = logits[:, :5].argmax(-1)
    cases.append(
        _case(
            "ragged_sampled_batch",
            "num_drafts [5, 3, 0, 1, 5], T=0.9, top-k 8, top-p 0.95.",
            ["ragged", "temperature", "top_k", "top_p", "batch"],
            logits,
            drafts,
            [SamplingParams(temperature=0.9, top_k=8, top_p=0.95)] * 5,
            19,
            [10, 11, 12, 13, 14],
            [5, 9, 13, 17, 21],
            num_drafts=[5, 3, 0, 1, 5],
        )
    )

    logits = _logits(g, 2, 3)
    q = torch.randint(1, 9, (2, 2, VOCAB), generator=g).float()
    order = logits[:, 0].argsort(-1, descending=True)
    drafts = torch.stack((torch.stack((order[0, 5], order[0, 0])), torch.stack((order[1, 0], order[1, 0]))))
    q[0, 0, drafts[0, 0]] = 0.0  # row 0: outside top-k 2 (p = 0) and q = 0: u * q <= p holds, must still reject
    q[1, 0, drafts[1, 0]] = 0.0  # row 1: the target's argmax (p > 0) but q = 0: a draft q could not propose
    q = torch.floor(q / q.sum(-1, keepdim=True) * 256) / 256
    # the rounding remainder goes to a token no draft uses, so the zeros stay zero
    spare = next(t for t in range(VOCAB) if t not in drafts.flatten().tolist())
    q[..., spare] += 1 - q.sum(-1)
    cases.append(
        _case(
            "draft_prob_zero",
            "A draft whose draft probability is 0 is rejected (p = 0 and p > 0 rows).",
            ["draft_probs", "temperature", "top_k", "first_reject", "batch"],
            logits,
            drafts,
            [SamplingParams(temperature=1.0, top_k=2), SamplingParams(temperature=1.0)],
            20,
            [0, 1],
            [30, 31],
            draft_probs=q,
        )
    )
    _assert_promises(cases)
    return cases


def _assert_promises(cases: list[dict]) -> None:
    """Each case shows what its name says, or the generator must change (never the verifier)."""
    by_name = {c["name"]: c["expected"] for c in cases}
    assert by_name["greedy_all_accept"]["accepted_len"] == [4, 4]
    assert by_name["greedy_first_reject"]["accepted_len"] == [0, 0]
    assert by_name["greedy_ragged_batch"]["accepted_len"] == [2, 3, 0, 2]
    assert by_name["greedy_ties"]["accepted_len"] == [0, 1, 2] and by_name["greedy_ties"]["next_token"][:2] == [3, 0]
    assert by_name["temperature_all_accept"]["accepted_len"] == [4, 4]
    assert by_name["temperature_first_reject"]["accepted_len"] == [0, 0]
    assert by_name["draft_prob_zero"]["accepted_len"] == [0, 0]
    assert by_name["top_k_top_p_ties"]["accepted_len"][0] == 0
    accepted = by_name["ragged_sampled_batch"]["accepted_len"]
    assert accepted[2] == 0 and 0 < max(accepted)
    for name in ("temperature", "top_k", "top_p", "draft_probs_ragged", "mixed_params_batch"):
        assert len(set(by_name[name]["accepted_len"])) > 1, f"{name}: every row accepted the same count"


def _without_versions(case: dict) -> dict:
    return {key: value for key, value in case.items() if key != "written_with"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=GOLDEN_DIR)
    parser.add_argument("--check", action="store_true", help="Report differences, write nothing.")
    args = parser.parse_args(argv)
    differ = []
    for case in build_cases():
        path, text = args.out / f"{case['name']}.json", dumps(case) + "\n"
        if path.exists() and _without_versions(json.loads(path.read_text())) != _without_versions(case):
            differ.append(path.name)
        elif not path.exists() and not args.check:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if differ:
        print(f"differ from the checked-in files (left unchanged; golden files are written once): {differ}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
