"""Session-wide test setup, loaded before any test module imports triton (transformers pulls it in via
torch._dynamo): without CUDA, Triton kernels run in its CPU interpreter for the whole session, so the kernel
tests run here against their torch twins instead of being skipped. Measured matmul layouts (core/matmul_layout.py)
are cached in a folder of the test session's own, never in the user's ~/.cache."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if "PORTABLE_SPEC_LAYOUT_CACHE" not in os.environ:
    import tempfile

    os.environ["PORTABLE_SPEC_LAYOUT_CACHE"] = os.path.join(
        tempfile.mkdtemp(prefix="portable-spec-test-cache-"), "matmul_layouts.json"
    )
