"""Kernel tests run under the Triton interpreter where there is no GPU. The variable must be
set before any `kernels` module is imported: `triton.jit` picks interpreter or compiler when
it decorates a function."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
