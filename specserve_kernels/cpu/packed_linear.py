"""Linear layers with their weights packed once for oneDNN, for the fp32 CPU path.

`F.linear` goes to MKL's sgemm, which reorders the weight into its blocked layout on every
call; at decode batch sizes that reorder costs about as much as the product. Packing once at
load and calling oneDNN's linear on the packed weight is 1.2-1.4x faster at 8-256 rows with
one thread and 1.5-1.8x with two, on the default model's shapes (benchmarks/RESULTS.md,
2026-11-24). The product is the same up to fp32 summation order.
"""

from __future__ import annotations

import torch
from torch import nn

from specserve_kernels.replace_linears import replace_linears

# oneDNN picks the packed layout for a typical row count; any row count works with it.
ROWS_HINT = 64


def packing_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # An opaque oneDNN tensor, so a plain attribute: it is not a parameter or state.
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), ROWS_HINT)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def pack_linears(model: nn.Module) -> int:
    """Replace every fp32 `nn.Linear` in `model` with a `PackedLinear`; returns how many."""
    return replace_linears(model, lambda name, linear: PackedLinear(linear),
                           lambda name, linear: linear.weight.dtype == torch.float32)
