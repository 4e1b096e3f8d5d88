"""Programmatic dependent launch (PDL, sm_90 and later) for the decode step's Triton kernels.

Inside a decode step's CUDA graph the GPU idled 7.4% of a batch-1 step on an H100 (2026-11-26):
about 1.3 us at each of its ~370 kernel boundaries, if all of it lies there, since the next
kernel is launched only once the one before it has finished. A kernel launched with PDL may
be scheduled while its predecessor in the stream is still running; it then waits
(`gdc_wait`) for that kernel's completion and memory before its first load or store, so only
its launch and index arithmetic overlap the other's tail, and every result is what it was. It
also lets its own successor be scheduled early (`gdc_launch_dependents`), which only a
successor launched with PDL uses: cuBLAS's GEMMs between our kernels are launched as before.

On, where the GPU and Triton have it: on an H100 (2026-11-27, `benchmarks/ab_decode.py`, two
rounds alternated) batch-1 decode went from 161.2-161.3 to 163.7 tok/s (1.015x), and batch 256
moved within 0.3% either way (greedy 0.998x, sampled 1.003x). `--plain-launch` is the other
side of that A/B. The kernels compile both ways in CPU CI
(`tests/triton_kernels/hopper_compile.py --dependent-launch`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

ENABLED = True


@functools.cache
def _supports_dependent_launch(device_index: int) -> bool:
    """sm_90 or later, and a Triton that has the wait (3.4 on)."""
    return (torch.cuda.get_device_capability(device_index)[0] >= 9
            and hasattr(tl.extra.cuda, "gdc_wait"))


def dependent_launch_args(device: torch.device) -> dict:
    """A launch's PDL arguments: the kernel's DEPENDENT_LAUNCH constexpr (wait for the
    predecessor first) and, where it is on, Triton's launch option."""
    on = (ENABLED and device.type == "cuda"
          and _supports_dependent_launch(device.index if device.index is not None else torch.cuda.current_device()))
    return {"DEPENDENT_LAUNCH": True, "launch_pdl": True} if on else {"DEPENDENT_LAUNCH": False}


@triton.jit
def wait_for_predecessor(DEPENDENT_LAUNCH: tl.constexpr):
    """A PDL-launched kernel's first statement: nothing of the kernel before it may be read,
    nor its buffers written, before its completion; then our successor may be scheduled."""
    if DEPENDENT_LAUNCH:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
