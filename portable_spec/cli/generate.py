"""portable-spec generate: decode a text prompt with a target and optional drafter (reference backend)."""

from __future__ import annotations

import argparse

from portable_spec.core import fixtures
from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
from portable_spec.core.spec import SpecError, read_config
from portable_spec.core.target import TargetModel


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt")
    parser.add_argument("--target", default=str(fixtures.target_dir()))
    parser.add_argument("--drafter", help="Drafter checkpoint; omit for autoregressive decoding.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-draft-tokens", type=int, default=7)
    parser.add_argument(
        "--draft-confidence",
        type=float,
        default=0.0,
        help="Verify only the draft prefix the drafter is this confident in (0: all drafts).",
    )
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    config = GenerationConfig(  # every option checked before a model loads
        max_new_tokens=args.max_new_tokens,
        num_draft_tokens=args.num_draft_tokens,
        seed=args.seed,
        draft_confidence=args.draft_confidence,
        sampling={"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p},
    )
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise SpecError(
            "prompt: not valid UTF-8 text (the shell passed undecodable bytes); pass the prompt as UTF-8"
        ) from None
    if args.drafter:
        read_config(args.drafter).check_num_draft_tokens(args.num_draft_tokens)
    target = TargetModel.load(args.target, tokenizer=True)
    tokenizer = target.tokenizer
    drafter = target.load_drafter(args.drafter) if args.drafter else None
    config = config.model_copy(update={"stop_token_ids": (tokenizer.eos_token_id,)})
    prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise SpecError("prompt='': the tokenizer gives no tokens for it; pass a non-empty prompt")
    out = SpeculativeDecoder(target, drafter).generate([prompt], config)
    print(args.prompt + tokenizer.decode(out.tokens[0]))
    print(f"[tau={out.stats.acceptance_length:.2f}, rounds={out.stats.rounds}, {out.stats.seconds:.2f}s]")
    return 0
