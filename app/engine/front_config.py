"""Settings of an engine's streaming front (app/engine/async_engine.py: what a target replica
runs in front of its engine), which the engine itself never reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrontConfig:
    # Engine requests (one per choice) allowed to wait for the running batch, per engine;
    # beyond it new ones are refused with EngineOverloaded (HTTP 429). None: no cap.
    max_num_waiting_requests: int | None = 128
    # At most one streamed chunk per request per this many ms after the first (0: every step):
    # fewer, larger chunks cost Serve less per token; the first and last are never held back.
    stream_interval_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.max_num_waiting_requests is not None and self.max_num_waiting_requests < 0:
            raise ValueError("max_num_waiting_requests must be >= 0 (or None: no cap)")
        if self.stream_interval_ms < 0:
            raise ValueError("stream_interval_ms must be >= 0")
