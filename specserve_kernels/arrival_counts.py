"""Counts for "the last program to arrive finishes the work": a kernel whose programs each
write part of a result adds 1 to its unit's count when its part is written, and the program
that brings the count to the number of parts reads them all back, finishes the unit, and puts
the count back to zero. One kernel instead of a kernel and a reduction after it (a launch and
a kernel boundary fewer); the parts are read in their order, so the bits do not depend on
which program came last.

Users: split-K in `specserve_kernels/skinny_linear.py`, the decode merge in `specserve_kernels/decode_attention.py`.
The counts live as long as the process, zeroed once, so that a CUDA graph replays with the
buffer it captured; kernels that use them run on one stream (two launches at once would share
them), as the engine's do.
"""

from __future__ import annotations

import torch

_COUNTS: dict[torch.device, torch.Tensor] = {}
_OUTGROWN: list[torch.Tensor] = []  # kept: graphs captured before a growth still replay with them


def arrival_counts(device: torch.device, units: int) -> torch.Tensor:
    """At least `units` zeroed int32 counts on `device`, left zeroed by the kernels that use
    them. Grown outside CUDA-graph capture only (the first launch of a shape runs before its
    capture, as Triton's compile needs), and never freed."""
    counts = _COUNTS.get(device)
    if counts is None or counts.numel() < units:
        assert device.type != "cuda" or not torch.cuda.is_current_stream_capturing(), \
            "the arrival counts must exist before a CUDA graph captures them"
        if counts is not None:
            _OUTGROWN.append(counts)
        counts = _COUNTS[device] = torch.zeros(max(units, 4096), dtype=torch.int32, device=device)
    return counts
