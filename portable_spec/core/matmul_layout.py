"""The matmul layout of each linear layer, chosen by timing on the machine that runs it, per shape and row count.

A decode loop's linear layers see a few rows at a time (1 for plain decoding, k + 1 for a verify chain, the block
for a drafter pass), where BLAS kernels differ most between CPUs: on the AMD AVX2 machines measured here MKL ran
`x @ W^T` (torch's `F.linear`) for 2-8 rows at about half of memory bandwidth while `W @ x^T` streamed W at
bandwidth; on an Intel AVX-512 machine the same `W @ x^T` layout made speculation slower than plain decoding
(issue 43: 0.72x, against 1.13x with `F.linear`). So no layout is assumed: the first time a (weight shape, rows,
dtype) is seen on a machine, both layouts are timed (a short warm-up, then the fastest of a few runs), the faster is
kept (torch's own unless the other wins by MARGIN), and the choice is cached on disk keyed by the machine (CPU model
and the flags that pick kernels, torch version, thread count), so later runs measure nothing. Same weights and math; only the summation order differs
(~1e-6 relative). With gradients on (training) torch's own layer always runs.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from portable_spec.core.outputs import write_file_atomically

LAYOUTS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "linear": lambda x, w: F.linear(x, w),  # x @ W^T: torch's own layer
    "transposed": lambda x, w: torch.mm(w, x.t()).t(),  # W @ x^T: a tall-skinny GEMM that streams W
}
# More rows than this (prefill, big batches) take torch's own layer unmeasured: GEMM kernels are at their best there,
# and a prompt of every new length would otherwise be timed inside a request. 16 holds a verify chain of block 16 at
# batch 1 and of block 4 at batch 4, and a drafter block of 16 at batch 1.
MAX_ROWS = 16
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma", "neon", "asimd", "sve")
CACHE_VARIABLE = "PORTABLE_SPEC_LAYOUT_CACHE"  # a file path: where the choices are kept instead (tests use it)
WARMUP, REPEATS = 2, 5
COLD_BYTES = 64 * 2**20  # more than the last-level caches of the CPUs measured here
# Another layout replaces torch's own only when it is this much faster: within it the two are equal as far as timing
# a lone product can tell (one-row products, where both are the same GEMV, are never timed: a noise-level "win" there
# ran plain decoding 4% slower inside the model's pass)
MARGIN = 0.05


def cpu_description() -> str:
    """The CPU model and the instruction-set flags that decide which BLAS kernels run ('unknown CPU' off Linux)."""
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("unknown CPU", platform.processor()):
                model = value.strip()
            if key.strip() in ("flags", "Features"):
                flags = set(value.split())
    except OSError:
        pass
    chosen = [flag for flag in KERNEL_FLAGS if flag in flags]
    return f"{model} ({' '.join(chosen) or 'no flags read'})"


def machine_key(device: torch.device) -> str:
    """What a layout choice depends on besides the product's shape and dtype: the hardware, torch, threads."""
    hardware = cpu_description()
    if device.type == "cuda":
        try:
            hardware = torch.cuda.get_device_name(device)
        except (AssertionError, RuntimeError):  # a device torch cannot name: key by its index
            hardware = f"CUDA device {device}"
    return f"{hardware} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def default_cache_path() -> Path:
    """matmul_layouts.json in portable-spec's cache folder (real_target.cache_root: $PORTABLE_SPEC_CACHE, else the XDG
    cache), unless $PORTABLE_SPEC_LAYOUT_CACHE names another file."""
    from portable_spec.core.real_target import cache_root

    return Path(os.environ.get(CACHE_VARIABLE) or cache_root() / "matmul_layouts.json")


def time_layouts(
    out_features: int,
    in_features: int,
    rows: int,
    dtype: torch.dtype,
    device: torch.device,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Seconds of each layout for one product (random operands of the shape; the values do not matter).
    Each run reads another copy of the weight, COLD_BYTES of copies in all, so weights come from memory as they do
    in a model's pass rather than from a cache a repeated product keeps warm."""
    generator = torch.Generator(device="cpu").manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=generator).to(device=device, dtype=dtype)
    copies = [weight] + [weight.clone() for _ in range(min(31, COLD_BYTES // (weight.numel() * weight.element_size())))]
    x = torch.randn(rows, in_features, generator=generator).to(device=device, dtype=dtype)
    seconds = {}
    for name, run in LAYOUTS.items():
        samples = []
        for index in range(WARMUP + REPEATS):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = clock()
            run(x, copies[index % len(copies)])
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if index >= WARMUP:
                samples.append(clock() - start)
        seconds[name] = min(samples)  # interference only ever adds time: the fastest run is the product's cost
    return seconds


def fastest(seconds: dict[str, float]) -> str:
    """The layout to run: the fastest, unless torch's own is within MARGIN of it."""
    best = min(seconds, key=seconds.get)
    return best if seconds[best] < (1 - MARGIN) * seconds["linear"] else "linear"


@dataclass
class LayoutTable:
    """Layout per (out_features, in_features, rows, dtype) on one machine, measured on first use and saved to `path`
    (None: kept in memory); or a fixed `rule` (rows -> layout) that measures nothing, for comparison rows.
    `measured` lists what this process timed."""

    key: str
    path: Path | None = None
    choices: dict[str, str] = field(default_factory=dict)
    measured: list[tuple[str, dict[str, float]]] = field(default_factory=list)
    timer: Callable[..., dict[str, float]] = time_layouts
    rule: Callable[[int], str] | None = None

    @classmethod
    def load(cls, device: torch.device, path: Path | None = None, **kwargs) -> "LayoutTable":
        """The choices saved for this machine (an unreadable cache file is ignored and rewritten, never deleted)."""
        key = machine_key(device)
        path = default_cache_path() if path is None else path
        choices = {}
        if Path(path).is_file():
            try:
                choices = dict(json.loads(Path(path).read_text()).get(key, {}))
            except (OSError, ValueError, AttributeError, TypeError):
                choices = {}
        return cls(key, path, choices, **kwargs)

    @classmethod
    def fixed(cls, layout: str, rows: range) -> "LayoutTable":
        """`layout` for these row counts and torch's own elsewhere, on every machine (what this project hard-coded
        before: "transposed" for 2-8 rows), kept to compare against the measured choice."""
        return cls(
            f"fixed: {layout} for rows {rows.start}-{rows.stop - 1}", rule=lambda n: layout if n in rows else "linear"
        )

    def layout(self, out_features: int, in_features: int, rows: int, dtype: torch.dtype, device) -> str:
        if rows > MAX_ROWS or rows == 1:  # one row: both layouts are the same matrix-vector product
            return "linear"
        if self.rule is not None:
            return self.rule(rows)
        name = f"{out_features}x{in_features}x{rows}x{str(dtype).removeprefix('torch.')}"
        if name not in self.choices:
            seconds = self.timer(out_features, in_features, rows, dtype, device)
            self.choices[name] = fastest(seconds)
            self.measured.append((name, seconds))
            self._save()
        return self.choices[name]

    def _save(self) -> None:
        if self.path is None:
            return
        path = Path(self.path)
        try:
            saved = json.loads(path.read_text()) if path.is_file() else {}
            saved = saved if isinstance(saved, dict) else {}
        except (OSError, ValueError):
            saved = {}
        saved[self.key] = dict(sorted(self.choices.items()))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_file_atomically(path, lambda tmp: tmp.write_text(json.dumps(saved, indent=1) + "\n"))
        except OSError:
            self.path = None  # a read-only home: measure per process rather than fail a decode

    def summary(self) -> str:
        """One line: the machine, and which layout won for how many products, by row count."""
        if self.rule is not None:
            return f"matmul layout {self.key}"
        by_layout: dict[str, set[int]] = {}
        for name, layout in self.choices.items():
            by_layout.setdefault(layout, set()).add(int(name.split("x")[2]))
        parts = [
            f"{layout} for {sum(c == layout for c in self.choices.values())} products (rows {_ranges(rows)})"
            for layout, rows in sorted(by_layout.items())
        ]
        where = f"; cached in {self.path}" if self.path is not None else ""
        return f"matmul layout measured on {self.key}: " + ("; ".join(parts) or "nothing yet") + where


def _ranges(values: set[int]) -> str:
    ordered, parts = sorted(values), []
    for value in ordered:
        if parts and value == parts[-1][1] + 1:
            parts[-1][1] = value
        else:
            parts.append([value, value])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


class MeasuredLinear(nn.Linear):
    """nn.Linear whose forward takes the layout its LayoutTable measured fastest for this shape and row count
    (state dict unchanged). Set by `measured_linears`; `_layouts` is that table."""

    _layouts: LayoutTable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if torch.is_grad_enabled():
            return super().forward(x)
        layout = self._layouts.layout(self.out_features, self.in_features, rows, x.dtype, x.device)
        if layout == "linear":
            return super().forward(x)
        y = LAYOUTS[layout](x.reshape(rows, x.shape[-1]), self.weight)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


@contextmanager
def measured_linears(table: LayoutTable, *modules: nn.Module | None) -> Iterator[None]:
    """Within the block every plain nn.Linear in `modules` runs as MeasuredLinear on `table`; restored on exit (so
    HF `generate` baselines and training outside it use torch's own layer)."""
    swapped = [m for module in modules if module is not None for m in module.modules() if type(m) is nn.Linear]
    for layer in swapped:
        layer.__class__ = MeasuredLinear
        layer._layouts = table
    try:
        yield
    finally:
        for layer in swapped:
            layer.__class__ = nn.Linear
            del layer._layouts
