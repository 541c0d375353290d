"""Checks every engine adapter makes of a portable checkpoint, one implementation with the engine's name in the
message: is it ours, can the engine's DFlash proposer serve it, does its vocabulary fit."""

from __future__ import annotations

import json

from portable_spec.core.spec import DrafterConfig, SpecError, is_drafter_config, parse_config
from portable_spec.core.variants import behaviour_of, dflash_shaped_kinds

ENGINE_KINDS = dflash_shaped_kinds()  # what an engine's DFlash proposer runs: one DFlash-shaped pass per round


def portable_config_of(config_json: bytes | str | None, source: str) -> DrafterConfig | None:
    """The drafter config if `config_json` is a portable-spec checkpoint's; None for any other drafter (the engine
    then runs it untouched). A portable config that is invalid raises SpecError."""
    if config_json is None:
        return None
    try:
        data = json.loads(config_json)
    except json.JSONDecodeError:
        return None
    if not is_drafter_config(data):
        return None
    return parse_config(data, source)


def check_servable(
    config: DrafterConfig,
    source: str,
    engine: str,
    proposer: str,
    *,
    reduced_vocabulary: bool = False,
    own_embeddings: bool = False,
    native_kinds: tuple[str, ...] = (),
) -> None:
    """Refuse what `engine`'s DFlash `proposer` cannot run: multi-pass kinds; kinds beyond DFlash's shape unless the
    engine's own classes serve them (`native_kinds`); unless the adapter fills the engine's draft-vocabulary LM head
    (`reduced_vocabulary`), reduced draft vocabularies; unless the engine loads a drafter's own embedding and head
    (`own_embeddings`), drafters that carry them."""
    if not behaviour_of(config.kind).single_pass:
        raise SpecError(
            f"{source}: variant {config.kind!r} has no {engine} route: {engine}'s {proposer} runs one drafter pass "
            f"per round over [anchor, MASK...], and an {config.kind} drafter needs one pass per draft token fed its "
            f"own drafts. fix: serve a {' or '.join(ENGINE_KINDS)} drafter with {engine}, or run this one with "
            "`portable-spec generate` (reference and ONNX backends)"
        )
    if not behaviour_of(config.kind).dflash_shaped and config.kind not in native_kinds:
        raise SpecError(
            f"{source}: variant {config.kind!r} has no {engine} route through portable-spec yet: its "
            f"{behaviour_of(config.kind).extras} are not DFlash's, so {engine}'s {proposer} cannot run it as a "
            f"portable checkpoint ({engine}'s own {config.variant.engine_architecture} class reads z-lab and "
            "speculators checkpoints). fix: run it with `portable-spec generate` (reference backend)"
        )
    refuse_anchor_windows(config, source, engine)
    if not own_embeddings:
        refuse_own_embeddings(config, source, engine)
    if not reduced_vocabulary:
        refuse_reduced_vocabulary(config, source, engine)


def refuse_anchor_windows(config: DrafterConfig, source: str, engine: str) -> None:
    """vLLM and SGLang window a DFlash drafter's sliding layers per query slot (q - k < W, their attention
    backends' sliding window); a drafter trained with one window per block (speculators' trainer) would run there
    as another function, accepting less while output stays lossless: refused rather than served silently."""
    if config.has_windows and config.window_rule == "per_anchor":
        raise SpecError(
            f"{source}: window_rule=per_anchor (sliding_window {config.sliding_window}, every slot sees the "
            f"{config.sliding_window} positions before the anchor, as speculators' trainer computes): {engine} "
            "windows each slot from its own position (q - k < W), another function. fix: run it with `portable-spec "
            "generate` (reference and ONNX backends), or re-import it with `--window-rule per_slot` to serve what "
            f"{engine} computes (it then accepts what that function accepts)"
        )


def refuse_own_embeddings(config: DrafterConfig, source: str, engine: str) -> None:
    """Engines whose DFlash drafter always embeds and scores with the target's modules cannot run one that carries
    its own (a drafter narrower than its target, or one trained with its own head)."""
    if config.own_embeddings:
        raise SpecError(
            f"{source}: own_embeddings=true (hidden_size {config.hidden_size}, target {config.target.hidden_size}): "
            f"{engine}'s DFlash drafter embeds and scores with the target's embedding and LM head and loads none of "
            "its own. fix: serve this drafter with vLLM, or run it with `portable-spec generate` (reference and ONNX "
            "backends)"
        )


def refuse_reduced_vocabulary(config: DrafterConfig, source: str, engine: str) -> None:
    """The engines' DFlash drafters need their own draft-vocabulary lm_head; a portable checkpoint shares the
    target's, and the adapters do not slice it at load time yet."""
    if config.draft_vocab_size is not None:
        raise SpecError(
            f"{source}: draft_vocab_size={config.draft_vocab_size}: {engine}'s DFlash drafter needs its own "
            "draft-vocabulary lm_head, and a portable checkpoint shares the target's; this adapter does not slice it "
            "yet. fix: serve a full-vocabulary drafter (`portable-spec train --draft-vocab-size 0`), or run this one "
            "with `portable-spec generate` (reference and ONNX backends)"
        )
