"""Decode-shaped matmuls on CPU: y = (W @ x^T)^T when a linear layer sees a few rows (a verify chain, a draft block).

torch's `F.linear` computes x @ W^T; on the AVX2 CPUs measured here MKL runs that product for 2-8 rows at about
half of memory bandwidth (a 4-token target pass cost 1.7x a 1-token one), while the same product laid out as
W @ x^T (a tall-skinny GEMM) streams W at bandwidth. A speculative round's whole cost is such passes, so this is
where verifying k tokens becomes nearly as cheap as decoding one. Same weights and math; only the floating-point
summation order differs (~1e-6 relative). One-row calls keep `F.linear` (its GEMV is already at bandwidth), so
plain greedy decoding is bit-for-bit what it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

MAX_ROWS = 8  # per matrix, 8 rows measured equal or better and 16 slower; see docs/benchmarks/smollm2


class DecodeShapedLinear(nn.Linear):
    """nn.Linear whose forward takes the W @ x^T layout for 2..MAX_ROWS rows on CPU (state dict unchanged)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if x.device.type != "cpu" or not 2 <= rows <= MAX_ROWS or torch.is_grad_enabled():
            return super().forward(x)
        y = torch.mm(self.weight, x.reshape(rows, x.shape[-1]).t()).t()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


@contextmanager
def decode_shaped_linears(*modules: nn.Module | None) -> Iterator[None]:
    """Within the block, every plain nn.Linear in `modules` runs as DecodeShapedLinear; restored on exit (so HF
    `generate` baselines and training outside it use torch's own layer)."""
    swapped = [m for module in modules if module is not None for m in module.modules() if type(m) is nn.Linear]
    for layer in swapped:
        layer.__class__ = DecodeShapedLinear
    try:
        yield
    finally:
        for layer in swapped:
            layer.__class__ = nn.Linear
