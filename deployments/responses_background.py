"""Responses that run in the background (`background: true`), as OpenAI's and vLLM's do: the POST
answers at once with the response `in_progress`, the client polls `GET /v1/responses/{id}` until
it is `completed` (or `incomplete`, `failed`, `cancelled`), and `POST /v1/responses/{id}/cancel`
stops it.

The POST answers once the engine has started the response (its first output came), so every
refusal (a prompt too long, an overloaded engine, a format that does not compile) is still the
POST's 4xx. The rest runs in the Ingress replica that took it, which waits on the ResponseStore
(deployments/response_store.py) for a cancel that may come through any replica; a cancel (or a
DELETE) aborts the engine request, so its KV blocks are freed within a step. A background
response is always stored, and is not streamed: its events would have to be kept for a client
that reconnects (`GET ...?stream=true`), which this server does not do.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from deployments.choices import Choice, stream_failure_message
from deployments.openai_errors import OpenAIError
from deployments.response_store import StoredResponse, not_kept
from deployments.responses_api_output import failed
from deployments.responses_api_protocol import ResponseObject, ResponsesRequest


def check_background(body: ResponsesRequest, keeps_responses: bool) -> None:
    if not body.store or not keeps_responses:
        raise OpenAIError(400, "background: a background response must be stored, for it is read back with GET "
                               "/v1/responses/{id}; set store true" + ("" if keeps_responses else
                               " on a server that keeps responses (max_stored_responses > 0)"),
                          param="background")
    if body.stream:
        raise OpenAIError(400, "background: a background response is not streamed here; poll "
                               "GET /v1/responses/{id} instead, or leave background false", param="stream")


class BackgroundRuns:
    """A mixin of the Ingress deployment (deployments/ingress.py), beside ResponsesRoutes."""

    async def _run_in_background(self, response: ResponseObject, input_items: list[dict],
                                 events: AsyncIterator[str], choice: Choice) -> ResponseObject:
        """Store the started response, run the rest of `events` (which stores the final
        response) in a task, and answer with the response as it is now."""
        await self.response_store.put.remote(StoredResponse(response, input_items))
        run = asyncio.create_task(self._run_until_cancelled(response, input_items, events, choice))
        self.background_runs.add(run)  # a task only the loop refers to may be collected
        run.add_done_callback(self.background_runs.discard)
        return response

    async def _run_until_cancelled(self, response: ResponseObject, input_items: list[dict],
                                   events: AsyncIterator[str], choice: Choice) -> None:
        cancelled = asyncio.ensure_future(self.response_store.wait_cancelled.remote(response.id))
        run = asyncio.create_task(_drain(events))
        stopped = False  # by a cancel or a DELETE
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
        finally:
            run.cancel()
            cancelled.cancel()
            choice.close()

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


async def _drain(events: AsyncIterator[str]) -> None:
    async for _ in events:
        pass
