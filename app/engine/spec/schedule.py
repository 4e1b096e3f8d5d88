"""Batch size -> number of draft tokens k.

Speculation trades spare compute for fewer memory-bound steps; as the batch grows the step
becomes compute-bound and verifying k extra positions per request costs more than it saves
(vLLM measured 1.4-1.8x slowdowns at high batch). So k shrinks with the batch and reaches 0
(speculation off) beyond a threshold. Config `{1: 4, 8: 3, 16: 2, 32: 0}` reads: batch 1-7
-> 4, 8-15 -> 3, 16-31 -> 2, 32 and above -> 0. Per-request opt-out is the caller's job (an
opted-out request gets k = 0 whatever the schedule says).
"""

from __future__ import annotations

import bisect
from typing import Any, Mapping

from app.engine.cuda_graphs import MultiTokenSteps

MAX_K = 64  # far beyond any useful k; larger values are config mistakes


class SpeculationSchedule:
    """Step function from the batch size (the requests running and those waiting to start) to k."""

    def __init__(self, thresholds: Mapping[int | str, int]):
        items = thresholds
        if not items:
            raise ValueError("speculation schedule is empty")
        parsed: dict[int, int] = {}
        for key, value in items.items():
            batch, k = _as_int(key, "batch size"), _as_int(value, "k")
            if batch < 1:
                raise ValueError(f"batch size thresholds must be >= 1, got {batch}")
            if not 0 <= k <= MAX_K:
                raise ValueError(f"k must be in [0, {MAX_K}], got {k} for batch >= {batch}")
            if batch in parsed:
                raise ValueError(f"batch size threshold {batch} given twice")
            parsed[batch] = k
        self.batch_sizes = sorted(parsed)
        self.ks = [parsed[b] for b in self.batch_sizes]
        if self.batch_sizes[0] != 1:
            raise ValueError("the smallest batch size threshold must be 1, so every batch has a k")
        # A k that grows with the batch is almost certainly a typo: speculation only pays less.
        if any(b > a for a, b in zip(self.ks, self.ks[1:])):
            raise ValueError(f"k must not increase with the batch size: {self.as_dict()}")

    @classmethod
    def default(cls, k: int, device_type: str = "cuda") -> SpeculationSchedule:
        """On a GPU: k while the batch is small, half of it from 8 requests, none from 32 (where
        verifying k extra positions per request costs more than the steps it saves). On a CPU a
        step is compute-bound from a handful of rows (benchmarks/RESULTS.md: 0.5x at batch 4-16),
        so speculation stops at 4."""
        if k == 0:
            return cls.disabled()
        if device_type == "cpu":
            return cls({1: k, 4: 0})
        return cls({1: k, 8: max(k // 2, 1), 32: 0})

    @classmethod
    def from_config(cls, config: Any, k: int, device_type: str = "cuda") -> SpeculationSchedule:
        """None -> `default(k, device_type)`; an int -> that k at every batch size; a mapping ->
        thresholds."""
        if config is None:
            return cls.default(k, device_type)
        if isinstance(config, bool):
            raise ValueError("speculation schedule must be a mapping or an int, not a bool")
        if isinstance(config, int):
            return cls({1: config})
        if isinstance(config, Mapping):
            return cls(config)
        raise ValueError(f"speculation schedule must be a mapping or an int, got {config!r}")

    @classmethod
    def of_engine(cls, config: Any) -> SpeculationSchedule:
        """The schedule an `EngineConfig` speculates under. A draft's config keeps the target's
        speculation fields, so the target and its draft read the same one."""
        return cls.from_config(config.speculation_schedule, config.num_speculative_tokens, config.torch_device.type)

    @classmethod
    def disabled(cls) -> SpeculationSchedule:
        return cls({1: 0})

    def k_for(self, batch_size: int) -> int:
        """k for a step with this many requests running or waiting to start (0 counts as 1)."""
        if batch_size < 0:
            raise ValueError(f"batch size must be >= 0, got {batch_size}")
        index = bisect.bisect_right(self.batch_sizes, max(batch_size, 1)) - 1
        return self.ks[index]

    @property
    def max_k(self) -> int:
        """Largest k ever used (what to size draft buffers and KV reservations for)."""
        return self.ks[0]

    def largest_drafting_batch(self, max_batch_size: int) -> int:
        """The largest batch size, up to `max_batch_size`, whose k is above 0 (0: none)."""
        first_off = next((b for b, k in zip(self.batch_sizes, self.ks) if k == 0), None)
        return max_batch_size if first_off is None else min(first_off - 1, max_batch_size)

    def multi_token_steps(self, extra_tokens: int, max_batch_size: int, every_row_sampled: bool = True
                          ) -> MultiTokenSteps | None:
        """The steps of max_k + `extra_tokens` query tokens per sequence, at the batch sizes this
        schedule drafts at, that get CUDA graphs (None: it never drafts)."""
        if self.max_k == 0:
            return None
        return MultiTokenSteps(self.max_k + extra_tokens, self.largest_drafting_batch(max_batch_size),
                               every_row_sampled)

    def as_dict(self) -> dict[int, int]:
        return dict(zip(self.batch_sizes, self.ks))

    def __repr__(self) -> str:
        return f"SpeculationSchedule({self.as_dict()})"


def _as_int(value: Any, what: str) -> int:
    """YAML/JSON keys may arrive as strings ("8"); floats and bools are rejected."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise ValueError(f"{what} must be an integer, got {value!r}")
