"""Host lists and arrays onto the step's device without waiting for the work queued there.

`torch.tensor(data, device="cuda")` copies synchronously: it waits for every kernel already
queued on the stream. With a step still running on the GPU (overlapped scheduling), the host
would stall behind it while preparing the next one. So the data goes through pinned memory
with a non-blocking copy (from pageable memory the driver may still wait for the stream); the
caching host allocator keeps the pinned block until the copy has run. On the CPU this is the
plain tensor.
"""

from __future__ import annotations

import numpy as np
import torch


def to_device(data, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    host = torch.from_numpy(data) if isinstance(data, np.ndarray) else torch.tensor(data, dtype=dtype)
    if dtype is not None and host.dtype != dtype:
        host = host.to(dtype)
    if torch.device(device).type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
