"""Host lists and arrays onto the step's device without waiting for the work queued there.

`torch.tensor(data, device="cuda")` copies synchronously: it waits for every kernel already
queued on the stream. With a step still running on the GPU (overlapped scheduling), the host
would stall behind it while preparing the next one. A non-blocking copy only stages the data.
On the CPU this is the plain tensor.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(data, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    host = torch.from_numpy(data) if isinstance(data, np.ndarray) else torch.tensor(data, dtype=dtype)
    if dtype is not None and host.dtype != dtype:
        host = host.to(dtype)
    return host.to(device, non_blocking=True)
