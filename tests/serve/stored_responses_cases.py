"""Stored responses (deployments/response_store.py) through the served app and the real `openai`
client: `previous_response_id` continues a response as if its whole conversation were sent
again (a tool call's output included), `retrieve` reads it, `delete` drops it, and `store: false`
keeps nothing.

Imported by tests/serve/test_openai_api.py so that they run against that module's app."""

from __future__ import annotations

import openai
import pytest

from tests.serve.responses_api_cases import RESPONSE_TOOLS
from tests.serve.tool_call_cases import MAX_TOKENS


def test_a_continued_response_answers_as_the_whole_conversation_would(serve_app, client):
    kwargs = dict(model=serve_app.model, max_output_tokens=8, temperature=0)
    first = client.responses.create(**kwargs, instructions="Be brief.", input="Say something")
    assert first.store is True and first.previous_response_id is None
    follow = client.responses.create(**kwargs, previous_response_id=first.id, input="Say more")
    whole = client.responses.create(**kwargs, input=[  # the first's instructions do not carry over
        {"role": "user", "content": "Say something"}, {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Say more"}])
    assert follow.previous_response_id == first.id
    assert (follow.output_text, follow.usage.input_tokens) == (whole.output_text, whole.usage.input_tokens)
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()

    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(**kwargs, previous_response_id=first.id, input="Again")
    assert info.value.body["param"] == "previous_response_id"
    assert client.responses.create(**kwargs, input="hi").status in ("completed", "incomplete")  # still serving


def test_a_tool_calls_output_continues_the_response_that_called_it(serve_app, client):
    kwargs = dict(model=serve_app.model, tools=RESPONSE_TOOLS, temperature=0, max_output_tokens=MAX_TOKENS)
    with client.responses.stream(**kwargs, input="Plan my day.",
                                 tool_choice={"type": "function", "name": "schedule"}) as stream:
        called = stream.get_final_response()
    [call] = called.output
    assert client.responses.retrieve(called.id).output[0].call_id == call.call_id  # kept before the stream ended
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"ok": true}'}
    follow = client.responses.create(**kwargs, previous_response_id=called.id, input=[result])
    whole = client.responses.create(**kwargs, input=[
        {"role": "user", "content": "Plan my day."},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments}, result])
    assert follow.usage.input_tokens == whole.usage.input_tokens
    assert [i.model_dump(exclude={"id", "call_id"}) for i in follow.output] == \
        [i.model_dump(exclude={"id", "call_id"}) for i in whole.output]


def test_store_false_keeps_nothing(serve_app, client):
    r = client.responses.create(model=serve_app.model, input="hi", max_output_tokens=2, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.retrieve(r.id)
    assert info.value.body["type"] == "not_found_error"
