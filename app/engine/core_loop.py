"""The engine's step loop: apply the commands that came in (waiting for one when idle), step,
publish the step's outputs with the engine's figures.

The same loop runs in a thread beside its caller's event loop (`AsyncLLMEngine`) and in a
process of its own (`EngineProcess`); only where commands come from and where outputs go
differ. Commands are the typed records of app/engine/messages.py: `AddRequest`,
`AbortRequest`, `Stop`, `ReportCache` (answered with a `CacheReport` through `answer`), and
`FormatIndex` / `DropFormat`, which the front sends before a format's first request / when it
forgets one. The loop keeps a `CompiledFormat` per format
over the engine's vocabulary (built once, on the first format: `LLMEngine.guided_vocabulary`)
and starts each guided request's `GuidedDecoder` from it.
"""

from __future__ import annotations

import logging
from typing import Callable

from app.engine.engine import LLMEngine
from app.engine.engine_stats import EngineStats
from app.engine.messages import (AbortRequest, AddRequest, CacheReport, Command, DropFormat, FormatIndex,
                                 ReportCache, Stop)
from app.guided.guide import CompiledFormat
from app.guided.output_format import OutputFormat
from app.outputs import RequestOutput

logger = logging.getLogger(__name__)

IDLE_WAIT_S = 0.5  # how long an idle loop waits for a command before checking `stopped` again


class CoreLoop:
    """`receive(timeout)`: the next command, or None if none came within `timeout` seconds (0:
    do not wait). `publish(outputs, stats)`: called after every step, and after commands that
    were not followed by a step (so the figures a caller reads are never older than that).
    `answer(report)`: where a `CacheReport` goes."""

    def __init__(self, engine: LLMEngine, receive: Callable[[float], Command | None],
                 publish: Callable[[list[RequestOutput], EngineStats], None],
                 answer: Callable[[CacheReport], None]):
        self.engine = engine
        self.receive = receive
        self.publish = publish
        self.answer = answer
        self.stopped = False
        self.formats: dict[OutputFormat, CompiledFormat] = {}

    def run(self) -> None:
        while not self.stopped:
            applied = self._apply_commands(wait=not self.engine.has_unfinished_requests())
            if self.stopped:
                break
            if not self.engine.has_unfinished_requests():
                if applied:
                    self.publish([], self.engine.stats())
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failed step fails its requests, not the replica
                logger.exception("engine step failed")
                outputs = self._fail_all(f"engine error: {exc}")
            self.publish(outputs, self.engine.stats())

    def _apply_commands(self, wait: bool) -> bool:
        command = self.receive(IDLE_WAIT_S if wait else 0)
        applied = False
        while command is not None:
            self.apply(command)
            applied = True
            if self.stopped:
                break
            command = self.receive(0)
        return applied

    def apply(self, command: Command) -> None:
        match command:
            case AddRequest(request_id, prompt_token_ids, params, output_format):
                try:
                    self.engine.add_request(request_id, prompt_token_ids, params, self._decoder(output_format))
                except ValueError as exc:
                    self.publish([RequestOutput(request_id, [], finished=True, error=str(exc))],
                                 self.engine.stats())
            case FormatIndex(output_format, index):
                self.formats[output_format] = CompiledFormat(index, self.engine.guided_vocabulary)
            case DropFormat(output_format):
                self.formats.pop(output_format, None)
            case AbortRequest(request_id):
                self.engine.abort_request(request_id)
            case ReportCache(max_blocks):
                pool = self.engine.block_manager
                self.answer(CacheReport(pool.block_size, pool.cached_block_hashes(max_blocks)))
            case Stop():
                self.stopped = True
            case _:
                raise ValueError(f"unknown engine command {command!r}")

    def _decoder(self, output_format: OutputFormat | None):
        """A fresh GuidedDecoder for a request that follows `output_format`, else None."""
        if output_format is None:
            return None
        compiled = self.formats.get(output_format)
        if compiled is None:  # the front sends a format before its first request: a bug
            raise ValueError("the request's output format never reached the engine")
        return compiled.decoder(self.engine.model_config.vocab_size)

    def _fail_all(self, message: str) -> list[RequestOutput]:
        outputs = []
        for request_id in self.engine.request_ids:
            self.engine.abort_request(request_id)
            outputs.append(RequestOutput(request_id, [], finished=True, finish_reason="abort", error=message))
        return outputs
