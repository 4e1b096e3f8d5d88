"""C++ kernels for the CPU path, compiled on first use with the machine's C++ compiler
(torch.utils.cpp_extension; the build is cached under ~/.cache/torch_extensions).

`paged_attention_short()` is the op, or None when it cannot be built here (no compiler, say):
callers then keep the plain-PyTorch path, which computes the same thing more slowly.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_attention.cpp")
# -ffast-math for the vectorised exp (the source keeps clear of infinities); compile flags
# only, so the process's floating-point mode is left alone.
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
# OpenMP for at::parallel_for: the library links libgomp.so.1 by name, which resolves to the
# one torch has already loaded, so both share one thread pool.
LDFLAGS = ["-fopenmp"]


@functools.cache
def paged_attention_short():
    try:
        from torch.utils.cpp_extension import load
        load(name="specserve_cpu", sources=[str(SOURCE)], extra_cflags=CFLAGS, extra_ldflags=LDFLAGS,
             is_python_module=False, verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the PyTorch path
        logger.warning("CPU paged-attention kernel unavailable (%s); using the PyTorch path",
                       str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__)
        return None
    return torch.ops.specserve_cpu.paged_attention_short
