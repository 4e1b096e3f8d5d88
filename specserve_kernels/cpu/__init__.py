"""C++ kernels for the CPU path, compiled on first use with the machine's C++ compiler
(torch.utils.cpp_extension; the build is cached under ~/.cache/torch_extensions, one build
directory per checkout, python and torch, so checkouts side by side do not rebuild over each
other):
paged attention for decode and verify rows (paged_attention.cpp), the fused elementwise
work of a decoder layer (layer_ops.cpp), and a sampled row's draw (draw.cpp).

`cpu_ops()` is the `torch.ops.specserve_cpu` namespace, or None when it cannot be built here
(no compiler, say): callers then keep the plain-PyTorch path, which computes the same thing
more slowly.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import sys
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("paged_attention.cpp", "layer_ops.cpp", "draw.cpp")]
# -ffast-math for the vectorised exp (the sources keep clear of infinities and NaN); compile
# flags only, so the process's floating-point mode is left alone. OpenMP for at::parallel_for:
# the library links libgomp.so.1 by name, which resolves to the copy torch has already loaded,
# so both share one thread pool.
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp"]
LDFLAGS = ["-fopenmp"]
# A build takes well under a minute here. torch's build lock has no owner and no timeout: a
# process killed while building (a replica killed at start-up) leaves it, and every later start
# would wait on it forever.
STALE_LOCK_S = 600


def build_directory() -> Path:
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    key = f"{SOURCES[0].parent}|{sys.version_info[:2]}|{torch.__version__}"
    path = root / f"specserve_cpu-{hashlib.sha1(key.encode()).hexdigest()[:12]}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def clear_stale_lock(directory: Path, max_age_s: float = STALE_LOCK_S) -> None:
    lock = directory / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > max_age_s:
        logger.warning("removing a build lock %.0f s old (%s): its builder died", age, lock)
        lock.unlink(missing_ok=True)


@functools.cache
def cpu_ops():
    try:
        from torch.utils.cpp_extension import load
        directory = build_directory()
        clear_stale_lock(directory)
        load(name="specserve_cpu", sources=[str(s) for s in SOURCES], extra_cflags=CFLAGS,
             extra_ldflags=LDFLAGS, build_directory=str(directory), is_python_module=False, verbose=False)
    except Exception as exc:  # noqa: BLE001 - any build failure means: use the PyTorch path
        lines = str(exc).strip().splitlines()
        logger.warning("CPU kernels unavailable (%s); using the PyTorch path",
                       lines[-1] if lines else type(exc).__name__)
        return None
    return torch.ops.specserve_cpu


def build_paged_attention(source: str, name: str, directory: Path, extra_cflags: tuple[str, ...] = ()):
    """`source` (a paged_attention.cpp, this one or another commit's) compiled alone as the op
    library `name` in `directory`; returns its paged_attention_short. For benchmarks and tests
    that set builds side by side; the engine uses `cpu_ops()`."""
    from torch.utils.cpp_extension import load
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.cpp"
    path.write_text(source.replace("TORCH_LIBRARY(specserve_cpu,", f"TORCH_LIBRARY({name},"))
    load(name=name, sources=[str(path)], extra_cflags=[*CFLAGS, *extra_cflags], extra_ldflags=LDFLAGS,
         build_directory=str(directory), is_python_module=False, verbose=False)
    return getattr(torch.ops, name).paged_attention_short


def paged_attention_short():
    """The paged attention op for a few query tokens per sequence, or None."""
    ops = cpu_ops()
    return ops.paged_attention_short if ops is not None else None
