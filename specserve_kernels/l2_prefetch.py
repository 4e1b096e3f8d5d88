"""The next projection's weights asked into L2 while a small kernel runs, so that the memory
streams them during the step's short, latency-bound kernels instead of idling there.

At batch 1 a decode step reads ~15 GB of weights at ~94% of copy inside its GEMMs, but between
them come kernels that move almost nothing: in the decode_b1 trace (H100, 2026-11-27) RMSNorm
2.1 us, rotary with the KV write 2.5 us and decode attention 7.8 us a layer, ~16 us of a ~185 us
layer in which the memory is nearly idle. o_proj's 32 MiB is ~11 us at the copy's rate, about
the time from rotary's start to o_proj's. So the kernel before such a window takes some extra
programs that each issue `cp.async.bulk.prefetch.L2.global` (sm_90) over their share of the
next weight, and exit: the copy engine then fills L2 while the window's kernels run, and the
GEMM after it finds those lines there. Nothing is written and nothing waits on it, so every
result is bit for bit what it was; only the time can change.

Which kernels issue what (`app.models.layer_ops.TritonLayerOps`): the RMSNorm before qkv_proj,
gate_up_proj and the lm_head prefetches their weights, and rotary with the KV write o_proj's.
While it is on, decode attention marks its K/V lines first out of L2 (each is read once a step):
at batch 256 it streams ~143 MB a layer between rotary and o_proj, which would otherwise push
o_proj's prefetched lines out of a 50 MB L2 before o_proj reads them. Off by default
(`ENABLED`) until a GPU times it (`benchmarks/ab_decode.py --prefetch-weights`). Each prefetch
is capped by its window's `MAX_BYTES`: ~2 us of a norm before qkv_proj or gate_up_proj, ~10 us
of rotary and attention before o_proj. A prefetch larger than its window only helps if L2
still holds the lines when the GEMM reaches them (~50 MB of L2 on an H100).

The prefetching programs need sm_90 (the bulk prefetch): before Hopper a launch gets none.
Under Triton's interpreter (the CPU tests) they compute their ranges but issue nothing.
"""

from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

ENABLED = False
# By window: what a prefetch issued there may ask for (32 MiB: o_proj's weights of Llama-3-8B
# in bf16, whole; ~11 us at an H100's copy rate)
MAX_BYTES = {"attention": 32 << 20, "norm": 32 << 20}
PROGRAMS = 64  # spread over SMs: one SM's copy engine alone would issue the lines too slowly
ALIGN = 16  # the bulk prefetch's unit: its address and size are multiples of 16 bytes
ISSUE = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")  # the interpreter runs no PTX


class Prefetch(NamedTuple):
    """What a launch prefetches: the weight, how many of its first bytes, and how many
    programs issue them (0: none)."""

    weight: torch.Tensor | None
    nbytes: int
    programs: int


NO_PREFETCH = Prefetch(None, 0, 0)


@functools.cache
def _has_bulk_prefetch(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def prefetch_for(weight: torch.Tensor | None, window: str) -> Prefetch:
    """What a kernel before `weight`'s product should prefetch of it: its first bytes up to the
    window's MAX_BYTES ("attention", "norm"), in PROGRAMS extra programs; NO_PREFETCH where it
    is off or cannot run."""
    if (weight is None or not ENABLED or weight.device.type != "cuda" or not weight.is_contiguous()
            or weight.data_ptr() % ALIGN):
        return NO_PREFETCH
    index = weight.device.index if weight.device.index is not None else torch.cuda.current_device()
    if not _has_bulk_prefetch(index):
        return NO_PREFETCH
    nbytes = min(weight.numel() * weight.element_size(), MAX_BYTES[window]) // ALIGN * ALIGN
    return Prefetch(weight, nbytes, PROGRAMS) if nbytes else NO_PREFETCH


def launch_args(prefetch: Prefetch, fallback: torch.Tensor, num_warps: int) -> tuple[tuple, dict]:
    """A kernel's prefetch arguments (pointer, bytes) and its PREFETCH_LANES constexpr: a range
    for each of a program's threads (no two threads asking for the same lines), 0 without a
    prefetch. `fallback` stands in for the pointer where there is none (never read)."""
    weight = fallback if prefetch.weight is None else prefetch.weight
    return (weight, prefetch.nbytes), {"PREFETCH_LANES": 32 * num_warps if prefetch.programs else 0}


@triton.jit
def prefetch_ranges(nbytes, share, shares, LANES: tl.constexpr):
    """Share `share` of `shares`' ranges of [0, nbytes): LANES (offset, size) pairs, each a
    multiple of 16 bytes, sizes 0 past the end; together the shares cover it once."""
    chunk = tl.cdiv(tl.cdiv(nbytes, shares * LANES), 16) * 16
    offsets = (share * LANES + tl.arange(0, LANES)).to(tl.int64) * chunk
    sizes = tl.minimum(tl.maximum(nbytes - offsets, 0), chunk).to(tl.int32)
    return offsets, sizes


@triton.jit
def prefetch_share(weight_ptr, nbytes, share, shares, LANES: tl.constexpr):
    """Ask L2 for this program's ranges of the weight's first `nbytes` (a kernel's prefetching
    program's whole work: nothing is read back, so it never waits)."""
    offsets, sizes = prefetch_ranges(nbytes, share, shares, LANES)
    if ISSUE:
        addresses = weight_ptr.to(tl.pointer_type(tl.int8), bitcast=True) + offsets
        tl.inline_asm_elementwise(
            "{ .reg .pred p; setp.gt.s32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
            "=r,l,r", [addresses, sizes], dtype=tl.int32, is_pure=False, pack=1)
