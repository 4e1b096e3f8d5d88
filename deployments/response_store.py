"""The Responses API's stored responses: what `previous_response_id` continues, and what
`GET` and `DELETE /v1/responses/{id}` read.

One replica, which every Ingress replica asks (the Ingress autoscales, so a follow-up may reach
another replica than the response it continues). It keeps the newest `max_stored_responses` in
memory, dropping the oldest, and loses them when it restarts, as vLLM's in-memory store does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from ray import serve

from deployments.protocol import ChatMessage
from deployments.responses_api_protocol import ResponseObject


@dataclass
class StoredResponse:
    response: ResponseObject
    # The conversation it ends, as chat messages: the input so far (earlier responses' included,
    # `instructions` not: they hold for one response only), then its reply.
    conversation: list[ChatMessage]


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
class ResponseStore:
    def __init__(self, max_responses: int):
        self.max_responses = max_responses
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def put(self, stored: StoredResponse) -> None:
        self._responses[stored.response.id] = stored
        self._responses.move_to_end(stored.response.id)
        while len(self._responses) > self.max_responses:
            self._responses.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        return self._responses.get(response_id)

    def delete(self, response_id: str) -> bool:
        return self._responses.pop(response_id, None) is not None
