"""The one device-to-host copy of a step's selection, in one place so it can be counted."""

from __future__ import annotations

import torch


class HostCopy:
    """A step's payload on its way to the host. On CUDA: a non-blocking copy into pinned memory
    with an event recorded behind it, so that waiting for it waits for this step's work only,
    not for a step launched after it (overlapped scheduling). On the CPU: a copy of the payload,
    which may be a view of a buffer the next step writes (a CUDA graph's, run eagerly in tests)."""

    def __init__(self, payload: torch.Tensor):
        self.event = None
        if payload.is_cuda:
            self.tensor = torch.empty(payload.shape, dtype=payload.dtype, pin_memory=True)
            self.tensor.copy_(payload, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.tensor = payload.clone()

    def wait(self) -> torch.Tensor:
        if self.event is not None:
            self.event.synchronize()
        return self.tensor


def to_host(payload: torch.Tensor) -> HostCopy:
    """Start copying the step's chosen tokens, accepted counts and asked-for logprobs to the host."""
    return HostCopy(payload)
