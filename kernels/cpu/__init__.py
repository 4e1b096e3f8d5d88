"""C++ kernels for the CPU path, compiled on first use with the machine's C++ compiler
(torch.utils.cpp_extension; the build is cached under ~/.cache/torch_extensions):
paged attention for decode and verify rows (paged_attention.cpp) and the fused elementwise
work of a decoder layer (layer_ops.cpp).

`cpu_ops()` is the `torch.ops.specserve_cpu` namespace, or None when it cannot be built here
(no compiler, say): callers then keep the plain-PyTorch path, which computes the same thing
more slowly.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("paged_attention.cpp", "layer_ops.cpp")]
# -ffast-math for the vectorised exp (the sources keep clear of infinities and NaN); compile
# flags only, so the process's floating-point mode is left alone. OpenMP for at::parallel_for:
# the library links libgomp.so.1 by name, which resolves to the copy torch has already loaded,
# so both share one thread pool.
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
LDFLAGS = ["-fopenmp"]


@functools.cache
def cpu_ops():
    try:
        from torch.utils.cpp_extension import load
        load(name="specserve_cpu", sources=[str(s) for s in SOURCES], extra_cflags=CFLAGS,
             extra_ldflags=LDFLAGS, is_python_module=False, verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the PyTorch path
        lines = str(exc).strip().splitlines()
        logger.warning("CPU kernels unavailable (%s); using the PyTorch path",
                       lines[-1] if lines else type(exc).__name__)
        return None
    return torch.ops.specserve_cpu


def paged_attention_short():
    """The paged attention op for a few query tokens per sequence, or None."""
    ops = cpu_ops()
    return ops.paged_attention_short if ops is not None else None
