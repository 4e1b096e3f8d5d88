"""The Responses API's stored responses: what `previous_response_id` continues, what `GET` and
`DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items` read, and the state of the
responses that run in the background (`background: true`), which `POST /v1/responses/{id}/cancel`
ends.

One replica, which every Ingress replica asks (the Ingress autoscales, so a follow-up, a poll or a
cancel may reach another replica than the one that runs the response). It keeps the newest
`max_stored_responses` in memory, dropping the oldest (a background one still running stops, as
a DELETE stops it), and loses them when it restarts, as vLLM's in-memory store does.

A background response runs in the Ingress replica that took it; that replica waits here
(`wait_cancelled`) for a cancel, whichever replica it comes through, asking again every
`run_poll_s`: a running response whose run has not asked for `run_lost_s` (its replica died) is
stored `failed`, so that no client polls it forever. One that is streamed keeps
its events here as they come (`append_events`), so that a client that left can read them again
from any replica (`events_after`, OpenAI's `GET /v1/responses/{id}?stream=true&starting_after=N`),
until the response is dropped, or until the events kept pass `max_event_bytes` (~250 bytes a
token): then the oldest streams' events that ended `ended_events_kept_s` ago go first (their
responses can still be read whole; clients following a stream as it ends still read its last
events), and streams still running are never cut. So the store holds requests open while
background responses run (a wait per run, a read per client that follows one): hence its
`max_ongoing_requests`, and every method is async, on one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ray import serve

from deployments.openai_errors import OpenAIError
from deployments.responses_api_output import ResponseEvents, failed
from deployments.responses_api_protocol import ResponseObject

RUNNING = ("queued", "in_progress")
MAX_WAITING_RUNS = 100_000  # background responses whose Ingress waits here for a cancel, and then some
RUN_POLL_S = 10.0  # how long a run's wait for a cancel lasts before the run asks again
RUN_LOST_S = 30.0  # a running background response whose run has not asked for this long is lost
DEFAULT_MAX_EVENT_BYTES = 256 * 2 ** 20  # about a million streamed tokens
ENDED_EVENTS_KEPT_S = 60.0  # an ended stream's events outlive the budget this long
LOST_RUN = "the server lost this background response's run: the Ingress replica running it stopped"


@dataclass
class StoredResponse:
    response: ResponseObject
    # The items it answered (deployments/response_items.py): earlier responses' inputs and
    # outputs, then its own request's input.
    input_items: list[dict[str, Any]]

    @property
    def conversation(self) -> list[dict[str, Any]]:
        """What a response that continues this one continues: its input, then its output."""
        return self.input_items + [item.model_dump() for item in self.response.output]


@dataclass
class EventLog:
    """A streamed background response's server-sent events so far; event i has sequence_number i."""
    events: list[str] = field(default_factory=list)
    bytes: int = 0  # the events' size in UTF-8
    ended_at: float | None = None  # when the last came, or the run stopped
    grown: asyncio.Event = field(default_factory=asyncio.Event)  # set (and replaced) on every change

    @property
    def ended(self) -> bool:
        return self.ended_at is not None

    def end(self) -> None:
        if self.ended_at is None:
            self.ended_at = time.monotonic()

    def change(self) -> None:
        self.grown.set()
        self.grown = asyncio.Event()


@dataclass
class RunLease:
    """A running background response's run, as the store sees it: waiting, or when it last was."""
    waits: int = 0
    last_seen: float = field(default_factory=time.monotonic)


@serve.deployment(num_replicas=1, max_ongoing_requests=MAX_WAITING_RUNS, ray_actor_options={"num_cpus": 0})
class ResponseStore:
    def __init__(self, max_responses: int, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
                 run_poll_s: float = RUN_POLL_S, run_lost_s: float = RUN_LOST_S,
                 ended_events_kept_s: float = ENDED_EVENTS_KEPT_S):
        self.max_responses, self.max_event_bytes = max_responses, max_event_bytes
        self.ended_events_kept_s = ended_events_kept_s
        self.run_poll_s, self.run_lost_s = run_poll_s, run_lost_s
        self._runs: dict[str, RunLease] = {}  # per running background response
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()
        self._ended: dict[str, asyncio.Event] = {}  # per running background response, set when it ends
        # Every kept response's items by id, for `item_reference` inputs, with how many kept
        # responses hold each (a conversation's items are in every response that continues it).
        self._items: dict[str, dict[str, Any]] = {}
        self._item_holders: Counter[str] = Counter()
        self._event_logs: dict[str, EventLog] = {}  # per streamed background response, oldest first
        self._event_bytes = 0  # all the logs' events

    async def put(self, stored: StoredResponse, keep_events: bool = False) -> bool:
        """Keep `stored`, newest; False (and nothing kept) for a response cancelled meanwhile.
        `keep_events`: a streamed background response, whose events `append_events` brings."""
        response = stored.response
        if keep_events:
            self._event_logs.setdefault(response.id, EventLog())
        kept = self._responses.get(response.id)
        if kept is not None and kept.response.status == "cancelled":
            return False
        if kept is not None:
            self._hold(kept, -1)
        elif response.background and response.status in RUNNING:
            self._runs[response.id] = RunLease()
        self._responses[response.id] = stored
        self._responses.move_to_end(response.id)
        self._hold(stored, +1)
        while len(self._responses) > self.max_responses:  # a running one dropped stops, as if deleted
            dropped_id, dropped = self._responses.popitem(last=False)
            self._hold(dropped, -1)
            self._drop_events(dropped_id)
            self._end(dropped_id)
        if response.status not in RUNNING:
            self._end(response.id)
        return True

    async def get(self, response_id: str) -> StoredResponse | None:
        self._fail_lost_runs()
        return self._responses.get(response_id)

    async def items(self, item_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The items of kept responses (inputs and outputs) that have these ids."""
        return {i: self._items[i] for i in item_ids if i in self._items}

    async def delete(self, response_id: str) -> bool:
        """Drop a response; one still running stops (its `wait_cancelled` returns True)."""
        self._end(response_id)
        stored = self._responses.pop(response_id, None)
        if stored is not None:
            self._hold(stored, -1)
        self._drop_events(response_id)
        return stored is not None

    async def cancel(self, response_id: str) -> ResponseObject | None:
        """Mark a running background response cancelled; the response as it now is."""
        self._fail_lost_runs()
        stored = self._responses.get(response_id)
        if stored is None:
            return None
        if stored.response.background and stored.response.status in RUNNING:
            stored.response = stored.response.model_copy(update={"status": "cancelled"})
            self._end(response_id)
            self._end_events(response_id)  # its stream ends where the run stopped
        return stored.response

    async def wait_cancelled(self, response_id: str) -> bool | None:
        """Return when a running background response ends: True when it was cancelled or
        deleted (its run should stop), False when its final state was stored; None when it
        still runs after `run_poll_s` (ask again: that is how the store knows the run is there)."""
        stored = self._responses.get(response_id)
        lease = self._runs.get(response_id)
        if stored is not None and stored.response.status in RUNNING:
            if lease is not None:
                lease.waits += 1
            try:
                await asyncio.wait_for(self._ended.setdefault(response_id, asyncio.Event()).wait(), self.run_poll_s)
            except TimeoutError:
                return None
            finally:
                if lease is not None:
                    lease.waits -= 1
                    lease.last_seen = time.monotonic()
        stored = self._responses.get(response_id)
        return stored is None or stored.response.status == "cancelled"

    async def append_events(self, response_id: str, events: list[str], last: bool) -> None:
        """The next events of a streamed background response; `last`: no more will come."""
        log = self._event_logs.get(response_id)
        if log is None or log.ended:  # dropped, or cancelled: what the run still sends is not its stream
            return
        self._add_events(log, events)
        if last:
            log.end()
        log.change()
        self._drop_events_over_budget()

    async def events_after(self, response_id: str, after: int) -> tuple[list[str], bool] | None:
        """The events of a streamed background response after sequence number `after`, waiting
        for one when none has come yet, and whether they are the last; None when it keeps no
        events (not kept, or not a streamed background response)."""
        self._fail_lost_runs()
        log = self._event_logs.get(response_id)
        while log is not None and len(log.events) <= after + 1 and not log.ended:
            try:
                await asyncio.wait_for(log.grown.wait(), self.run_poll_s)
            except TimeoutError:
                self._fail_lost_runs()
            log = self._event_logs.get(response_id)
        if log is None:
            return None
        return log.events[after + 1:], log.ended

    def _fail_lost_runs(self) -> None:
        """Store `failed` every running background response whose run stopped asking."""
        now = time.monotonic()
        for response_id, lease in list(self._runs.items()):
            if lease.waits == 0 and now - lease.last_seen > self.run_lost_s:
                stored = self._responses[response_id]
                stored.response = failed(stored.response, LOST_RUN)
                self._end(response_id)
                log = self._event_logs.get(response_id)
                if log is not None and not log.ended:
                    events = ResponseEvents()
                    events.sequence_number = len(log.events)
                    self._add_events(log, [events.failed(stored.response, LOST_RUN)])
                    self._end_events(response_id)

    def _end_events(self, response_id: str) -> None:
        log = self._event_logs.get(response_id)
        if log is not None:
            log.end()
            log.change()

    def _add_events(self, log: EventLog, events: list[str]) -> None:
        size = sum(len(event.encode()) for event in events)
        log.events += events
        log.bytes += size
        self._event_bytes += size

    def _drop_events_over_budget(self) -> None:
        """The oldest streams' events that ended long enough ago, until what is kept fits
        `max_event_bytes`."""
        if self._event_bytes <= self.max_event_bytes:
            return
        ended_before = time.monotonic() - self.ended_events_kept_s
        for response_id in [i for i, log in self._event_logs.items() if log.ended and log.ended_at <= ended_before]:
            if self._event_bytes <= self.max_event_bytes:
                return
            self._drop_events(response_id)

    def _drop_events(self, response_id: str) -> None:
        self._end_events(response_id)  # wakes its readers, who find it gone
        log = self._event_logs.pop(response_id, None)
        if log is not None:
            self._event_bytes -= log.bytes

    def _hold(self, stored: StoredResponse, change: int) -> None:
        if change > 0:
            self._share_kept_items(stored.input_items)
        for item in stored.conversation:
            self._item_holders[item["id"]] += change
            if change > 0:
                self._items[item["id"]] = item
            elif self._item_holders[item["id"]] <= 0:
                del self._items[item["id"]], self._item_holders[item["id"]]

    def _share_kept_items(self, items: list[dict[str, Any]]) -> None:
        """Each of `items` that is already kept, equal, replaced by the one kept: a conversation's
        every response holds all its earlier items, which would otherwise be kept once per
        response (a conversation of T turns T^2 / 2 copies)."""
        for i, item in enumerate(items):
            kept = self._items.get(item["id"])
            if kept is not None and kept is not item and kept == item:
                items[i] = kept

    def _end(self, response_id: str) -> None:
        self._runs.pop(response_id, None)
        event = self._ended.pop(response_id, None)
        if event is not None:
            event.set()


def not_kept(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id {response_id!r} not found: none with that id is kept here",
                       param="response_id")
