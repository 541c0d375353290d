"""Deliberately broken backends: the suite must report each one's bug as a failure (never as a pass or skip).

`toy_verify` restates the verifier's math in a few lines with one switchable bug; with bug=None it must
conform (test_catches_broken.py checks that too, so a failure is the bug's and not the restatement's).
"""

from __future__ import annotations

import torch

from portable_spec.core.backends import Backend, ReferenceBackend
from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, target_probs
from portable_spec.core.spec import read_config
from portable_spec.core.target import TargetModel
from portable_spec.core.verify import VerifyResult

VERIFIER_BUGS = (
    "off_by_one",
    "global_rng",
    "accept_with_p",
    "resample_from_p",
    "unnormalised_residual",
    "accept_zero_q",
)


def toy_verify(
    target_logits,
    draft_tokens,
    sampling: SamplingBatch,
    noise: VerifyNoise,
    draft_probs=None,
    num_drafts=None,
    *,
    bug: str | None = None,
) -> VerifyResult:
    batch, n = draft_tokens.shape
    vocab = target_logits.shape[-1]
    num_drafts = torch.full((batch,), n) if num_drafts is None else num_drafts
    p = target_probs(target_logits, sampling)  # [B, n+1, V]
    q = torch.zeros_like(p)
    if draft_probs is None:
        q[:, :n].scatter_(-1, draft_tokens[..., None], 1.0)
    else:
        q[:, :n] = draft_probs
    q = q * (torch.arange(n + 1) < num_drafts[:, None])[..., None]
    accept_u, sample_u = noise.accept_uniform, noise.sample_uniform
    if bug == "global_rng":
        accept_u, sample_u = torch.rand(accept_u.shape), torch.rand(sample_u.shape)
    p_draft = p[:, :n].gather(-1, draft_tokens[..., None])[..., 0]
    q_draft = q[:, :n].gather(-1, draft_tokens[..., None])[..., 0]
    passes = accept_u <= p_draft if bug == "accept_with_p" else accept_u * q_draft <= p_draft
    if bug != "accept_zero_q":  # a draft the drafter gave probability 0 cannot have come from q: reject it
        passes &= q_draft > 0
    passes &= torch.arange(n) < num_drafts[:, None]
    accepted_len = passes.long().cumprod(-1).sum(-1)
    if bug == "off_by_one":  # counts the first rejected draft as accepted
        accepted_len = torch.minimum(accepted_len + 1, num_drafts)
    rows = torch.arange(batch)
    p_next, q_next = p[rows, accepted_len], q[rows, accepted_len]
    residual = p_next if bug == "resample_from_p" else (p_next - q_next).clamp(min=0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p_next)
    if bug == "unnormalised_residual":  # inverse CDF against a residual that sums to < 1
        cdf = residual.cumsum(-1)
        next_token = torch.searchsorted(cdf, sample_u[rows, accepted_len, :1]).clamp(max=vocab - 1)[:, 0]
    else:
        next_token = (residual / -torch.log(sample_u[rows, accepted_len])).argmax(-1)
    output = torch.cat((draft_tokens, draft_tokens.new_zeros(batch, 1)), dim=1)
    output = torch.where(torch.arange(n + 1) < accepted_len[:, None], output, -1)
    output[rows, accepted_len] = next_token
    return VerifyResult(accepted_len=accepted_len, next_token=next_token, output_tokens=output)


class ToyVerifierBackend(ReferenceBackend):
    """The reference everywhere except `verify`, which is toy_verify with `bug` (None = correct)."""

    name = "toy_verifier"
    bug: str | None = None

    def verify(self, target_logits, draft_tokens, sampling, noise, draft_probs=None, num_drafts=None):
        return toy_verify(target_logits, draft_tokens, sampling, noise, draft_probs, num_drafts, bug=self.bug)


def broken_verifier(bug: str) -> type[ToyVerifierBackend]:
    if bug not in VERIFIER_BUGS:
        raise ValueError(f"bug {bug!r} is unknown; valid options: {', '.join(VERIFIER_BUGS)}")
    return type(f"Broken_{bug}", (ToyVerifierBackend,), {"name": f"broken_{bug}", "bug": bug})


OffByOneBackend = broken_verifier("off_by_one")
GlobalRngBackend = broken_verifier("global_rng")
ZeroQBackend = broken_verifier("accept_zero_q")


class LayerShiftBackend(ReferenceBackend):
    """Captures the state ENTERING layer i (HF hidden_states[i]) for id i: the vLLM/SGLang +1 shift missed."""

    name = "broken_layer_shift"

    def target_forward(self, target_dir, chain_ids, positions, layer_ids):
        model = TargetModel.load(target_dir).model
        with torch.no_grad():
            out = model(input_ids=chain_ids, position_ids=positions, output_hidden_states=True)
        return out.logits.float(), torch.cat([out.hidden_states[i] for i in layer_ids], dim=-1).float()


class UnavailableBackend(ReferenceBackend):
    """Could run every check, but says it cannot run here: every check must be a skip with this reason."""

    name = "unavailable"

    def unavailable_reason(self) -> str | None:
        return "needs a CUDA device (toy backend for the suite's own tests)"


class EchoReferenceBackend(Backend):
    """Hands back the reference's own result objects (from the suite's memo) instead of computing anything: every
    comparison it takes part in compares an object with itself, which the checks must fail, never pass."""

    name = "echo_reference"
    workspace = None  # the suite's Workspace, set by the test

    def target_forward(self, target_dir, chain_ids, positions, layer_ids):
        return self.workspace.memo("reference-target-forward", lambda: None)

    def block_logits(self, target_dir, drafter_dir, *args):
        return self.workspace.memo(("reference-block-logits", read_config(drafter_dir).kind), lambda: None)

    def generate(self, target_dir, drafter_dir, prompts, config):
        key = ("plain", "reference", str(target_dir), tuple(map(tuple, prompts)), config)
        return self.workspace.memo(key, lambda: self.workspace.reference.generate(target_dir, None, prompts, config))


class DecodeLayerShiftBackend(ReferenceBackend):
    """Decodes with the drafter fed the state ENTERING layer i (HF hidden_states[i]) for id i, one layer too low:
    the engine that misses the +1 convention. Verification keeps its output lossless; only acceptance shows it."""

    name = "broken_decode_layer_shift"

    def decoder(self, target_dir, drafter_dir):
        decoder = super().decoder(target_dir, drafter_dir)
        if decoder.layer_ids is not None:
            decoder.layer_ids = [i - 1 for i in decoder.layer_ids]  # target.forward reads hidden[i + 1]
        return decoder
