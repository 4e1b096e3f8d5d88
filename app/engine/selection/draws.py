"""Random draws keyed by (key, position, stream), computed with tensor ops where the logits are.

A counter-based hash (splitmix64's finaliser) turns each key into its uniform: no generator
state, no host round trip, the same number on the CPU and on CUDA, and nothing that could not
be replayed inside a CUDA graph. A seeded request keys its draws by (seed, position of the
token being chosen), so its tokens are the same alone or in any batch, and after preemption.
"""

from __future__ import annotations

import numpy as np
import torch

# 64-bit odd constants as signed int64 (torch has no uint64 arithmetic; products wrap).
_GOLDEN = -7046029254386353131  # 0x9e3779b97f4a7c15
_MIX1 = -4658895280553007687  # 0xbf58476d1ce4e5b9
_MIX2 = -7723592293110705685  # 0x94d049bb133111eb
_STREAM = -3335678366873096957  # 0xd1b54a32d192ed03

ACCEPT, SAMPLE = 0, 1  # the two draws a row may use: accept its draft, sample its token
REDRAW = 2  # the first stream of a row's redraws (top-p by rejection, draw.py)
DRAW_ROUNDS = 8  # uniforms per sampled row: its first draw, up to 6 redraws, the nucleus's draw


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: a bijection on 64 bits that scatters every input bit."""
    x = x ^ _shift_right(x, 30)
    x = x * _MIX1
    x = x ^ _shift_right(x, 27)
    x = x * _MIX2
    return x ^ _shift_right(x, 31)


def uniforms(key: torch.Tensor, position: torch.Tensor, stream: int | torch.Tensor) -> torch.Tensor:
    """float64 uniforms in [0, 1), one per element of the int64 tensors `key` and `position`
    (and `stream`, when a tensor: all three broadcast)."""
    h = mix64(mix64(key + _GOLDEN) + position * _STREAM + stream * _GOLDEN)
    return _shift_right(h, 11).double() * 2.0**-53


def sample_uniforms(key: torch.Tensor, position: torch.Tensor, count: int) -> torch.Tensor:
    """[R, count]: each row's SAMPLE uniform, then count - 1 for its redraws."""
    streams = torch.cat([torch.full((1,), SAMPLE, device=key.device),
                         torch.arange(REDRAW, REDRAW + count - 1, device=key.device)])
    return uniforms(key[:, None], position[:, None], streams[None, :])


def host_sample_uniforms(key: np.ndarray, position: np.ndarray, count: int) -> np.ndarray:
    """`sample_uniforms` on the host, bit for bit (numpy's uint64 arithmetic wraps as torch's
    int64 does): for a CUDA graph that draws, whose inputs cross in one copy."""
    with np.errstate(over="ignore"):
        k = key.astype(np.int64).view(np.uint64)[:, None]
        pos = position.astype(np.int64).view(np.uint64)[:, None]
        streams = np.array([SAMPLE] + list(range(REDRAW, REDRAW + count - 1)), dtype=np.uint64)[None, :]
        h = _mix64_array(_mix64_array(k + np.uint64(_GOLDEN % 2**64)) + pos * np.uint64(_STREAM % 2**64)
                         + streams * np.uint64(_GOLDEN % 2**64))
        return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


def _mix64_array(x: np.ndarray) -> np.ndarray:
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
