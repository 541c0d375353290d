"""`portable-spec bench kernels`: each Triton kernel against its torch twin, in one run, as a time ratio.

On CUDA: median times (triton.testing.do_bench), the triton/torch ratio, and the kernel's achieved bandwidth
against the device's peak. On CPU the kernels cannot run compiled: the torch twins are timed alone and, with
--interpret, the kernels are checked in Triton's interpreter for correctness only (never timed).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from portable_spec.core import dispatch
from portable_spec.core.noise import VerifyNoise
from portable_spec.core.sampling import SamplingBatch, SamplingParams, target_probs


@dataclass
class VerifyShape:
    batch: int
    n: int
    vocab: int
    mode: str  # greedy | sampled | draft_probs

    def __str__(self) -> str:
        return f"B={self.batch} n={self.n} V={self.vocab} {self.mode}"


@dataclass
class AttentionShape:
    batch: int
    heads: int
    kv_heads: int
    k: int
    ctx_len: int
    head_dim: int
    dtype: torch.dtype
    causal: bool = True

    def __str__(self) -> str:
        return (
            f"B={self.batch} H={self.heads}/{self.kv_heads} k={self.k} T={self.ctx_len} d={self.head_dim} "
            f"{str(self.dtype).removeprefix('torch.')}"
        )


CUDA_VERIFY = [
    VerifyShape(1, 7, 151936, "greedy"),
    VerifyShape(64, 7, 151936, "sampled"),
    VerifyShape(64, 15, 32000, "draft_probs"),
]
CUDA_ATTENTION = [
    AttentionShape(1, 32, 8, 16, 4096, 128, torch.bfloat16),
    AttentionShape(32, 32, 8, 16, 2048, 128, torch.bfloat16),
    AttentionShape(64, 16, 2, 8, 1024, 64, torch.float16),
]
CPU_VERIFY = [VerifyShape(4, 7, 32000, "greedy"), VerifyShape(4, 7, 32000, "sampled")]
CPU_ATTENTION = [
    AttentionShape(4, 16, 4, 16, 1024, 128, torch.float32),
    AttentionShape(4, 16, 4, 16, 1024, 128, torch.bfloat16),
]


def verify_inputs(shape: VerifyShape, device: str, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    b, n, v = shape.batch, shape.n, shape.vocab
    logits = torch.randn(b, n + 1, v, device=device, generator=gen) * 3
    params = [SamplingParams()] if shape.mode == "greedy" else [SamplingParams(temperature=0.8, top_p=0.95)]
    sampling = SamplingBatch.from_params(params * b, device=device)
    draft_probs = (
        (logits[:, :n] + torch.randn(b, n, v, device=device, generator=gen)).softmax(-1)
        if shape.mode == "draft_probs"
        else None
    )
    draft_tokens = logits[:, :n].argmax(-1)
    positions = torch.randint(0, 1000, (b,), device=device, generator=gen)
    noise = VerifyNoise.for_chain(seed, torch.arange(b, device=device), positions, n, v)
    return logits, draft_tokens, sampling, noise, draft_probs


def attention_inputs(shape: AttentionShape, device: str, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    s = shape

    def randn(*size):
        return torch.randn(*size, device=device, generator=gen).to(s.dtype)

    q = randn(s.batch, s.heads, s.k, s.head_dim)
    ctx_k, ctx_v = randn(s.batch, s.kv_heads, s.ctx_len, s.head_dim), randn(s.batch, s.kv_heads, s.ctx_len, s.head_dim)
    blk_k, blk_v = randn(s.batch, s.kv_heads, s.k, s.head_dim), randn(s.batch, s.kv_heads, s.k, s.head_dim)
    valid = torch.rand(s.batch, s.ctx_len, device=device, generator=gen) < 0.9
    return q, ctx_k, ctx_v, blk_k, blk_v, valid, s.causal


def run_kernel_bench(repeats: int = 5, interpret: bool = False) -> int:
    if torch.cuda.is_available() and dispatch.triton_available():
        return _bench_cuda()
    reason = "no CUDA device" if not torch.cuda.is_available() else "triton does not import"
    print(
        f"device: cpu, {torch.get_num_threads()} threads ({reason}). The Triton kernels need CUDA: only the torch "
        "twins are timed here; there is no kernel/torch ratio and no bandwidth on this machine."
    )
    print(f"{'op':<10} {'shape':<42} {'torch ms':>9}")
    for shape in CPU_VERIFY:
        logits, drafts, sampling, noise, draft_probs = verify_inputs(shape, "cpu")
        total = _cpu_ms(lambda: dispatch.verify_op(logits, drafts, sampling, noise, draft_probs, impl="torch"), repeats)
        probs = _cpu_ms(lambda: target_probs(logits, sampling), repeats)
        print(f"{'verify':<10} {str(shape):<42} {total:9.2f}   (target_probs alone {probs:.2f} ms)")
    for shape in CPU_ATTENTION:
        args = attention_inputs(shape, "cpu")
        print(
            f"{'attention':<10} {str(shape):<42} {_cpu_ms(lambda: dispatch.attention_op(*args, impl='torch'), repeats):9.2f}"
        )
    if interpret:
        return _interpreter_check()
    print(
        "run with --interpret to check the kernels in Triton's interpreter (correctness only), or on a GPU: "
        "scripts/gpu/kernels_check.sh"
    )
    return 0


def _bench_cuda() -> int:
    from portable_spec.kernels import attention_triton, verify_triton

    props = torch.cuda.get_device_properties(0)
    peak = _peak_gbps()
    print(f"device: {props.name}, peak memory bandwidth {peak:.0f} GB/s (driver: memory clock x bus width)")
    print(
        f"{'op':<10} {'shape':<44} {'torch ms':>9} {'triton ms':>10} {'triton/torch':>13} {'kernel GB/s':>12} "
        f"{'% peak':>7}  same"
    )
    failures = 0
    for shape in CUDA_VERIFY:
        logits, drafts, sampling, noise, draft_probs = verify_inputs(shape, "cuda")
        expected = dispatch.verify_op(logits, drafts, sampling, noise, draft_probs, impl="torch")
        got = dispatch.verify_op(logits, drafts, sampling, noise, draft_probs, impl="triton")
        same = torch.equal(expected.output_tokens, got.output_tokens)
        failures += not same
        probs = target_probs(logits, sampling)
        torch_ms = _cuda_ms(lambda: dispatch.verify_op(logits, drafts, sampling, noise, draft_probs, impl="torch"))
        triton_ms = _cuda_ms(lambda: dispatch.verify_op(logits, drafts, sampling, noise, draft_probs, impl="triton"))
        kernel_ms = _cuda_ms(lambda: verify_triton.verify_probs(probs, drafts, noise, draft_probs))
        probs_ms = _cuda_ms(lambda: target_probs(logits, sampling))
        moved = verify_triton.bytes_moved(shape.batch, shape.n, shape.vocab, draft_probs is not None)
        gbps = moved / kernel_ms / 1e6
        print(
            f"{'verify':<10} {str(shape):<44} {torch_ms:9.3f} {triton_ms:10.3f} {triton_ms / torch_ms:13.3f} "
            f"{gbps:12.0f} {100 * gbps / peak:6.1f}%  {'yes' if same else 'NO'}"
        )
        print(
            f"{'':<10} {'  of which target_probs (torch, both paths)':<44} {probs_ms:9.3f}   "
            f"verify after p: torch ~{max(torch_ms - probs_ms, 0):.3f} ms, kernel {kernel_ms:.3f} ms"
        )
    for shape in CUDA_ATTENTION:
        args = attention_inputs(shape, "cuda")
        exact = dispatch.attention_reference(*[x.double() if x.is_floating_point() else x for x in args[:6]], args[6])
        twin, kernel = dispatch.attention_op(*args, impl="torch"), dispatch.attention_op(*args, impl="triton")
        twin_error = (twin.double() - exact).abs().max().item()
        kernel_error = (kernel.double() - exact).abs().max().item()
        same = kernel_error <= 2 * max(twin_error, 0.5 * torch.finfo(shape.dtype).eps)
        failures += not same
        torch_ms = _cuda_ms(lambda: dispatch.attention_op(*args, impl="torch"))
        triton_ms = _cuda_ms(lambda: dispatch.attention_op(*args, impl="triton"))
        moved = attention_triton.bytes_moved(
            shape.batch,
            shape.heads,
            shape.kv_heads,
            shape.ctx_len,
            shape.k,
            shape.head_dim,
            torch.finfo(shape.dtype).bits // 8,
        )
        gbps = moved / triton_ms / 1e6
        print(
            f"{'attention':<10} {str(shape):<44} {torch_ms:9.3f} {triton_ms:10.3f} {triton_ms / torch_ms:13.3f} "
            f"{gbps:12.0f} {100 * gbps / peak:6.1f}%  err {kernel_error:.1e} vs twin {twin_error:.1e}"
        )
    print("triton/torch < 1: the kernel path is faster. same: verify tokens identical; attention within 2x twin error.")
    return 1 if failures else 0


def _interpreter_check() -> int:
    """Check the kernels in Triton's interpreter, in a child process (the mode is fixed at triton's first import)."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    code = "import sys; from portable_spec.kernels.bench import interpreter_check; sys.exit(interpreter_check())"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=Path(__file__).resolve().parents[1]).returncode


def interpreter_check() -> int:
    """Run the kernels once in the interpreter on small shapes; report equality with the twins, not time."""
    from portable_spec.kernels import verify_triton

    if not verify_triton.INTERPRETED:
        print("interpreter check needs TRITON_INTERPRET=1 before triton's first import")
        return 2
    failures = 0
    for shape in [
        VerifyShape(3, 5, 300, "greedy"),
        VerifyShape(3, 5, 300, "sampled"),
        VerifyShape(3, 5, 300, "draft_probs"),
    ]:
        args = verify_inputs(shape, "cpu", seed=1)
        same = torch.equal(
            dispatch.verify_op(*args, impl="torch").output_tokens,
            dispatch.verify_op(*args, impl="triton").output_tokens,
        )
        failures += not same
        print(f"interpreter  verify     {str(shape):<34} tokens identical to torch: {'yes' if same else 'NO'}")
    for dtype in (torch.float32, torch.bfloat16):
        shape = AttentionShape(2, 4, 2, 8, 70, 32, dtype)
        args = attention_inputs(shape, "cpu", seed=1)
        exact = dispatch.attention_reference(*[x.double() if x.is_floating_point() else x for x in args[:6]], args[6])
        errors = [
            (dispatch.attention_op(*args, impl=impl).double() - exact).abs().max().item()
            for impl in ("torch", "triton")
        ]
        ok = errors[1] <= 2 * max(errors[0], 0.5 * torch.finfo(dtype).eps)
        failures += not ok
        print(
            f"interpreter  attention  {str(shape):<34} error {errors[1]:.1e} vs twin {errors[0]:.1e}: "
            f"{'within 2x' if ok else 'OVER 2x'}"
        )
    print("(interpreter runs check correctness only: numpy runs each program serially, so they are not timed)")
    return 1 if failures else 0


def _cpu_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _cuda_ms(fn: Callable[[], object]) -> float:
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def _peak_gbps() -> float:
    import triton.testing

    try:
        return triton.testing.get_dram_gbps()
    except Exception:  # older drivers: fall back to torch's properties
        props = torch.cuda.get_device_properties(0)
        return props.memory_clock_rate * props.memory_bus_width * 2 / 1e6 / 8
