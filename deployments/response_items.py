"""The items a stored response was made from, as `GET /v1/responses/{id}/input_items` lists them
and `previous_response_id` continues them.

A response's input items are the conversation it answered: the input items of the response it
continued, that response's output items, then its own request's `input` (instructions are not
items). Each item has an id: the client's, or one given here (`msg_`, `fc_`, `fco_`, `rs_`), so a
list can be paged by `after`. A string input, or a message whose content is a string, is stored
as OpenAI lists it: one text part (`input_text`, `output_text` for an assistant's). An
`item_reference` input item names an item of a kept response, input or output, by its id; it
stands for that item, and is stored as it.
"""

from __future__ import annotations

from typing import Any, Literal

from deployments.openai_errors import OpenAIError
from deployments.request_ids import new_id

ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "custom_tool_call": "ctc",
               "custom_tool_call_output": "ctco", "reasoning": "rs"}
MAX_LIST_LIMIT = 100  # OpenAI's bounds on `limit`


def request_items(request_input: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's `input` as stored items, each with an id."""
    items = [{"role": "user", "content": request_input}] if isinstance(request_input, str) else request_input
    return [_stored_item(item) for item in items]


def referenced_ids(request_input: str | list[dict[str, Any]]) -> list[str]:
    """The ids the input's `item_reference` items name: items of kept responses."""
    return [] if isinstance(request_input, str) else \
        [item.get("id") for item in request_input if item.get("type") == "item_reference"]


def resolved(request_input: list[dict[str, Any]], found: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The input with each `item_reference` replaced by the kept item it names (`found`)."""
    items = []
    for k, item in enumerate(request_input):
        if item.get("type") == "item_reference":
            if item.get("id") not in found:
                raise OpenAIError(400, f"input[{k}]: no response kept here has an item with the id "
                                       f"{item.get('id')!r}", param="input")
            item = found[item["id"]]
        items.append(item)
    return items


def _stored_item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    stored = {"type": kind, **item, "id": item.get("id") or new_id(ID_PREFIXES.get(kind, "item"), "_")}
    if kind == "message":
        stored.setdefault("status", "completed")
        if isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            stored["content"] = [{"type": part, "text": item["content"]}]
    return stored


def item_page(items: list[dict[str, Any]], after: str | None, limit: int,
              order: Literal["asc", "desc"]) -> dict[str, Any]:
    """OpenAI's list object of `items` (oldest first), `limit` of them from after the item `after`
    in `order`."""
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise OpenAIError(400, f"after: no input item of this response has the id {after!r}", param="after")
        start = ids.index(after) + 1
    page = ordered[start:start + limit]
    return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": start + limit < len(ordered)}
