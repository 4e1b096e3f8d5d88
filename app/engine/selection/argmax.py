"""Each row's argmax, and a plain decode step's chosen tokens with it, as a CUDA graph's step
takes them: on CUDA in two Triton kernels (`kernels/argmax.py` says why), elsewhere in torch."""

from __future__ import annotations

import torch


def argmax_and_choose(logits: torch.Tensor, argmax: torch.Tensor, temperature: torch.Tensor | None = None,
                      drawn: torch.Tensor | None = None, chosen: torch.Tensor | None = None) -> None:
    """logits [R, V] -> argmax [R]; given the rows' temperature and drawn tokens, chosen [R]:
    the draw where the temperature is above 0, else the argmax."""
    if logits.is_cuda:
        from kernels.argmax import argmax_rows
        argmax_rows(logits, argmax, temperature, drawn, chosen)
        return
    torch.argmax(logits, dim=-1, out=argmax)
    if drawn is not None:
        torch.where(temperature > 0, drawn, argmax, out=chosen)
