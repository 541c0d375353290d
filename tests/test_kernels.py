"""Triton kernels against their torch twins: exact tokens for verification, the 2x error rule for attention.

Triton fixes interpreter-or-compiler when it is first imported in a process, and torch._dynamo (pulled in by
transformers) imports it whenever it is installed; the repository's root conftest.py therefore sets
TRITON_INTERPRET=1 before anything imports it when there is no CUDA, and these tests run the kernels in the
interpreter. The `gpu` tests compile the kernels (CUDA present at import).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from portable_spec.conformance.golden import GOLDEN_DIR, case_paths, load_case, to_tensors
from portable_spec.core import dispatch
from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, SamplingParams
from portable_spec.core.verify import verify

REPO = Path(__file__).resolve().parents[1]
SAMPLED = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=20),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.5, top_k=5, top_p=0.9),
]


def _import_kernels(interpret: bool):
    """Import triton and the kernel modules; @triton.jit picks interpreter or compiler at triton's first import."""
    previous = os.environ.get("TRITON_INTERPRET")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        return importlib.import_module("portable_spec.kernels.verify_triton"), importlib.import_module(
            "portable_spec.kernels.attention_triton"
        )
    except ImportError as error:
        return f"triton does not import ({error}); pip install 'portable-spec[triton]'"
    finally:  # the variable does not outlive the import
        if previous is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = previous


KERNELS = _import_kernels(interpret="triton" not in sys.modules and not torch.cuda.is_available())
INTERPRETED_HERE = not isinstance(KERNELS, str) and KERNELS[0].INTERPRETED


@pytest.fixture
def interpreted(monkeypatch):
    """Kernel modules in interpreter mode; triton reads TRITON_INTERPRET while running, so it is set per test."""
    if isinstance(KERNELS, str):
        pytest.skip(KERNELS)
    if not INTERPRETED_HERE:
        pytest.skip("CUDA is present: the kernels are compiled, and the `gpu` tests check them")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return KERNELS


@pytest.fixture
def compiled():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if isinstance(KERNELS, str):
        pytest.skip(KERNELS)
    return KERNELS


# -- verification ----------------------------------------------------------------------------------------------
def verify_case(batch, n, vocab, mode, seed=0, device="cpu"):
    """Logits, drafts (some right, some wrong), sampling, noise, draft probs, ragged num_drafts."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, n + 1, vocab, generator=gen) * 3
    if mode == "greedy":
        params = [SamplingParams()] * batch
    else:
        params = [SAMPLED[i % len(SAMPLED)] for i in range(batch)]
    draft_probs = None
    if mode == "draft_probs":
        draft_probs = (logits[:, :n] + torch.randn(batch, n, vocab, generator=gen)).softmax(-1)
        draft_tokens = torch.multinomial(draft_probs.reshape(-1, vocab), 1, generator=gen).view(batch, n)
    else:
        draft_tokens = logits[:, :n].argmax(-1)
        wrong = torch.rand(batch, n, generator=gen) < 0.25
        draft_tokens = torch.where(wrong, torch.randint(0, vocab, (batch, n), generator=gen), draft_tokens)
    num_drafts = torch.randint(0, n + 1, (batch,), generator=gen)
    num_drafts[0] = n
    first_positions = torch.randint(0, 500, (batch,), generator=gen).to(device)
    noise = VerifyNoise.for_chain(seed, torch.arange(batch, device=device) + 7, first_positions, n, vocab)
    return (
        logits.to(device),
        draft_tokens.to(device),
        SamplingBatch.from_params(params, device=device),
        noise,
        None if draft_probs is None else draft_probs.to(device),
        num_drafts.to(device),
    )


def assert_same_verify(case, verify_triton, block_v=None):
    logits, draft_tokens, sampling, noise, draft_probs, num_drafts = case
    expected = verify(logits, draft_tokens, sampling, noise, draft_probs, num_drafts)
    got = dispatch.verify_op(logits, draft_tokens, sampling, noise, draft_probs, num_drafts, impl="triton")
    results = [got]
    if block_v is not None:  # several vocab tiles: the running argmax must keep the first index
        from portable_spec.core.sampling import target_probs

        results.append(
            verify_triton.verify_probs(
                target_probs(logits, sampling), draft_tokens, noise, draft_probs, num_drafts, block_v=block_v
            )
        )
    for result in results:
        assert torch.equal(result.accepted_len, expected.accepted_len)
        assert torch.equal(result.next_token, expected.next_token)
        assert torch.equal(result.output_tokens, expected.output_tokens)
    return expected


@pytest.mark.parametrize("mode", ["greedy", "sampled", "draft_probs"])
@pytest.mark.parametrize("batch,n,vocab", [(1, 1, 37), (3, 4, 300), (5, 7, 130)])
def test_verify_kernel_equals_reference(interpreted, mode, batch, n, vocab):
    expected = assert_same_verify(verify_case(batch, n, vocab, mode, seed=batch * 100 + n), interpreted[0], block_v=32)
    assert expected.accepted_len.max() <= n


def test_verify_kernel_all_accept_first_reject_and_ragged(interpreted):
    logits, _, sampling, noise, _, _ = verify_case(4, 5, 64, "greedy", seed=3)
    target_argmax = logits[:, :5].argmax(-1)
    drafts = target_argmax.clone()
    drafts[1, 0] = (drafts[1, 0] + 1) % 64  # first slot rejected
    drafts[2, 3] = (drafts[2, 3] + 1) % 64  # rejected after 3
    num_drafts = torch.tensor([5, 5, 5, 2])  # request 3: ragged, both drafts accepted
    noise.accept_uniform[0] = 1.0  # boundary of the test: u * q == p is an accept
    expected = assert_same_verify((logits, drafts, sampling, noise, None, num_drafts), interpreted[0], block_v=16)
    assert expected.accepted_len.tolist() == [5, 0, 3, 2]
    assert expected.next_token[0] == logits[0, 5].argmax() and expected.next_token[3] == logits[3, 2].argmax()


@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")  # 0 / -0 in numpy
def test_verify_kernel_ties_and_unit_uniform(interpreted):
    """Equal probabilities with equal noise tie exactly: the first index wins; u = 1 (E = -0) follows torch too."""
    vocab, n = 40, 2
    logits = torch.zeros(3, n + 1, vocab)
    logits[:, :, 10:20] = 5.0  # ten equally likely tokens after top-k
    sampling = SamplingBatch.from_params([SamplingParams(temperature=1.0, top_k=10)] * 2 + [SamplingParams()])
    sample_uniform = torch.full((3, n + 1, vocab), 0.25)
    sample_uniform[1, :, 3] = 1.0  # zero-probability token whose exponential is -0: 0 / -0 = NaN in the race
    sample_uniform[2, :, 30] = 1.0
    noise = VerifyNoise(accept_uniform=torch.full((3, n), 0.05), sample_uniform=sample_uniform)
    drafts = torch.tensor([[12, 15], [0, 1], [10, 10]])
    expected = assert_same_verify((logits, drafts, sampling, noise, None, None), interpreted[0], block_v=8)
    assert expected.accepted_len[0] == 2 and expected.next_token[0] == 10


def test_verify_kernel_bf16_draft_probs(interpreted):
    logits, drafts, sampling, noise, draft_probs, num_drafts = verify_case(3, 4, 96, "draft_probs", seed=11)
    assert_same_verify((logits, drafts, sampling, noise, draft_probs.to(torch.bfloat16), num_drafts), interpreted[0])


# -- attention -------------------------------------------------------------------------------------------------
def attention_case(batch, heads, kv_heads, k, ctx_len, d, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, k, d, generator=gen, dtype=torch.float64)
    context = torch.randn(batch, kv_heads, ctx_len + 3, 2 * d, generator=gen, dtype=torch.float64)
    context_k, context_v = context[:, :, :ctx_len, :d], context[:, :, :ctx_len, d:]  # cropped cache views
    block_k = torch.randn(batch, kv_heads, k, d, generator=gen, dtype=torch.float64)
    block_v = torch.randn(batch, kv_heads, k, d, generator=gen, dtype=torch.float64)
    valid = torch.rand(batch, ctx_len, generator=gen) < 0.7  # holes from rejected slots
    if batch > 1:
        valid[1] = False  # a request that sees only its block
    return [x.to(device) for x in (q, context_k, context_v, block_k, block_v, valid)]


def assert_error_rule(case, dtype, causal, num_splits, attention_triton):
    """Kernel error vs fp64 (on the same rounded inputs) <= 2x the torch twin's error at `dtype`."""
    *tensors, valid = case
    low = [x.to(dtype) for x in tensors]
    exact = dispatch.attention_reference(*[x.double() for x in low], valid, causal)
    twin = dispatch.attention_op(*low, valid, causal, impl="torch")
    if num_splits is None:
        kernel = dispatch.attention_op(*low, valid, causal, impl="triton")
    else:
        kernel = attention_triton.injected_attention_triton(*low, valid, causal, num_splits=num_splits)
    assert kernel.dtype == dtype and kernel.shape == twin.shape
    twin_error = (twin.double() - exact).abs().max().item()
    kernel_error = (kernel.double() - exact).abs().max().item()
    floor = 0.5 * torch.finfo(dtype).eps  # a twin that happens to be exact must not demand an exact kernel
    assert kernel_error <= 2 * max(twin_error, floor), (kernel_error, twin_error)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "batch,heads,kv_heads,k,ctx_len,d,num_splits",
    [
        (2, 2, 2, 4, 37, 16, None),  # MHA
        (2, 4, 2, 8, 70, 32, 2),  # GQA 2, two context splits merged
        (1, 8, 2, 1, 130, 16, 3),  # GQA 4, one query slot
        (3, 3, 1, 5, 0, 24, None),  # MQA, no context yet; head_dim not a power of two
    ],
)
def test_attention_kernel_error_rule(interpreted, dtype, causal, batch, heads, kv_heads, k, ctx_len, d, num_splits):
    case = attention_case(batch, heads, kv_heads, k, ctx_len, d, seed=batch + k + ctx_len)
    assert_error_rule(case, dtype, causal, num_splits, interpreted[1])


def test_attention_twin_is_the_drafter_attention():
    """The twin (the drafter's injected_attention + block_attention_mask) is masked softmax attention with GQA."""
    q, context_k, context_v, block_k, block_v, valid = attention_case(2, 4, 2, 4, 9, 16)
    for causal in (True, False):
        scores = torch.cat((context_k, block_k), 2).repeat_interleave(2, 1)
        values = torch.cat((context_v, block_v), 2).repeat_interleave(2, 1)
        within = torch.ones(4, 4, dtype=torch.bool).tril() if causal else torch.ones(4, 4, dtype=torch.bool)
        mask = torch.cat((valid[:, None, None, :].expand(-1, 1, 4, -1), within.expand(2, 1, 4, 4)), -1)
        logits = (q @ scores.transpose(-1, -2) / 4.0).masked_fill(~mask, float("-inf"))
        expected = logits.softmax(-1) @ values
        got = dispatch.attention_reference(q, context_k, context_v, block_k, block_v, valid, causal)
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("kind", ["depth_causal", "parallel"])
def test_decode_loop_drafts_through_the_attention_kernel(interpreted, monkeypatch, kind):
    """The reference loop's drafter attention goes through dispatch.attention_op: forced to Triton (interpreter
    here, compiled on CUDA) the kernel runs every round and the output equals the torch twin's."""
    from portable_spec.core.decode import GenerationConfig, SpeculativeDecoder
    from portable_spec.core.testing import tiny_drafter, tiny_target

    target = tiny_target()
    drafter = tiny_drafter(target, kind, block_size=4)
    config = GenerationConfig(max_new_tokens=6, num_draft_tokens=3)
    prompts = [[5, 9, 14, 3], [40, 41, 42, 43, 44]]
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    expected = SpeculativeDecoder(target, drafter).generate(prompts, config).tokens
    attention = interpreted[1]
    calls = []
    original = attention.injected_attention_triton
    monkeypatch.setattr(attention, "injected_attention_triton", lambda *a, **k: calls.append(1) or original(*a, **k))
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    assert SpeculativeDecoder(target, drafter).generate(prompts, config).tokens == expected
    assert len(calls) >= drafter.config.num_hidden_layers  # every layer of every drafter pass


# -- dispatch --------------------------------------------------------------------------------------------------
def test_dispatch_picks_torch_on_cpu_and_obeys_overrides(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    assert dispatch.choose_impl(cpu, kernel="verify_triton") == "torch"
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    assert dispatch.choose_impl(cpu, "auto", kernel="verify_triton") == "torch"
    monkeypatch.setenv(dispatch.ENV_VAR, "triton-please")
    with pytest.raises(ValueError, match="choose one of"):
        dispatch.choose_impl(cpu, kernel="verify_triton")


def test_dispatch_imports_no_triton_on_the_torch_path():
    """A fresh process: the torch path never imports triton; forcing triton on CPU without the interpreter fails."""
    code = """
import sys, torch
from portable_spec.core.dispatch import attention_op, triton_available, verify_op
from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, SamplingParams
noise = VerifyNoise.for_chain(0, torch.arange(2), torch.tensor([4, 9]), 3, 20)
args = (torch.randn(2, 4, 20), torch.randint(0, 20, (2, 3)), SamplingBatch.from_params([SamplingParams()] * 2), noise)
verify_op(*args)
x = torch.randn(1, 2, 3, 16)
attention_op(x, x, x, x, x, torch.ones(1, 3, dtype=torch.bool), True)
assert "triton" not in sys.modules, "triton was imported on the torch path"
if triton_available():
    try:
        verify_op(*args, impl="triton")
    except RuntimeError as error:
        assert "TRITON_INTERPRET=1" in str(error), error
    else:
        raise AssertionError("forcing triton on CPU tensors without the interpreter should fail")
"""
    env = {key: value for key, value in os.environ.items() if key not in ("TRITON_INTERPRET", dispatch.ENV_VAR)}
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=env)


# -- on a GPU: compiled kernels at realistic sizes -------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["greedy", "sampled", "draft_probs"])
@pytest.mark.parametrize("batch,n,vocab", [(1, 7, 32000), (16, 15, 151936), (64, 3, 4099)])
def test_verify_kernel_cuda(compiled, mode, batch, n, vocab):
    assert_same_verify(verify_case(batch, n, vocab, mode, seed=n, device="cuda"), compiled[0], block_v=256)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "batch,heads,kv_heads,k,ctx_len,d,num_splits",
    [
        (1, 32, 8, 16, 4096, 128, None),
        (8, 16, 2, 8, 1000, 64, None),
        (4, 8, 8, 16, 300, 128, 1),
        (2, 4, 1, 1, 77, 80, 5),
    ],
)
def test_attention_kernel_cuda(compiled, dtype, causal, batch, heads, kv_heads, k, ctx_len, d, num_splits):
    case = attention_case(batch, heads, kv_heads, k, ctx_len, d, seed=k, device="cuda")
    assert_error_rule(case, dtype, causal, num_splits, compiled[1])


def test_verify_kernel_rejects_zero_draft_probability(interpreted):
    logits = torch.zeros(2, 2, 48)
    logits[:, :, :2] = 4.0
    sampling = SamplingBatch.from_params([SamplingParams(temperature=1.0, top_k=2)] * 2)
    draft_probs = torch.zeros(2, 1, 48)
    draft_probs[:, 0, :2] = 0.5
    noise = VerifyNoise.for_chain(5, torch.arange(2), torch.zeros(2, dtype=torch.int64), 1, 48)
    expected = assert_same_verify(
        (logits, torch.tensor([[40], [1]]), sampling, noise, draft_probs, None), interpreted[0], block_v=16
    )
    assert expected.accepted_len[0] == 0  # q = 0 = p: rejected by both implementations


@pytest.mark.parametrize("name", [path.stem for path in case_paths()])
def test_verify_kernel_reproduces_every_golden_file(interpreted, name):
    """The conformance golden files through the Triton kernel (interpreted here, compiled on the GPU run): among them
    draft_prob_zero, where a draft the drafter gave probability 0 must be rejected (p = 0 and p > 0 rows)."""
    golden = to_tensors(load_case(GOLDEN_DIR / f"{name}.json"))
    got = dispatch.verify_op(
        golden.target_logits,
        golden.draft_tokens,
        golden.sampling,
        golden.noise,
        golden.draft_probs,
        golden.num_drafts,
        impl="triton",
    )
    assert got.accepted_len.tolist() == golden.accepted_len.tolist()
    assert got.next_token.tolist() == golden.next_token.tolist()
    assert got.output_tokens.tolist() == golden.output_tokens.tolist()


def _compiled_variants(kernel) -> int:
    """How many compiled specialisations a @triton.jit function holds (triton >= 3.2 keeps them per device)."""
    caches = getattr(kernel, "device_caches", None)
    assert caches is not None, "this triton keeps no device_caches: update _compiled_variants for its layout"
    return sum(len(entry[0]) for entry in caches.values())


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_attention_kernel_compiles_once_as_the_context_grows(compiled, causal):
    """A decode loop's context grows every round: lengths and split counts are runtime arguments, so one compile
    serves every length (the H200 run timed a compile per 64 positions inside its rows)."""
    kernel = compiled[1]
    from portable_spec.kernels import attention_triton

    before = _compiled_variants(attention_triton._attention_kernel)
    for ctx_len in (5, 64, 65, 130, 777, 4096):
        case = attention_case(2, 8, 2, 4, ctx_len, 64, seed=ctx_len, device="cuda")
        kernel(*[x.to(torch.bfloat16) if x.is_floating_point() else x for x in case[:5]], case[5], causal)
    assert _compiled_variants(attention_triton._attention_kernel) - before <= 1
