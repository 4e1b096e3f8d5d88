"""Swap a model's `nn.Linear` modules for another implementation in place, by a rule: how the
CPU path packs its weights for oneDNN (`specserve_kernels/cpu/packed_linear.py`) and how small CUDA
batches take the skinny kernel (`specserve_kernels/skinny_linear.py`)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def replace_linears(model: nn.Module, replacement: Callable[[str, nn.Linear], nn.Module],
                    wanted: Callable[[str, nn.Linear], bool]) -> int:
    """Replace every `nn.Linear` child for which `wanted(its attribute name, it)` holds with
    `replacement(its attribute name, it)`; returns how many."""
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and wanted(name, child):
                setattr(module, name, replacement(name, child))
                replaced += 1
    return replaced
