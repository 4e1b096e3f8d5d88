"""The counts by which a kernel's last program finishes a unit (specserve_kernels/arrival_counts.py)."""

import torch

from specserve_kernels.arrival_counts import _COUNTS, _OUTGROWN, arrival_counts


def test_the_arrival_counts_grow_without_freeing_what_a_graph_may_hold():
    """A CUDA graph captured before the counts grew replays with the old buffer: it must stay
    allocated (and zeroed, which the kernels leave it)."""
    device = torch.device("meta")
    small = arrival_counts(device, 10)
    assert arrival_counts(device, 10) is small and small.numel() >= 10
    grown = arrival_counts(device, small.numel() + 1)
    assert grown is _COUNTS[device] and grown.numel() > small.numel() and any(t is small for t in _OUTGROWN)
