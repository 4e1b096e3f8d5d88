"""Random draws keyed by (key, position, stream), computed on the host and sent with the step.

A counter-based hash (splitmix64's finaliser) turns each key into its uniform: no generator
state, the same number whatever the device, and for a CUDA graph, inputs like any other. A
seeded request keys its draws by (seed, position of the token being chosen), so its tokens are
the same alone or in any batch, and after preemption.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from app.engine.to_device import to_device

# 64-bit odd constants: the key's offset and the weights of a position and a stream
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_STREAM = np.uint64(0xD1B54A32D192ED03)

ACCEPT, SAMPLE = 0, 1  # the two draws a row may use: accept its draft, sample its token
REDRAW = 2  # the first stream of a row's redraws (top-p by rejection, draw.py)
DRAW_ROUNDS = 8  # uniforms per sampled row: its first draw, up to 6 redraws, the nucleus's draw
DRAW_STREAMS = (SAMPLE,) + tuple(range(REDRAW, REDRAW + DRAW_ROUNDS - 1))  # a row's token: its draw, then redraws
ROW_STREAMS = DRAW_STREAMS + (ACCEPT,)  # every uniform a sampled row may use in a step


@dataclass
class RowUniforms:
    """A step's uniforms on the logits' device, a row per logits row, computed on the host
    (`host_uniforms`) and sent in one copy."""
    streams: torch.Tensor  # [R, len(ROW_STREAMS)] float64

    @classmethod
    def of(cls, key: np.ndarray, position: np.ndarray, device: torch.device) -> RowUniforms:
        return cls(to_device(host_uniforms(key, position), device, torch.float64))

    @property
    def draw(self) -> torch.Tensor:
        """[R, DRAW_ROUNDS]: a row's token's draw, then its redraws (`draw.py`)."""
        return self.streams[:, :DRAW_ROUNDS]

    @property
    def accept(self) -> torch.Tensor:
        """[R]: whether to accept the row's draft (`verify.py`)."""
        return self.streams[:, DRAW_ROUNDS]

    def rows(self, index: torch.Tensor) -> RowUniforms:
        return RowUniforms(self.streams[index])


def host_uniforms(key: np.ndarray, position: np.ndarray, streams: tuple[int, ...] = ROW_STREAMS
                  ) -> np.ndarray:
    """[R, len(streams)] float64 uniforms in [0, 1), one per row (int64 key and position) and
    stream: the hash's top 53 bits (uint64 arithmetic, which wraps). On the host, a step's
    hashes cost a few numpy calls instead of ~20 tensor ops (25 against 90 us for one row on one
    CPU thread, 2026-11-27), and a CUDA graph that draws reads them from its one input copy."""
    with np.errstate(over="ignore"):
        k = key.astype(np.int64).view(np.uint64)[:, None]
        pos = position.astype(np.int64).view(np.uint64)[:, None]
        stream = np.array(streams, dtype=np.int64).view(np.uint64)[None, :]
        h = _mix64_array(_mix64_array(k + _GOLDEN) + pos * _STREAM + stream * _GOLDEN)
        return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _mix64_array(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection on 64 bits that scatters every input bit."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _mix64_host(x: int) -> int:
    m = 2**64 - 1
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & m
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def request_key(seed: int) -> int:
    """A user's seed as an int64 key."""
    return seed & (2**63 - 1)


def step_key(seed: int, step: int) -> int:
    """The key of unseeded requests' draws in one engine step (their rows differ by position).
    Negative, so it never equals a seeded request's key."""
    return (_mix64_host((seed * 0x9E3779B97F4A7C15 + step) & (2**64 - 1)) >> 1) - 2**63
