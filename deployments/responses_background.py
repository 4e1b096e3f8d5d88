"""Responses that run in the background (`background: true`), as OpenAI's and vLLM's do: the POST
answers at once with the response `in_progress`, the client polls `GET /v1/responses/{id}` until
it is `completed` (or `incomplete`, `failed`, `cancelled`), and `POST /v1/responses/{id}/cancel`
stops it.

The POST answers once the engine has started the response (its first output came), so every
refusal (a prompt too long, an overloaded engine, a format that does not compile) is still the
POST's 4xx. The rest runs in the Ingress replica that took it, which waits on the ResponseStore
(deployments/response_store.py) for a cancel that may come through any replica; a cancel (or a
DELETE) aborts the engine request, so its KV blocks are freed within a step. Should that replica
die, the store, no longer asked, stores the response `failed` within 40 s (RUN_POLL_S + RUN_LOST_S).

A background response that is also streamed (`stream: true`) sends its events to the store as
they come, and the POST streams them from there, as does `GET /v1/responses/{id}?stream=true`
(after `starting_after`, on any replica): a client that leaves the stream leaves the response
running, and can follow it again. Its engine request and its run's calls to the store are made
outside the HTTP request (`outside_the_http_request`), for Serve cancels a request's calls when
its client leaves.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from contextlib import contextmanager
from typing import AsyncIterator, Iterator

from fastapi.responses import StreamingResponse

from deployments.choices import Choice, stream_failure_message
from deployments.openai_errors import OpenAIError
from deployments.response_store import StoredResponse, not_kept
from deployments.responses_api_output import ResponseEvents, failed
from deployments.responses_api_protocol import ResponseObject, ResponsesRequest


def check_background(body: ResponsesRequest, keeps_responses: bool) -> None:
    if not body.store or not keeps_responses:
        raise OpenAIError(400, "background: a background response must be stored, for it is read back with GET "
                               "/v1/responses/{id}; set store true" + ("" if keeps_responses else
                               " on a server that keeps responses (max_stored_responses > 0)"),
                          param="background")


@contextmanager
def outside_the_http_request() -> Iterator[None]:
    """Deployment calls made inside this are filed under a request id of their own, which no
    client's leaving cancels. Serve files a request's calls under the request's internal id
    (its `_RequestContext`, a context variable) and cancels them all when that request is
    cancelled (`Replica._on_request_cancelled`); Serve has no public way to make a call that
    outlives its request."""
    from ray.serve import context

    current = context._get_serve_request_context()
    token = context._serve_request_context.set(dataclasses.replace(
        current, _internal_request_id=f"background-{uuid.uuid4().hex}", cancel_on_parent_request_cancel=False))
    try:
        yield
    finally:
        context._serve_request_context.reset(token)


class EventSender:
    """A streamed background response's events on their way to the store, in order, each batch
    what came while the one before was sent."""

    def __init__(self, store, response_id: str):
        self.store, self.response_id = store, response_id
        self.pending: list[str] = []
        self.sending: asyncio.Task | None = None

    def add(self, event: str) -> None:
        self.pending.append(event)
        if self.sending is None or self.sending.done():
            self.sending = asyncio.create_task(self._send_pending())

    async def _send_pending(self) -> None:
        while self.pending:
            batch, self.pending = self.pending, []
            await self.store.append_events.remote(self.response_id, batch, False)

    async def close(self, last: list[str] = ()) -> None:
        """Send what is pending and `last`, and mark the stream ended."""
        if self.sending is not None:
            await self.sending
        self.pending += last
        await self.store.append_events.remote(self.response_id, self.pending, True)


class BackgroundRuns:
    """A mixin of the Ingress deployment (deployments/ingress.py), beside ResponsesRoutes."""

    async def _run_in_background(self, response: ResponseObject, input_items: list[dict],
                                 events: AsyncIterator[str], choice: Choice, streamed: ResponseEvents | None):
        """Store the started response, run the rest of `events` (which stores the final
        response) in a task, and answer with the response as it is now, or, `streamed`, with its
        events as the store gets them."""
        await self.response_store.put.remote(StoredResponse(response, input_items), keep_events=streamed is not None)
        with outside_the_http_request():  # the run's own calls (the store's) outlive the POST too
            run = asyncio.create_task(self._run_until_cancelled(response, input_items, events, choice, streamed))
        self.background_runs.add(run)  # a task only the loop refers to may be collected
        run.add_done_callback(self.background_runs.discard)
        if streamed is None:
            return response
        return StreamingResponse(self._kept_events(response.id, -1), media_type="text/event-stream")

    async def _run_until_cancelled(self, response: ResponseObject, input_items: list[dict],
                                   events: AsyncIterator[str], choice: Choice, streamed: ResponseEvents | None) -> None:
        sender = EventSender(self.response_store, response.id) if streamed is not None else None
        cancelled = asyncio.ensure_future(self._stop_asked(response.id))
        run = asyncio.create_task(_forward(events, sender))
        stopped = False  # by a cancel or a DELETE
        last = []
        try:
            await asyncio.wait((run, cancelled), return_when=asyncio.FIRST_COMPLETED)
            if not run.done() and cancelled.exception() is None and cancelled.result():
                run.cancel()  # ends the engine request (Choice.events closes it)
                stopped = True
            await run
        except (asyncio.CancelledError, Exception) as exc:  # noqa: BLE001 - reported in the stored response
            if not stopped:  # an error, or the run cancelled from outside (its replica stopping)
                message = stream_failure_message(response.id, exc) if isinstance(exc, Exception) else \
                    "the response's run on the server was cancelled before it ended"
                await self.response_store.put.remote(StoredResponse(failed(response, message), input_items))
                last = [streamed.failed(response, message)] if streamed is not None else []
        finally:
            run.cancel()
            cancelled.cancel()
            choice.close()
            if sender is not None:
                await sender.close(last)

    async def _stop_asked(self, response_id: str) -> bool:
        """Wait for the response to end: True when a cancel or a DELETE asks its run to stop. The
        store's wait returns now and then (None) to be asked again: so it knows this run is alive."""
        while (stop := await self.response_store.wait_cancelled.remote(response_id)) is None:
            pass
        return stop

    async def _cancel(self, response_id: str) -> ResponseObject:
        response = await self.response_store.cancel.remote(response_id) if self.response_store is not None else None
        if response is None:
            raise not_kept(response_id)
        if not response.background:
            raise OpenAIError(400, "Cannot cancel a synchronous response: only a background one can be",
                              param="response_id")
        if response.status != "cancelled":
            raise OpenAIError(400, f"Cannot cancel a response that is already {response.status}",
                              param="response_id")
        return response

    async def _stream_kept(self, response_id: str, starting_after: int) -> StreamingResponse:
        """`GET /v1/responses/{id}?stream=true`: a streamed background response's events after
        `starting_after`, those kept and those to come. Refused before the stream starts."""
        first = await self.response_store.events_after.remote(response_id, starting_after) \
            if self.response_store is not None else None
        if first is None:
            stored = await self._stored(response_id)  # 404 when not kept
            raise OpenAIError(400, f"stream: only a background response created with stream true keeps its "
                                   f"events to stream again, and the oldest finished ones' go when the events kept "
                                   f"pass max_stored_event_bytes; {stored.response.id} keeps none; read it whole "
                                   "(leave stream false)", param="stream")
        return StreamingResponse(self._kept_events(response_id, starting_after, first),
                                 media_type="text/event-stream")

    async def _kept_events(self, response_id: str, after: int,
                           first: tuple[list[str], bool] | None = None) -> AsyncIterator[str]:
        """The events after `after` as the store gets them (`first`: a batch already fetched),
        until the last, or until the response is dropped."""
        while True:
            got = first if first is not None else await self.response_store.events_after.remote(response_id, after)
            first = None
            if got is None:
                return
            events, ended = got
            for event in events:
                yield event
            after += len(events)
            if ended:
                return


async def _forward(events: AsyncIterator[str], sender: EventSender | None) -> None:
    async for event in events:
        if sender is not None:
            sender.add(event)
