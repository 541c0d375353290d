"""The `sglang.srt.plugins` entry point: serve portable-spec drafters under `--speculative-algorithm DFLASH`.

`register()` runs in every SGLang process (launcher, scheduler, detokenizer) and only installs two hooks, so it
imports no model code:
  * ServerArgs resolution (`handle_speculative_decoding`, SGLang's plugin resolution hook): a portable
    checkpoint given as --speculative-draft-model-path is validated (algorithm, variant, weights, target shapes,
    block options) before SGLang's own DFlash checks run;
  * `SpeculativeAlgorithm.create_worker` (scheduler): for a portable checkpoint it registers the depth_causal
    architecture and returns DFlashWorkerV2 behind the target binding check (worker.py); parallel and dflash2
    checkpoints run SGLang's own DFlashDraftModel / DFlash2DraftModel.
Anything that is not a portable checkpoint passes through untouched.
"""

from __future__ import annotations

import logging

from portable_spec.adapters.sglang.validate import (
    NATIVE_KINDS,
    check_algorithm,
    check_servable,
    check_sglang_version,
    check_speculative_options,
    check_weight_names,
    hint_for_unknown_algorithm,
    portable_config_of,
)
from portable_spec.core.spec import SpecError
from portable_spec.core.variants import behaviour_of

logger = logging.getLogger(__name__)
CREATE_WORKER = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"
RESOLUTION_STEP = "handle_speculative_decoding"


def register() -> None:
    """Entry point called by sglang.srt.plugins.load_plugins(); SGLang logs (and survives) any exception here,
    so an unsupported version is reported here and refused again where a portable checkpoint is used."""
    try:
        check_sglang_version()
    except SpecError as error:
        logger.error("portable-spec SGLang adapter is disabled: %s", error)
        _refuse_portable_checkpoints(error)
        return
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    register_resolution_hook(RESOLUTION_STEP)(validate_speculative_args)
    HookRegistry.register(CREATE_WORKER, serve_portable_worker, HookType.AFTER)


def validate_speculative_args(server_args, previous) -> None:
    """Resolution hook: our checks, SGLang's step, then our checks on the values SGLang resolved."""
    from sglang.srt.arg_groups.overrides import resolving_view

    args = resolving_view(server_args)
    _refuse_our_names_as_algorithm(args.speculative_algorithm)
    config = portable_config_of(args.speculative_draft_model_path)
    if config is None or args.speculative_algorithm is None:
        previous(server_args)
        return
    source = str(args.speculative_draft_model_path)
    check_algorithm(args.speculative_algorithm, source)
    check_servable(config, source)
    check_weight_names(source, config)
    _check_target_shapes(config, args, source)
    _check_options(config, args, source)
    previous(server_args)
    _check_options(config, resolving_view(server_args), source)


def serve_portable_worker(worker_cls, algorithm, server_args):
    """create_worker AFTER hook: DFLASH + portable checkpoint -> architecture registered, binding-checked worker."""
    from sglang.srt.arg_groups.overrides import resolving_view

    if not algorithm.is_dflash():
        return None
    config = portable_config_of(resolving_view(server_args).speculative_draft_model_path)
    if config is None:
        return None
    if not behaviour_of(config.kind).engine_native and config.kind not in NATIVE_KINDS:  # else SGLang's own class
        from portable_spec.adapters.sglang.draft_model import register_architecture

        register_architecture()
    from portable_spec.adapters.sglang.worker import DFlashWorkerV2, PortableSpecDFlashWorker

    if worker_cls is DFlashWorkerV2:
        return PortableSpecDFlashWorker
    logger.warning("portable-spec: platform worker %s replaces DFlashWorkerV2; target binding not checked", worker_cls)
    return None


def _check_options(config, args, source: str) -> None:
    check_speculative_options(
        config,
        num_draft_tokens=args.speculative_num_draft_tokens,
        dflash_block_size=args.speculative_dflash_block_size,
        draft_window_size=args.speculative_draft_window_size,
        source=source,
    )


def _check_target_shapes(config, args, source: str) -> None:
    """Launcher-time binding check from the target's config.json (weights are compared later, in the worker)."""
    from sglang.srt.utils.hf_transformers_utils import get_config

    from portable_spec.core.binding import check_target_matches

    try:
        target = get_config(args.model_path, trust_remote_code=args.trust_remote_code, revision=args.revision)
    except Exception as error:  # SGLang reports an unreadable target itself, with its own message
        logger.warning(
            "portable-spec: target config of %s not readable (%s); shapes checked at load", args.model_path, error
        )
        return
    text = target.get_text_config()
    check_target_matches(
        config,
        hidden_size=int(text.hidden_size),
        num_hidden_layers=int(text.num_hidden_layers),
        vocab_size=int(text.vocab_size),
        fingerprint=None,
        served_as=f"target {args.model_path!r} (drafter {source})",
    )


def _refuse_our_names_as_algorithm(algorithm: str | None) -> None:
    if not algorithm:
        return
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    try:
        SpeculativeAlgorithm.from_string(algorithm)
    except ValueError:
        hint = hint_for_unknown_algorithm(algorithm)
        if hint is not None:
            raise SpecError(hint) from None


def _refuse_portable_checkpoints(error: SpecError) -> None:
    """On an unsupported SGLang, still refuse portable checkpoints at ServerArgs time where that hook exists."""

    def refuse(server_args, previous) -> None:
        if portable_config_of(getattr(server_args, "speculative_draft_model_path", None)) is not None:
            raise SpecError(str(error))
        previous(server_args)

    try:
        from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

        register_resolution_hook(RESOLUTION_STEP)(refuse)
    except Exception as hook_error:  # that SGLang has no such hook: the logged error above is all we can do
        logger.warning("portable-spec: cannot hook ServerArgs on this SGLang (%s)", hook_error)
