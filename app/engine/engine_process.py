"""The engine in a process of its own, behind the same streaming front as `AsyncLLMEngine`.

Why: in one process the engine's step thread and the replica's event loop (which pickles and
sends every streamed chunk) take turns on one GIL, and the engine waits for each turn; on 2
CPU cores that was about a tenth of its time (benchmarks/RESULTS.md). In its own process the
step loop never waits for the front's Python. This is how vLLM runs its engine core too.

The child is `python -m app.engine.engine_process <fd>`, talking over one socket pair with
the pickled records of app/engine/messages.py. Front → child: `StartEngine`, then the core
loop's commands, among them `FormatIndex` before the first request of an output format and
`DropFormat` when the front forgets one, so a format's index crosses once, not per request
(`AsyncEngineFront._send_format`); the child builds the guided vocabulary itself, once, from
the engine's tokenizer. Child → front: `EngineReady` (or `EngineFailed`) once, then
`StepOutputs` per step, `CacheReport` when the front asked with `ReportCache`, and
`FindDraftChannel` or `ProposeDrafts` when the engine wants drafts: a Serve handle lives in the
front, so the front finds the draft replica whose channel the engine then calls directly
(app/engine/spec/draft_channel.py), or proposes through Serve itself while there is none. The
front answers `DraftChannelFound` or `Drafts`; the child keeps commands that arrive meanwhile
for after the step.

If the child dies, every open stream ends with an error and `error` says why (a TargetModel
then fails its health check and Serve replaces it); if the front dies, the child reads the end
of the socket and exits.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import traceback
from collections import deque
from multiprocessing.connection import Connection

from app.config import EngineConfig
from app.engine.async_engine import AsyncEngineFront
from app.engine.core_loop import CoreLoop
from app.engine.engine import LLMEngine
from app.engine.engine_stats import EngineStats
from app.engine.front_config import FrontConfig
from app.engine.messages import (AddRequest, CacheReport, Command, DraftChannelFound, Drafts, EngineFailed,
                                 EngineReady, FindDraftChannel, ProposeDrafts, StartEngine, StepOutputs, Stop)
from app.engine.spec.draft_channel import DirectDraftProposer, DraftChannelAddress
from app.engine.spec.proposal import DraftInput, Proposal, Proposer
from app.outputs import EngineDied, RequestOutput

logger = logging.getLogger(__name__)


class EngineProcess(AsyncEngineFront):
    """Start the child, wait until its engine is built (the model is loaded), then stream.
    `proposer`: the engine's draft proposer, called here on the child's behalf."""

    def __init__(self, config: EngineConfig, proposer: Proposer | None = None,
                 front: FrontConfig = FrontConfig(), startup_timeout_s: float = 600.0):
        super().__init__(config, front)
        self.proposer = proposer
        self._closing = False
        self._send_lock = threading.Lock()
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "app.engine.engine_process", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), env=child_environment(os.environ, sys.path))
        theirs.close()
        self._conn = Connection(ours.detach())
        self._send(StartEngine(config, proposer is not None))
        ready = self._await_ready(startup_timeout_s)
        self.limits, self._stats = ready.limits, ready.stats
        self._reader = threading.Thread(target=self._read, name="specserve-engine-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._process.pid

    def shutdown(self) -> None:
        self._closing = True
        try:
            self._send(Stop())
            self._process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait()
        self._conn.close()

    # -- the front's side ---------------------------------------------------------------------
    def _await_ready(self, timeout_s: float) -> EngineReady:
        try:
            if not self._conn.poll(timeout_s):
                raise TimeoutError(f"the engine process did not start within {timeout_s:.0f} s")
            message = self._conn.recv()
        except (EOFError, OSError):
            code = self._process.wait()
            raise RuntimeError(f"the engine process exited during start-up (exit code {code})") from None
        except TimeoutError:
            self._process.kill()
            raise
        if not isinstance(message, EngineReady):
            self._process.wait()
            raise RuntimeError(f"the engine failed to start:\n{message.traceback}")
        return message

    def _send(self, message) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _submit(self, command: Command) -> None:
        if self.error is not None:
            if isinstance(command, AddRequest):
                raise EngineDied(self.error)
            return  # nothing to abort in a dead engine
        try:
            self._send(command)
        except OSError:
            if isinstance(command, AddRequest):
                raise EngineDied("the engine process is gone") from None

    def _read(self) -> None:
        try:
            while True:
                match self._conn.recv():
                    case StepOutputs(outputs, stats):
                        self._publish(outputs, stats)
                    case ProposeDrafts(inputs):
                        self._propose(inputs)
                    case FindDraftChannel():
                        self._find_draft_channel()
                    case CacheReport() as report:
                        self._answer(report)
        except (EOFError, OSError):
            pass
        if not self._closing:
            self._core_exited()

    def _propose(self, inputs: list[DraftInput]) -> None:
        try:
            answer = Drafts(self.proposer.propose_batch(inputs))
        except Exception as exc:  # noqa: BLE001 - the engine counts it and decodes without drafts
            answer = Drafts(None, f"{type(exc).__name__}: {exc}")
        try:
            self._send(answer)
        except OSError:
            pass

    def _find_draft_channel(self) -> None:
        find = getattr(self.proposer, "find_draft_channel", None)
        try:
            address = find() if find is not None else None
        except Exception:  # noqa: BLE001 - the engine goes on proposing through this front
            logger.warning("finding a draft channel failed", exc_info=True)
            address = None
        try:
            self._send(DraftChannelFound(address))
        except OSError:
            pass

    def _core_exited(self) -> None:
        try:
            code = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # it closed its end but hangs: it is of no use now
            self._process.kill()
            code = self._process.wait()
        self.error = f"the engine process exited unexpectedly (exit code {code})"
        logger.error(self.error)
        failed = [RequestOutput(rid, [], finished=True, finish_reason="abort", error=self.error)
                  for rid in list(self._streams)]
        self._publish(failed, self._stats)
        self._answer(EngineDied(self.error))


HUGE_PAGES_TUNABLE = "glibc.malloc.hugetlb=1"


def child_environment(parent: dict, path: list[str]) -> dict:
    """The parent's environment, with its import path, and glibc's malloc asked to back its large
    chunks with transparent huge pages (where THP is `madvise` or `always`; glibc < 2.35 ignores
    the tunable): a step reads all the weights and every running sequence's KV, tens of MB on
    4 KiB pages, and the TLB misses cost about 5% of a decode step on the CPU
    (benchmarks/RESULTS.md). A `GLIBC_TUNABLES` the user set is kept."""
    env = {**parent, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":") if t]
    if not any(t.startswith("glibc.malloc.hugetlb=") for t in tunables):
        tunables.append(HUGE_PAGES_TUNABLE)
    env["GLIBC_TUNABLES"] = ":".join(tunables)
    return env


# -- the child's side -------------------------------------------------------------------------
class _ProposerInFront:
    """The child engine's way to the proposer the front holds: asks the front and waits."""

    def __init__(self, conn: Connection, pending: deque):
        self.conn = conn
        self.pending = pending  # commands that arrive while waiting, for the core loop

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        answer: Drafts = self._ask(ProposeDrafts(inputs), Drafts)
        if answer.error is not None:
            raise RuntimeError(f"draft proposal failed in the front: {answer.error}")
        return answer.proposals

    def find_draft_channel(self) -> DraftChannelAddress | None:
        return self._ask(FindDraftChannel(), DraftChannelFound).address

    def _ask(self, question, answer_type: type):
        self.conn.send(question)
        while True:
            message = self.conn.recv()
            if isinstance(message, answer_type):
                return message
            self.pending.append(message)


class _ChildLoop(CoreLoop):
    def __init__(self, engine: LLMEngine, conn: Connection, pending: deque):
        super().__init__(engine, self._receive, self._publish, self._answer)
        self.conn = conn
        self.pending = pending

    def _receive(self, timeout: float) -> Command | None:
        if self.pending:
            return self.pending.popleft()
        try:
            if not self.conn.poll(timeout):
                return None
            return self.conn.recv()
        except (EOFError, OSError):  # the front is gone
            return Stop()

    def _publish(self, outputs: list[RequestOutput], stats: EngineStats) -> None:
        self._send(StepOutputs(outputs, stats))

    def _answer(self, report: CacheReport) -> None:
        self._send(report)

    def _send(self, message) -> None:
        try:
            self.conn.send(message)
        except OSError:
            self.stopped = True


def _child_main(fd: int) -> int:
    conn = Connection(fd)
    try:
        start: StartEngine = conn.recv()
        pending: deque = deque()
        proposer = DirectDraftProposer(_ProposerInFront(conn, pending)) if start.proposer_in_front else None
        engine = LLMEngine(start.config, proposer)
    except (EOFError, OSError):
        return 1
    except Exception:  # noqa: BLE001 - reported to the front, which raises it
        conn.send(EngineFailed(traceback.format_exc()))
        return 1
    conn.send(EngineReady(engine.limits, engine.stats()))
    _ChildLoop(engine, conn, pending).run()
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s engine-process %(levelname)s %(message)s")
    sys.exit(_child_main(int(sys.argv[1])))
