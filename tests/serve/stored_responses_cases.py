"""Stored responses (deployments/response_store.py) through the served app and the real `openai`
client: `previous_response_id` continues a response as if its whole conversation were sent
again (a tool call's output included), `retrieve` reads it, `input_items.list` lists what it
answered, `delete` drops it, and `store: false` keeps nothing.

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
    with pytest.raises(openai.BadRequestError) as info:  # OpenAI's answer, which agents retry without the id on
        client.responses.create(**kwargs, previous_response_id=first.id, input="Again")
    assert (info.value.body["param"], info.value.body["code"]) == ("previous_response_id", "previous_response_not_found")
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
    assert info.value.body["type"] == "invalid_request_error"


def test_input_items_list_what_a_response_answered_its_history_included(serve_app, client):
    kwargs = dict(model=serve_app.model, max_output_tokens=4, temperature=0)
    first = client.responses.create(**kwargs, instructions="Be brief.", input="Say something")
    follow = client.responses.create(**kwargs, previous_response_id=first.id, input=[
        {"role": "user", "content": "Say more"}, {"type": "message", "id": "msg_mine", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Please"}]}])
    [reply] = first.output
    newest_first = client.responses.input_items.list(follow.id)
    assert [i.id for i in newest_first.data][:2] == ["msg_mine", newest_first.data[1].id]
    assert newest_first.has_more is False and newest_first.last_id == newest_first.data[-1].id
    paged = list(client.responses.input_items.list(follow.id, order="asc", limit=1))  # follows `after`
    assert [(i.type, i.role) for i in paged] == [("message", "user"), ("message", "assistant"),
                                                 ("message", "user"), ("message", "user")]
    assert [i.id for i in paged] == [i.id for i in reversed(newest_first.data)]
    assert paged[1].id == reply.id and paged[1].content[0].text == first.output_text
    assert [[c.text for c in i.content] for i in paged[::2]] == [["Say something"], ["Say more"]]
    assert [i.id for i in client.responses.input_items.list(first.id).data] == [paged[0].id]

    with pytest.raises(openai.BadRequestError) as info:
        client.responses.input_items.list(follow.id, after="msg_nobody")
    assert info.value.body["param"] == "after"
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(follow.id, limit=101)
    client.responses.delete(follow.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list(follow.id)


def test_an_item_reference_stands_for_the_kept_item_it_names(serve_app, client):
    kwargs = dict(model=serve_app.model, max_output_tokens=6, temperature=0)
    first = client.responses.create(**kwargs, input="Say something")
    [asked] = client.responses.input_items.list(first.id).data
    follow = client.responses.create(**kwargs, previous_response_id=first.id, input="Say more")
    by_reference = client.responses.create(**kwargs, input=[
        {"type": "item_reference", "id": asked.id}, {"type": "item_reference", "id": first.output[0].id},
        {"role": "user", "content": "Say more"}])
    assert (by_reference.output_text, by_reference.usage.input_tokens) == (follow.output_text,
                                                                           follow.usage.input_tokens)
    assert [i.id for i in client.responses.input_items.list(by_reference.id, order="asc").data][:2] == \
        [asked.id, first.output[0].id]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(**kwargs, input=[{"type": "item_reference", "id": "msg_nobody"}])
    assert info.value.body["param"] == "input" and "msg_nobody" in info.value.body["message"]
