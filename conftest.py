"""Session-wide test setup, loaded before any test module imports triton (transformers pulls it in via
torch._dynamo): without CUDA, Triton kernels run in its CPU interpreter for the whole session, so the kernel
tests run here against their torch twins instead of being skipped."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
