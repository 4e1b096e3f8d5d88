"""Each row's argmax, and a plain decode step's chosen tokens with it, as a CUDA graph's step
takes them: on CUDA in two Triton kernels (`specserve_kernels/argmax.py` says why), elsewhere in torch."""

from __future__ import annotations

import torch


def row_argmax(logits: torch.Tensor) -> torch.Tensor:
    """[R, V] -> [R] each row's first largest logit. On the CPU through `max`, whose index comes
    with its reduction: 1.1 against 1.9 ms for `argmax` at [256, 4096] on one thread
    (2026-11-27), the same index, ties and NaN included."""
    return logits.max(-1).indices if logits.device.type == "cpu" else logits.argmax(-1)


def argmax_and_choose(logits: torch.Tensor, argmax: torch.Tensor, temperature: torch.Tensor | None = None,
                      drawn: torch.Tensor | None = None, chosen: torch.Tensor | None = None) -> None:
    """logits [R, V] -> argmax [R]; given the rows' temperature and drawn tokens, chosen [R]:
    the draw where the temperature is above 0, else the argmax."""
    if logits.is_cuda:
        from specserve_kernels.argmax import argmax_rows
        argmax_rows(logits, argmax, temperature, drawn, chosen)
        return
    torch.argmax(logits, dim=-1, out=argmax)
    if drawn is not None:
        torch.where(temperature > 0, drawn, argmax, out=chosen)
