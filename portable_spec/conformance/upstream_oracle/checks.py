"""The `upstream/*` conformance rows: a drafter that an upstream package's own code built and saved must draft on
every backend exactly what that package's own forward drafts.

A backend that offers block logits runs the drafter's `portable-spec import`: per draft slot (1..k-1), logits
within TOLERANCE of the upstream's (fp32 both sides; -inf exactly where the upstream's draft vocabulary leaves a
token out) and the same argmax; for z-lab's decode loop, the same tokens and the same accepted length in every
round that ran a whole block on both sides. An engine that only decodes (vLLM, SGLang) is handed the directory the
upstream saved, as its users hand it over, when it reads that layout (else the import): the held-out batch's
tokens, rounds and accepted drafts per position and per round must equal the reference's on the import, whose
logits this same row checks against the upstream's own (so a rule the engine computes otherwise shows here).
"""

from __future__ import annotations

from functools import partial

import torch

from portable_spec.adapters.upstream.importer import import_drafter
from portable_spec.conformance.checks import (
    TOLERANCE,
    Check,
    CheckContext,
    CheckFailed,
    _full_block,
    _heldout_batch,
    _reference_acceptance,
    _same_acceptance,
)
from portable_spec.conformance.upstream_oracle.cases import CASES, CONTEXT, PACKAGES, UpstreamCase
from portable_spec.conformance.upstream_oracle.oracle import (
    OracleAnswer,
    OracleInputs,
    block_ids,
    oracle_inputs,
    run_package,
)
from portable_spec.conformance.workspace import CheckSkipped
from portable_spec.core.backends import DecoderBackend
from portable_spec.core.decode import GenerationConfig


def _inputs(ctx: CheckContext) -> OracleInputs:
    return ctx.workspace.memo("upstream-oracle-inputs", oracle_inputs)


def _answer(ctx: CheckContext, case: UpstreamCase) -> OracleAnswer:
    inputs = _inputs(ctx)
    root = ctx.workspace.root / "upstream-oracle"
    answers = ctx.workspace.memo(("upstream-oracle", case.package), lambda: run_package(case.package, inputs, root))
    return answers[case.name]


def _imported(ctx: CheckContext, case: UpstreamCase, answer: OracleAnswer):
    inputs = _inputs(ctx)
    options = sorted(case.import_options.items())
    label = "-".join([case.package, case.name, *(f"{key}={value}" for key, value in options)])
    out = ctx.workspace.root / "upstream-oracle" / "imported" / label
    return ctx.workspace.memo(
        ("upstream-oracle-import", case.id, tuple(options)),
        lambda: import_drafter(answer.checkpoint, inputs.target, out, **case.import_options).out,
    )


def compare_slots(label: str, actual: torch.Tensor, expected: torch.Tensor) -> None:
    """[k, V] logits of the draft slots: same -inf pattern, finite ones within TOLERANCE * (1 + |upstream|), same
    argmax per slot."""
    if tuple(actual.shape) != tuple(expected.shape):
        raise CheckFailed(f"{label}: logits shape {tuple(actual.shape)}, upstream {tuple(expected.shape)}")
    finite = torch.isfinite(expected)
    if not torch.equal(finite, torch.isfinite(actual)):
        raise CheckFailed(f"{label}: scores a different set of tokens than the upstream (its draft vocabulary)")
    diff = torch.where(finite, (actual - expected).abs(), torch.zeros_like(expected))
    bound = TOLERANCE * (1 + expected.abs().nan_to_num(posinf=0, neginf=0))
    worst = diff.max(dim=-1).values  # per slot
    if bool((diff > bound).any()):
        slots = [i + 1 for i, w in enumerate(worst.tolist()) if w > TOLERANCE]
        raise CheckFailed(
            f"{label}: draft slots {slots} differ from the upstream's own forward: max |logit diff| per slot "
            f"{[round(w, 4) for w in worst.tolist()]} (tolerance {TOLERANCE:g} * (1 + |upstream|))"
        )
    mine, theirs = actual.argmax(-1).tolist(), expected.argmax(-1).tolist()
    if mine != theirs:
        raise CheckFailed(f"{label}: argmax per draft slot {mine}, upstream {theirs}")


def _block_logits(backend, case: UpstreamCase, drafter, inputs) -> torch.Tensor:  # [k - 1, V]: the draft slots
    block = block_ids(case, inputs)
    k = case.block_size
    logits = backend.block_logits(
        inputs.target,
        drafter,
        inputs.features,
        torch.arange(CONTEXT)[None],
        torch.ones(1, CONTEXT, dtype=torch.bool),
        block[:, None],
        (CONTEXT + torch.arange(k))[None, None],
    )
    return logits[0, 0, 1:].float()


def _block_check(ctx: CheckContext, case: UpstreamCase) -> None:
    if case.kind not in ctx.backend.kinds_supported:
        raise CheckSkipped(
            f"{ctx.backend_name} supports drafter kinds {list(ctx.backend.kinds_supported)}, not {case.kind}"
        )
    answer = _answer(ctx, case)
    drafter = _imported(ctx, case, answer)
    inputs = _inputs(ctx)
    if case.dspark or case.domino:
        _sequential_check(ctx, case, answer, drafter, inputs)
        return
    expected = answer.logits[0, 1:].float()
    try:
        logits = _block_logits(ctx.backend, case, drafter, inputs)
    except NotImplementedError:  # an engine that only decodes: the reference must draft upstream's function ...
        compare_slots(f"{case.id} (reference)", _block_logits(ctx.workspace.reference, case, drafter, inputs), expected)
        _acceptance_check(ctx, case, answer, drafter)  # ... and the engine must accept what the reference does
    else:
        compare_slots(case.id, logits, expected)
    if answer.drafts is not None:
        _drafts_check(ctx, case, answer, drafter, inputs)
    if case.decode:
        _decode_check(ctx, case, answer, drafter, inputs)


def _loaded(ctx: CheckContext, drafter, inputs):
    """The import as the reference runs it, with its context KV of the oracle inputs: (drafter, context, positions)."""
    from portable_spec.core.target import TargetModel

    target = ctx.workspace.memo(("upstream-oracle-target", str(inputs.target)), lambda: TargetModel.load(inputs.target))
    loaded = target.load_drafter(drafter)
    positions = torch.arange(CONTEXT)[None]
    return loaded, loaded.context_kv(inputs.features.to(loaded.fc.weight.dtype), positions), positions


def _drafts_check(ctx: CheckContext, case: UpstreamCase, answer: OracleAnswer, drafter, inputs) -> None:
    """A DFlash2's, DSpark's or Domino's drafts: what the backend's own proposer (the ONNX graphs run through the
    step graph, the torch drafter for the reference) proposes after the same context and anchor, its head's greedy
    chain, == what the upstream's own code picked."""
    if not isinstance(ctx.backend, DecoderBackend):
        return  # an engine that only decodes: what it accepts is compared instead (_acceptance_check)
    proposer = ctx.backend.decoder(inputs.target, drafter).proposer
    positions = torch.arange(CONTEXT)[None]
    state = proposer.begin(inputs.features.float(), positions)
    valid = torch.ones(1, CONTEXT, dtype=torch.bool)
    num_drafts = proposer.config.max_draft_tokens
    drafts = proposer.propose(state, valid, torch.tensor([inputs.anchor]), torch.tensor([CONTEXT]), num_drafts)
    if drafts.tolist() != answer.drafts.tolist():
        raise CheckFailed(f"{case.id}: drafts {drafts.tolist()}, {case.package}'s own {answer.drafts.tolist()}")


def _sequential_check(ctx: CheckContext, case: UpstreamCase, answer: OracleAnswer, drafter, inputs) -> None:
    """A DSpark or Domino: the import's teacher-forced draft logits (the Markov bias or the GRU correction given the
    prompt's own tokens) per draft slot, and a DSpark's confidence logits, against the upstream's own heads, on the
    reference drafter (training's function: no backend serves teacher forcing); then the backend's greedy chain
    against theirs."""
    loaded, context, positions = _loaded(ctx, drafter, inputs)
    k = case.block_size
    block = torch.tensor([[[inputs.anchor] + [loaded.config.mask_token_id] * (k - 1)]])
    true_tokens = inputs.true_tokens(k)[None]  # [1, 1, k]
    valid = torch.ones(1, CONTEXT, dtype=torch.bool)
    slots = loaded.draft_slots(loaded.config.max_draft_tokens)
    with torch.no_grad():
        hidden = loaded.block_hidden(block, (CONTEXT + torch.arange(k))[None, None], context, valid, positions)
        logits = loaded.to_full_vocab(loaded.teacher_forced_logits(hidden, true_tokens))[0, 0]
        if answer.confidence is not None:
            previous = true_tokens if loaded.config.drafts_from_anchor else true_tokens[..., :-1]  # each slot's
            confidence = loaded.confidence_logits(hidden[..., slots, :], previous)[0, 0]
    compare_slots(case.id, logits.float(), answer.logits[0, slots].float())
    if answer.confidence is not None:
        expected = answer.confidence[0, slots].float()
        worst = float((confidence.float() - expected).abs().max())
        if worst > TOLERANCE * (1 + float(expected.abs().max())):
            raise CheckFailed(
                f"{case.id}: confidence logits differ from speculators' ConfidenceHead by up to {worst:.4g}"
            )
    _drafts_check(ctx, case, answer, drafter, inputs)
    if not isinstance(ctx.backend, DecoderBackend):
        _acceptance_check(ctx, case, answer, drafter)


def _acceptance_check(ctx: CheckContext, case: UpstreamCase, answer: OracleAnswer, imported) -> None:
    """The held-out batch decoded greedily with the whole block: the backend's acceptance == the reference's on
    the import. The backend is handed the upstream's own directory when it reads that layout."""
    target, _, prompts = _heldout_batch("parallel")
    config = _full_block(GenerationConfig(max_new_tokens=32), imported)
    layout = "zlab" if case.package == "dflash" else case.package
    handed = answer.checkpoint if ctx.backend.reads_layout(layout) else imported
    expected = _reference_acceptance(ctx, target, imported, prompts, config)
    _same_acceptance(case.id, ctx.backend.acceptance(target, handed, prompts, config), expected)


def _decode_check(ctx: CheckContext, case: UpstreamCase, answer: OracleAnswer, drafter, inputs) -> None:
    """z-lab's dflash_generate vs the backend's decode loop on the same drafter and prompt (greedy): the same
    tokens, and (where the backend reports them) the same tokens emitted per round for every round that verified a
    whole block on both sides."""
    upstream = answer.info["decode"]
    config = GenerationConfig(max_new_tokens=upstream["max_new_tokens"], num_draft_tokens=case.block_size - 1)
    acceptance = ctx.backend.acceptance(inputs.target, drafter, [inputs.prompt], config)
    tokens = acceptance.tokens[0]
    if tokens != upstream["tokens"][: len(tokens)] or len(tokens) != len(upstream["tokens"]):
        raise CheckFailed(f"{case.id}: tokens {tokens}, z-lab's dflash_generate {upstream['tokens']}")
    if acceptance.accepted_by_request is None:  # an engine that only counts: its acceptance row covers the rest
        return
    emitted = [accepted + 1 for accepted in acceptance.accepted_by_request[0]]
    whole, produced = 0, 1  # rounds whose block fit inside max_new_tokens (the first token is the prefill's)
    for count in upstream["emitted_per_round"]:
        if produced + case.block_size > upstream["max_new_tokens"]:
            break
        whole, produced = whole + 1, produced + count
    if whole < 2 or emitted[:whole] != upstream["emitted_per_round"][:whole]:
        raise CheckFailed(
            f"{case.id}: tokens emitted per round {emitted}, z-lab's dflash_generate "
            f"{upstream['emitted_per_round']} (compared over the first {whole} whole-block rounds)"
        )


def upstream_checks() -> list[Check]:
    checks = []
    for case in CASES:
        version = PACKAGES[case.package][0]
        what = f"{case.package} {version}'s own drafter class and save ({case.about or case.name}; block {case.block_size})"
        decode = "; z-lab's dflash_generate: same tokens and tokens per round" if case.decode else ""
        decode += "; the same selector drafts as its propose" if case.dflash2 else ""
        decode += "; Markov-biased logits and confidence teacher-forced, the same greedy chain" if case.dspark else ""
        decode += "; GRU-corrected logits teacher-forced, the same drafts as its own sampler" if case.domino else ""
        checks.append(
            Check(
                case.id,
                f"{what}, imported: every draft slot's logits within {TOLERANCE:g} of the upstream's own forward, "
                f"same argmax{decode}",
                partial(_block_check, case=case),
                "acceptance" if case.decode else "block_logits",
                "upstream",
            )
        )
    return checks
