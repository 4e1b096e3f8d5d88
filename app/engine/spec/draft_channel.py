"""A direct connection from a target engine to a draft replica, so a proposal skips the Serve hop.

Through Serve, one proposal crossed the engine process's pipe to its replica, the replica's
event loop, the Serve handle's router, Ray's actor call and the draft replica's thread pool,
and back: 6.6 ms per call on 2 CPU cores, against ~2 ms of drafting (benchmarks/RESULTS.md).
Here the engine keeps one TCP connection to one draft replica and sends `ProposeDrafts` and
receives `Drafts` (app/engine/messages.py) on it, pickled, as the engine process does with its
front.

The DraftModel deployment stays what it was: stateless, its own replicas and autoscaling. The
channel is found through Serve (`find_draft_channel`: Serve picks a live replica, which answers
with its `DraftChannelAddress`), and Serve stays the fallback: while no channel is up, and for
`retry_after_s` after one breaks, proposals go the Serve way. A broken or slow channel fails
that step's proposal (the engine decodes it without drafts), so a killed draft replica costs
one step's drafts, then the engine finds a live replica again. Every `refind_after_s` it asks
Serve again even when nothing broke, so engines spread over draft replicas that autoscaling
added.

Each connection proves it knows the replica's random key (the HMAC challenge of
multiprocessing.connection) before anything is unpickled.

`send_ahead` sends a proposal without waiting for it: the engine asks for the next step's drafts
while this step's forward runs (app/engine/spec/drafts_ahead.py). The answer is read before
anything else goes on the channel, so one call is on the wire at a time.
"""

from __future__ import annotations

import logging
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Callable, Protocol

from app.engine.messages import Drafts, ProposeDrafts
from app.engine.spec.proposal import DraftInput, Proposal

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class DraftChannelAddress:
    host: str
    port: int
    authkey: bytes


class ServePath(Protocol):
    """The proposals' way through Serve, which also finds a draft replica's channel."""

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]: ...

    def find_draft_channel(self) -> DraftChannelAddress | None: ...


def _connection(sock: socket.socket, read_timeout_s: float = 0.0) -> Connection:
    """A blocking Connection on `sock` (it reads the descriptor directly); with a read timeout,
    a read that waits longer fails with an OSError (0: wait for ever)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle wait on a large answer
    sock.settimeout(None)
    _set_read_timeout(sock.fileno(), read_timeout_s)
    return Connection(sock.detach())


def _set_read_timeout(fd: int, seconds: float) -> None:
    with socket.socket(fileno=socket.dup(fd)) as view:
        view.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                        struct.pack("ll", int(seconds), int(seconds % 1 * 1e6)))


class DraftChannelServer:
    """The draft replica's end: one thread per connected engine, each call answered by
    `propose` (which serialises the model's use itself)."""

    def __init__(self, propose: Callable[[list[DraftInput]], list[Proposal]], host: str):
        self._propose = propose
        self._socket = socket.create_server((host, 0), backlog=64)
        self.address = DraftChannelAddress(host, self._socket.getsockname()[1], secrets.token_bytes(32))
        self._closed = False
        self._open: set[socket.socket] = set()  # the engines' connections, to end them on close
        self._open_lock = threading.Lock()
        threading.Thread(target=self._accept, name="draft-channel-accept", daemon=True).start()

    def close(self) -> None:
        """Stop listening and end every connection: engines see the channel break, as when the
        replica dies."""
        self._closed = True
        self._socket.close()
        with self._open_lock:
            for sock in self._open:
                try:
                    sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading it
                except OSError:
                    pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                sock, _ = self._socket.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(sock,), name="draft-channel", daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        handle = sock.dup()  # for `close`: the Connection below owns `sock`'s descriptor
        with self._open_lock:
            self._open.add(handle)
            if self._closed:  # accepted while `close` ran
                handle.shutdown(socket.SHUT_RDWR)
        conn = _connection(sock, read_timeout_s=HANDSHAKE_TIMEOUT_S)
        try:
            deliver_challenge(conn, self.address.authkey)
            answer_challenge(conn, self.address.authkey)
            _set_read_timeout(conn.fileno(), 0.0)  # an engine may stay idle for hours
            while True:
                match conn.recv():
                    case ProposeDrafts(inputs):
                        try:
                            answer = Drafts(self._propose(inputs))
                        except Exception as exc:  # noqa: BLE001 - the engine counts it and decodes without drafts
                            answer = Drafts(None, f"{type(exc).__name__}: {exc}")
                        conn.send(answer)
        except (EOFError, OSError, AuthenticationError) as exc:  # the engine went away, or failed the challenge
            logger.debug("draft channel closed: %s", exc)
        finally:
            conn.close()
            with self._open_lock:
                self._open.discard(handle)
            handle.close()


class DirectDraftProposer:
    """The engine's proposer: over a draft replica's channel when one is up, else through Serve."""

    def __init__(self, serve_path: ServePath, timeout_s: float = 2.0, retry_after_s: float = 2.0,
                 refind_after_s: float = 60.0):
        self.serve_path = serve_path
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.refind_after_s = refind_after_s
        self._conn: Connection | None = None
        self._find_at = 0.0  # monotonic time of the next search for a channel
        self._ahead: PendingChannelDrafts | None = None  # a proposal sent ahead whose answer is unread
        self.num_direct_calls = 0

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        self._settle_ahead()
        conn = self._channel()
        if conn is None:
            return self.serve_path.propose_batch(inputs)
        try:
            conn.send(ProposeDrafts(inputs))
        except OSError:
            self._drop(retry_after_s=self.retry_after_s)
            raise  # the Speculator logs and counts it; this step decodes without drafts
        return self._answer(conn)

    def send_ahead(self, inputs: list[DraftInput]) -> PendingChannelDrafts | None:
        """Send a proposal and return at once; the `PendingChannelDrafts` reads the answer
        later. None while no channel is up (through Serve, nothing is sent ahead)."""
        self._settle_ahead()
        conn = self._conn if time.monotonic() < self._find_at else None  # never searches: that waits on Serve
        if conn is None:
            return None
        try:
            conn.send(ProposeDrafts(inputs))
        except OSError:
            self._drop(retry_after_s=self.retry_after_s)
            return None
        self._ahead = PendingChannelDrafts(self, conn)
        return self._ahead

    def close(self) -> None:
        self._drop(retry_after_s=0.0)

    def _answer(self, conn: Connection) -> list[Proposal]:
        try:
            if not conn.poll(self.timeout_s):
                raise TimeoutError(f"no drafts from the draft channel within {self.timeout_s} s")
            answer: Drafts = conn.recv()
        except (OSError, EOFError, TimeoutError):
            self._drop(retry_after_s=self.retry_after_s)
            raise
        self.num_direct_calls += 1
        if answer.error is not None:
            raise RuntimeError(f"draft proposal failed in the draft replica: {answer.error}")
        return answer.proposals

    def _settle_ahead(self) -> None:
        """Read the answer sent ahead, if nobody has, so the channel's next answer is the next
        call's."""
        if self._ahead is not None:
            self._ahead.result()

    def _read_ahead(self, pending: PendingChannelDrafts) -> list[Proposal] | None:
        """`pending`'s answer, or None when it was lost (the channel broke, or was dropped
        since it was sent)."""
        if self._ahead is not pending:
            return None
        self._ahead = None
        try:
            return self._answer(pending.conn)
        except (OSError, EOFError, TimeoutError, RuntimeError) as exc:
            logger.warning("drafts sent ahead were lost: %s", exc)
            return None

    def _channel(self) -> Connection | None:
        now = time.monotonic()
        if now < self._find_at:
            return self._conn
        self._drop(retry_after_s=self.retry_after_s)  # from here on, a failed search waits that long
        try:
            address = self.serve_path.find_draft_channel()
        except Exception:  # noqa: BLE001 - no channel this time: Serve's way still proposes
            logger.warning("could not find a draft channel; proposing through Serve", exc_info=True)
            return None
        if address is None:
            return None
        conn = None
        try:
            sock = socket.create_connection((address.host, address.port), timeout=HANDSHAKE_TIMEOUT_S)
            conn = _connection(sock, read_timeout_s=HANDSHAKE_TIMEOUT_S)
            answer_challenge(conn, address.authkey)
            deliver_challenge(conn, address.authkey)
            _set_read_timeout(conn.fileno(), 0.0)  # each call waits by `poll(timeout_s)` instead
        except (OSError, EOFError, AuthenticationError) as exc:
            logger.warning("could not open the draft channel at %s:%d (%s); proposing through Serve",
                           address.host, address.port, exc)
            if conn is not None:
                conn.close()
            return None
        self._conn, self._find_at = conn, now + self.refind_after_s
        return conn

    def _drop(self, retry_after_s: float) -> None:
        self._ahead = None  # an answer on its way is lost with the channel
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._find_at = time.monotonic() + retry_after_s


class PendingChannelDrafts:
    """A proposal sent ahead on a draft channel (app/engine/spec/drafts_ahead.py: `PendingDrafts`);
    `result` reads its answer once, waiting for it as a direct call would."""

    def __init__(self, proposer: DirectDraftProposer, conn: Connection):
        self.proposer = proposer
        self.conn = conn
        self._read = False
        self._result: list[Proposal] | None = None

    def result(self) -> list[Proposal] | None:
        if not self._read:
            self._read = True
            self._result = self.proposer._read_ahead(self)
        return self._result
