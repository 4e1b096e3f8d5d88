"""The one device-to-host copy of a step's selection, in one place so it can be counted."""

from __future__ import annotations

import torch


def to_host(payload: torch.Tensor) -> torch.Tensor:
    """Copy the step's chosen tokens, accepted counts and asked-for logprobs to the host (one
    synchronising copy; on the CPU path a no-op)."""
    return payload.to("cpu")
