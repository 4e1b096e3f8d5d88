"""asyncio fronts of the engine: each request's new tokens stream back to its caller's event loop
as they come; outputs of several steps that queued up before the caller read them go out as one
chunk. Cancelling a caller (a client that disconnects) aborts its request before the next step.

`AsyncEngineFront` is that streaming side; where the step loop (app/engine/core_loop.py) runs is
the subclass's business: `AsyncLLMEngine` runs it in a thread of this process (offline use,
tests, the benchmark's engine-alone baseline), `EngineProcess` (app/engine/engine_process.py)
in a process of its own, which is what a TargetModel replica uses.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import OrderedDict, defaultdict
from typing import AsyncIterator

from outlines_core import Index

from app.config import EngineConfig
from app.engine.core_loop import CoreLoop
from app.engine.engine import LLMEngine
from app.engine.engine_stats import EngineStats
from app.engine.front_config import FrontConfig
from app.engine.messages import (AbortRequest, AddRequest, CacheReport, Command, DropFormat, FormatIndex,
                                 ReportCache, Stop)
from app.engine.request_limits import RequestLimits
from app.engine.spec.proposal import Proposer
from app.guided.output_format import OutputFormat
from app.outputs import EngineDied, EngineOverloaded, RequestOutput
from app.sampling_params import SamplingParams

MAX_FORMATS_IN_CORE = 64  # output formats the core keeps; the front drops the oldest beyond


class AsyncEngineFront:
    """Subclasses set `limits` and `_stats`, and implement `_submit` (hand a core-loop command
    over)."""

    limits: RequestLimits
    error: str | None = None  # set when the engine is gone for good (then every call raises EngineDied)

    def __init__(self, config: EngineConfig, front: FrontConfig):
        self.config = config
        self.front = front
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stats: EngineStats | None = None
        self._formats_in_core: OrderedDict[OutputFormat, None] = OrderedDict()
        self.formats_sent = 0  # FormatIndex commands: one per format the core lacked
        self._cache_report: tuple[asyncio.AbstractEventLoop, asyncio.Future] | None = None

    @property
    def max_model_len(self) -> int:
        return self.limits.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.limits.vocab_size

    def stats(self) -> EngineStats:
        """The figures as of the last step (read without locking the engine)."""
        return self._stats

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                       output_format: OutputFormat | None = None, index: Index | None = None
                       ) -> AsyncIterator[RequestOutput]:
        """Stream the request's outputs (following `output_format`, whose compiled `index` comes
        with it, when given); raises RequestRejected at once if it can never fit,
        EngineOverloaded if `max_num_waiting_requests` are already waiting."""
        self.limits.check(prompt_token_ids, params)
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        cap = self.front.max_num_waiting_requests
        if cap is not None and self.num_waiting() >= cap:
            raise EngineOverloaded(f"the server is overloaded: {cap} requests are already waiting "
                                   "for this model replica; retry later")
        if output_format is not None:
            self._send_format(output_format, index)
        stream: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._streams[request_id] = (loop, stream)
        self._submit(AddRequest(request_id, prompt_token_ids, params, output_format))
        interval = self.front.stream_interval_ms / 1000
        finished = False
        next_chunk_at = 0.0  # the first chunk goes at once
        try:
            while not finished:
                out = await _next_chunk(stream, loop, next_chunk_at)
                if out.error is not None:
                    raise (EngineDied if self.error is not None else RuntimeError)(out.error)
                finished = out.finished
                next_chunk_at = loop.time() + interval
                yield out
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._submit(AbortRequest(request_id))

    async def cache_report(self, max_blocks: int) -> CacheReport:
        """What the KV pool holds (app/engine/messages.py: CacheReport); callers that ask while
        an answer is on its way share it."""
        if self.error is not None:
            raise EngineDied(self.error)
        if self._cache_report is None or self._cache_report[1].done():
            loop = asyncio.get_running_loop()
            self._cache_report = (loop, loop.create_future())
            self._submit(ReportCache(max_blocks))
        return await asyncio.shield(self._cache_report[1])

    def _answer(self, report: CacheReport | EngineDied) -> None:
        """From the core's side (any thread): the answer to `ReportCache`, or why none comes."""
        if self._cache_report is not None:
            loop, future = self._cache_report
            loop.call_soon_threadsafe(_resolve, future, report)

    def num_waiting(self) -> int:
        """Requests accepted but not running as of the last step (queued commands included)."""
        running = self._stats.num_requests_running if self._stats is not None else 0
        return max(0, len(self._streams) - running)

    def shutdown(self) -> None:
        raise NotImplementedError

    def _submit(self, command: Command) -> None:
        raise NotImplementedError

    def _send_format(self, output_format: OutputFormat, index: Index) -> None:
        """The format's index goes to the core before its first request, and again only after
        the core dropped it (app/engine/core_loop.py)."""
        if output_format in self._formats_in_core:
            self._formats_in_core.move_to_end(output_format)
            return
        self._submit(FormatIndex(output_format, index))
        self.formats_sent += 1
        self._formats_in_core[output_format] = None
        while len(self._formats_in_core) > MAX_FORMATS_IN_CORE:
            oldest, _ = self._formats_in_core.popitem(last=False)
            self._submit(DropFormat(oldest))

    def _publish(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        """From the core's side (any thread): new figures, and each output to its stream, with
        one wake-up per event loop however many requests the step served."""
        self._stats = stats
        by_loop: dict[asyncio.AbstractEventLoop, list] = defaultdict(list)
        for out in outputs:
            target = self._streams.get(out.request_id)
            if target is not None:
                by_loop[target[0]].append((target[1], out))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # that caller's loop has closed: nobody is reading
                pass


class AsyncLLMEngine(AsyncEngineFront):
    """The engine and its step loop in a background thread of this process."""

    def __init__(self, config: EngineConfig, proposer: Proposer | None = None, front: FrontConfig = FrontConfig()):
        super().__init__(config, front)
        self.engine = LLMEngine(config, proposer)
        self.limits = self.engine.limits
        self._stats = self.engine.stats()
        self._commands: queue.Queue = queue.Queue()
        self._loop = CoreLoop(self.engine, self._receive, self._publish, self._answer)
        self._thread = threading.Thread(target=self._loop.run, name="specserve-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._submit(Stop())
        self._thread.join(timeout=10)

    def _submit(self, command: Command) -> None:
        self._commands.put(command)

    def _receive(self, timeout: float) -> Command | None:
        try:
            return self._commands.get(timeout=timeout) if timeout > 0 else self._commands.get_nowait()
        except queue.Empty:
            return None


def _resolve(future: asyncio.Future, value) -> None:
    if not future.done():
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for stream, out in items:
        stream.put_nowait(out)


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
