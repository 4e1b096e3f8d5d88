"""asyncio front of the engine: the step loop runs in a background thread and each request's
new tokens stream back to its caller's event loop as they come; outputs of several steps that
queued up before the caller read them go out as one chunk.

Cancelling a caller (a client that disconnects) aborts its request before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from typing import AsyncIterator

from app.config import EngineConfig
from app.engine.engine import EngineStats, LLMEngine
from app.engine.spec.proposal import Proposer
from app.outputs import EngineOverloaded, RequestOutput
from app.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class AsyncLLMEngine:
    def __init__(self, config: EngineConfig, proposer: Proposer | None = None):
        self.engine = LLMEngine(config, proposer)
        self._commands: queue.Queue = queue.Queue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stats = self.engine.stats()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specserve-engine", daemon=True)
        self._thread.start()

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def stats(self) -> EngineStats:
        """The figures as of the last step (read without locking the engine)."""
        return self._stats

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       guide=None) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs (following `guide`, a GuidedDecoder, when given); raises
        RequestRejected at once if it can never fit, EngineOverloaded if
        `max_num_waiting_requests` are already waiting."""
        self.engine.validate(prompt_token_ids, params)
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        cap = self.engine.config.max_num_waiting_requests
        if cap is not None and self.num_waiting() >= cap:
            raise EngineOverloaded(f"the server is overloaded: {cap} requests are already waiting "
                                   "for this model replica; retry later")
        stream: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._streams[request_id] = (loop, stream)
        self._commands.put(("add", request_id, prompt_token_ids, params, guide))
        interval = self.engine.config.stream_interval_ms / 1000
        finished = False
        next_chunk_at = 0.0  # the first chunk goes at once
        try:
            while not finished:
                out = await _next_chunk(stream, loop, next_chunk_at)
                if out.error is not None:
                    raise RuntimeError(out.error)
                finished = out.finished
                next_chunk_at = loop.time() + interval
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._commands.put(("abort", request_id))

    def num_waiting(self) -> int:
        """Requests accepted but not running as of the last step (queued commands included)."""
        return max(0, len(self._streams) - self._stats.num_requests_running)

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def shutdown(self) -> None:
        self._stopped.set()
        self._commands.put(("wake",))
        self._thread.join(timeout=10)

    # -- the engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped.is_set():
            self._apply_commands(block=not self.engine.has_unfinished_requests())
            if not self.engine.has_unfinished_requests():
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failed step fails its requests, not the replica
                logger.exception("engine step failed")
                outputs = self._fail_all(f"engine error: {exc}")
            self._stats = self.engine.stats()
            for out in outputs:
                self._deliver(out)

    def _apply_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
        self._stats = self.engine.stats()

    def _apply(self, command: tuple) -> None:
        if command[0] == "add":
            _, request_id, prompt, params, guide = command
            try:
                self.engine.add_request(request_id, prompt, params, guide)
            except ValueError as exc:
                self._deliver(RequestOutput(request_id, [], finished=True, error=str(exc)))
        elif command[0] == "abort":
            self.engine.abort_request(command[1])

    def _fail_all(self, message: str) -> list[RequestOutput]:
        outputs = []
        for request_id in list(self.engine.requests):
            self.engine.abort_request(request_id)
            outputs.append(RequestOutput(request_id, [], finished=True, finish_reason="abort", error=message))
        return outputs

    def _deliver(self, out: RequestOutput) -> None:
        target = self._streams.get(out.request_id)
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.put_nowait, out)


async def _next_chunk(stream: asyncio.Queue, loop: asyncio.AbstractEventLoop, not_before: float
                      ) -> RequestOutput:
    """The next output, merged with every later one already queued (steps the reader fell
    behind on) and, until `not_before` (loop time), with those still to come; a finished or
    failed output ends the chunk at once."""
    out: RequestOutput = await stream.get()
    while not out.finished and out.error is None:
        if not stream.empty():
            out = out.followed_by(stream.get_nowait())
            continue
        wait = not_before - loop.time()
        if wait <= 0:
            break
        try:
            out = out.followed_by(await asyncio.wait_for(stream.get(), wait))
        except asyncio.TimeoutError:
            break
    return out
