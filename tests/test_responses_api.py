"""OpenAI's Responses API without a server: a request becomes the chat completion it describes,
what cannot be one is a 400 naming the field, and the events of a streamed answer are what the
real `openai` client's stream accumulator takes (it checks their order and identities)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent
from openai import omit
from openai._models import construct_type_unchecked

from deployments.choices import Event
from deployments.openai_errors import OpenAIError
from deployments.response_items import item_page, referenced_ids, request_items, resolved
from deployments.response_store import StoredResponse
from deployments.responses import ChatTokenLogprob
from deployments.reasoning import ReasoningStream
from deployments.responses_api_input import chat_request
from deployments.responses_api_output import ResponseEvents, ResponseOutput, finished, response_status
from deployments.responses_api_protocol import ResponseObject, ResponsesRequest, ResponseUsage
from deployments.tool_protocol import FunctionCall, ToolCall

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def chat(body: dict):
    return chat_request(ResponsesRequest.model_validate(body))


def refusal(body: dict) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        chat(body)
    assert info.value.status == 400
    return info.value


def test_a_string_input_with_instructions_is_a_system_and_a_user_message():
    c = chat({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 7, "temperature": 0,
              "top_p": 0.5})
    assert [(m.role, m.text()) for m in c.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert (c.max_new_tokens, c.temperature, c.top_p, c.stream) == (7, 0.0, 0.5, False)
    assert "temperature" in c.model_fields_set  # so that the model's defaults do not replace it
    assert "top_k" not in chat({"input": "Hi"}).model_fields_set


def test_function_calls_join_their_assistant_turn_and_outputs_become_tool_turns():
    c = chat({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in "}, {"type": "input_text", "text": "Oslo?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],  # goes with the assistant turn after it
         "content": [{"type": "reasoning_text", "text": "Ask the tool."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Bergen"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temperature": 3}'},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "4"}]},
    ], "tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_weather"}})
    user, assistant, first, second = c.messages
    assert user.text() == "Weather in Oslo?"
    assert assistant.text() == "Looking." and [t.id for t in assistant.tool_calls] == ["call_1", "call_2"]
    assert assistant.reasoning == "Ask the tool." and user.reasoning is None
    assert json.loads(assistant.tool_calls[1].function.arguments) == {"city": "Bergen"}
    assert (first.role, first.tool_call_id, first.name, first.text()) == ("tool", "call_1", "get_weather",
                                                                         '{"temperature": 3}')
    assert second.text() == "4"
    [tool] = c.tools
    assert (tool.function.name, tool.function.parameters) == ("get_weather", WEATHER["parameters"])
    assert c.tool_choice.function.name == "get_weather"
    allowed = chat({"input": "x", "tools": [WEATHER], "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]}})
    assert allowed.tool_choice.allowed_tools.mode == "required"
    assert [t.function.name for t in allowed.tool_choice.allowed_tools.tools] == ["get_weather"]


QUERY = {"type": "custom", "name": "query", "description": "One SQL query", "format": {
    "type": "grammar", "grammar": {"syntax": "regex", "definition": "SELECT [a-z]+"}}}


def test_custom_tools_their_calls_and_outputs_become_chats():
    c = chat({"input": [
        {"role": "user", "content": "Count the rows."},
        {"type": "custom_tool_call", "call_id": "call_1", "name": "query", "input": 'SELECT "n"'},
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "3"},
    ], "tools": [QUERY, WEATHER], "tool_choice": {"type": "custom", "name": "query"}})
    user, assistant, tool = c.messages
    [call] = assistant.tool_calls
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_1", "query",
                                                                                  {"input": 'SELECT "n"'})
    assert (tool.role, tool.tool_call_id, tool.name, tool.text()) == ("tool", "call_1", "query", "3")
    query, weather = c.tools
    assert query.function.parameters["properties"]["input"]["pattern"] == "SELECT [a-z]+"
    assert query.function.description == "One SQL query" and weather.function.name == "get_weather"
    assert c.calls_custom_tool("query") and not c.calls_custom_tool("get_weather")
    assert c.tool_choice.function.name == "query"
    allowed = chat({"input": "x", "tools": [QUERY, WEATHER], "tool_choice": {
        "type": "allowed_tools", "mode": "auto", "tools": [{"type": "custom", "name": "query"}]}})
    assert [t.function.name for t in allowed.tool_choice.allowed_tools.tools] == ["query"]


def test_text_format_logprobs_and_vllm_sampling_fields_carry_over():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    c = chat({"input": "x", "text": {"format": {"type": "json_schema", "name": "thing", "schema": schema,
                                                "strict": True}},
              "include": ["message.output_text.logprobs"], "top_logprobs": 3, "top_k": 5, "seed": 2,
              "stop": ["}"], "store": True, "metadata": {"k": "v"}})
    assert c.response_format.type == "json_schema" and c.response_format.json_schema.schema_ == schema
    assert (c.logprobs, c.top_logprobs, c.top_k, c.seed, c.stop) == (True, 3, 5, 2, ["}"])
    assert chat({"input": "x", "text": {"format": {"type": "json_object"}}}).response_format.type == "json_object"
    assert chat({"input": "x", "top_logprobs": 3}).logprobs is False  # logprobs come only when included
    assert chat({"input": "x", "reasoning": {"effort": "none"}}).reasoning_effort == "none"  # chat's field


def test_unknown_fields_are_named_and_known_extras_are_not():
    body = ResponsesRequest.model_validate({"input": "x", "top_k": 3, "frobnicate": 1})
    assert body.ignored_fields == ["frobnicate"]


@pytest.mark.parametrize("body, param, words", [
    ({"input": "x", "conversation": "conv_1"}, "conversation", "no stored conversations"),
    ({"input": "x", "prompt": {"id": "pmpt_1"}}, "prompt", "no stored conversations or prompts"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]}, "input",
     "input_image"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input", "call_id"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input", "at least one message"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools", "web_search"),
    ({"input": "x", "tools": [{"type": "custom"}]}, "tools", "needs a name"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "custom", "name": "get_weather"}}, "tool_choice",
     "not a custom tool"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice",
     "allowed_tools"),
    ({"input": "x", "stop": [""]}, None, "stop strings must not be empty"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning_effort", "reasoning_effort"),
])
def test_what_cannot_be_a_chat_completion_is_a_400_naming_the_field(body, param, words):
    error = refusal(body)
    assert error.param == param and words in error.message


def test_a_json_schema_format_needs_its_schema():
    with pytest.raises(ValueError, match="needs a \"schema\""):
        ResponsesRequest.model_validate({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}})


def accumulate(chunks: list[str]):
    """The events through the openai client's own stream accumulator; its final response."""
    state = ResponseStreamState(input_tools=[WEATHER], text_format=omit)
    for chunk in chunks:
        kind, data = chunk.split("\n")[:2]
        payload = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {payload['type']}"
        state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=payload))
    return state, [json.loads(c.split("\n")[1].removeprefix("data: ")) for c in chunks]


def stream_of(output: ResponseOutput, written: list[tuple[str, Any]], finish: str) -> list[str]:
    """The events the ingress writes for an output written as `written`, in order: ("reasoning",
    text), ("text", text), ("call" or "custom", ToolCall: its arguments in two pieces; custom: a custom
    tool's call)."""
    events = ResponseEvents()
    response = ResponseObject(id="resp_1", model="m")
    chunks = [events.event("response.created", response=response),
              events.event("response.in_progress", response=response)]
    for kind, what in written:
        if kind == "reasoning":
            chunks += events.reasoning(output, what)
        elif kind == "text":
            chunks += events.text(output, what, [ChatTokenLogprob(token=what, logprob=-0.5)] if output.with_logprobs
                                  else [])
        else:
            chunks += events.call(output, what, custom=kind == "custom")
            half = len(what.function.arguments) // 2
            for piece in (what.function.arguments[:half], what.function.arguments[half:]):
                chunks += events.call_arguments(output, len(output.call_places) - 1, piece)
    chunks += events.finish(output, response_status(finish), [])
    final = finished(response, output, finish, ResponseUsage(input_tokens=3, output_tokens=2, total_tokens=5))
    return chunks + [events.event(f"response.{final.status}", response=final)]


def test_a_streamed_text_answer_is_what_the_client_accumulates():
    written = [("text", "Hel"), ("text", "lo")]
    state, payloads = accumulate(stream_of(ResponseOutput(with_logprobs=True), written, "stop"))
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    final = state._completed_response
    assert final.status == "completed" and final.output_text == "Hello"
    assert [lp.token for lp in final.output[0].content[0].logprobs] == ["Hel", "lo"]
    assert final.usage.total_tokens == 5


def test_calls_follow_the_message_and_an_answer_cut_short_is_incomplete():
    call = ToolCall(function=FunctionCall(name="get_weather", arguments='{"city": "Oslo"}'))
    state, payloads = accumulate(stream_of(ResponseOutput(with_logprobs=False), [("call", call)], "stop"))
    [item] = state._completed_response.output
    assert (item.type, item.call_id, item.name, item.arguments) == ("function_call", call.id, "get_weather",
                                                                    '{"city": "Oslo"}')
    assert item.id != item.call_id
    assert not any(p["type"].startswith("response.output_text") for p in payloads)

    cut = stream_of(ResponseOutput(with_logprobs=False), [("text", "Hel")], "length")
    final = json.loads(cut[-1].split("\n")[1].removeprefix("data: "))
    assert final["type"] == "response.incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["response"]["output"][0]["status"] == "incomplete"

    _, payloads = accumulate(stream_of(ResponseOutput(with_logprobs=False), [("call", call)], "length"))
    [item] = payloads[-1]["response"]["output"]
    assert (item["status"], item["arguments"]) == ("incomplete", '{"city": "Oslo"}')
    assert payloads[-2]["type"] == "response.output_item.done" and payloads[-2]["item"] == item


def test_a_custom_tools_call_is_a_custom_tool_call_item_with_its_input():
    query = 'SELECT "a"\nFROM b'
    call = ToolCall(function=FunctionCall(name="query", arguments=json.dumps({"input": query})))
    state, payloads = accumulate(stream_of(ResponseOutput(with_logprobs=False), [("text", "On it."), ("custom", call)],
                                           "stop"))
    message, item = state._completed_response.output
    assert message.type == "message" and message.content[0].text == "On it."
    assert (item.type, item.call_id, item.name, item.input) == ("custom_tool_call", call.id, "query", query)
    assert item.id.startswith("ctc_")
    deltas = [p["delta"] for p in payloads if p["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == query and len(deltas) == 2  # as the arguments came: in two pieces
    [done] = [p for p in payloads if p["type"] == "response.custom_tool_call_input.done"]
    assert done["input"] == query and done["item_id"] == item.id
    assert not any(p["type"].startswith("response.function_call") for p in payloads)


def test_an_empty_answer_is_an_empty_message():
    state, _ = accumulate(stream_of(ResponseOutput(with_logprobs=False), [], "stop"))
    assert state._completed_response.output_text == ""
    assert [i.type for i in state._completed_response.output] == ["message"]


def test_reasoning_comes_first_and_the_client_accumulates_every_item_in_place():
    call = ToolCall(function=FunctionCall(name="get_weather", arguments='{"city": "Oslo"}'))
    state, payloads = accumulate(stream_of(ResponseOutput(with_logprobs=False), [
        ("reasoning", "Oslo is "), ("reasoning", "in Norway."), ("text", "Let me look."), ("call", call)], "stop"))
    reasoning, message, function_call = state._completed_response.output
    assert reasoning.type == "reasoning" and reasoning.status == "completed"
    assert [c.text for c in reasoning.content] == ["Oslo is in Norway."]
    assert message.content[0].text == "Let me look." and function_call.name == "get_weather"
    added = [p["output_index"] for p in payloads if p["type"] == "response.output_item.added"]
    assert added == [0, 1, 2]
    deltas = [p["delta"] for p in payloads if p["type"] == "response.reasoning_text.delta"]
    assert deltas == ["Oslo is ", "in Norway."]


def test_items_are_in_the_order_written_and_a_kind_after_another_is_an_item_of_its_own():
    """A harmony reply: an analysis, a preamble, more analysis, then a call; and text after a call."""
    call = ToolCall(function=FunctionCall(name="get_weather", arguments='{"city": "Oslo"}'))
    state, payloads = accumulate(stream_of(ResponseOutput(with_logprobs=True), [
        ("reasoning", "Weather asked."), ("text", "Let me look."), ("reasoning", "Oslo, "), ("reasoning", "then."),
        ("call", call), ("text", "Done.")], "stop"))
    output = state._completed_response.output
    assert [(i.type, i.status) for i in output] == [("reasoning", "completed"), ("message", "completed"),
                                                   ("reasoning", "completed"), ("function_call", "completed"),
                                                   ("message", "completed")]
    assert [output[0].content[0].text, output[1].content[0].text, output[2].content[0].text] == [
        "Weather asked.", "Let me look.", "Oslo, then."]
    assert (output[3].name, output[3].arguments, output[4].content[0].text) == ("get_weather", '{"city": "Oslo"}',
                                                                                "Done.")
    assert [lp.token for lp in output[4].content[0].logprobs] == ["Done."]
    assert [p["output_index"] for p in payloads if p["type"] == "response.output_item.added"] == [0, 1, 2, 3, 4]
    done = [(p["output_index"], p["item"]["type"]) for p in payloads if p["type"] == "response.output_item.done"]
    assert done == [(0, "reasoning"), (1, "message"), (2, "reasoning"), (3, "function_call"), (4, "message")]
    assert len({i.id for i in output}) == 5
    assert [i["id"] for i in payloads[-1]["response"]["output"]] == [i.id for i in output]


def test_a_reply_cut_while_reasoning_is_its_reasoning_item_only():
    _, payloads = accumulate(stream_of(ResponseOutput(with_logprobs=False), [("reasoning", "Hmm")], "length"))
    assert payloads[-1]["type"] == "response.incomplete"
    [item] = payloads[-1]["response"]["output"]
    assert item["type"] == "reasoning" and item["status"] == "incomplete"
    assert item["content"] == [{"type": "reasoning_text", "text": "Hmm"}]
    assert not any(p["type"].startswith("response.output_text") for p in payloads)


def test_a_continued_conversation_follows_the_instructions_and_names_earlier_calls():
    history = request_items([{"role": "user", "content": "Weather?"},
                             {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                              "arguments": '{"city": "Oslo"}'}])
    c = chat_request(ResponsesRequest.model_validate({"instructions": "Be brief.", "input": [
        {"type": "function_call_output", "call_id": "call_1", "output": "3"}]}), history)
    system, user, assistant, tool = c.messages
    call = ToolCall(id="call_1", function=FunctionCall(name="get_weather", arguments='{"city": "Oslo"}'))
    assert (system.role, system.text(), user.text(), assistant.tool_calls) == ("system", "Be brief.", "Weather?", [call])
    assert (tool.role, tool.tool_call_id, tool.name, tool.text()) == ("tool", "call_1", "get_weather", "3")


def test_a_response_cut_while_reasoning_is_continued_after_an_assistant_turn_of_reasoning():
    output = ResponseOutput(with_logprobs=False)
    ResponseEvents().reasoning(output, "Let me think")
    cut = finished(ResponseObject(id="resp_1", model="m"), output, "length",
                   ResponseUsage(input_tokens=3, output_tokens=4, total_tokens=7))
    stored = StoredResponse(cut, request_items("Hi"))
    c = chat_request(ResponsesRequest.model_validate({"input": "Go on"}), stored.conversation)
    assert [(m.role, m.text(), m.reasoning) for m in c.messages] == [
        ("user", "Hi", None), ("assistant", "", "Let me think"), ("user", "Go on", None)]


def test_stored_input_items_have_ids_and_text_parts():
    items = request_items([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                           {"type": "message", "id": "msg_mine", "role": "user",
                            "content": [{"type": "input_text", "text": "Again"}]},
                           {"type": "function_call_output", "call_id": "call_1", "output": "3"}])
    assert [i["id"][:4] for i in items] == ["msg_", "msg_", "msg_", "fco_"] and items[2]["id"] == "msg_mine"
    assert len({i["id"] for i in items}) == 4
    assert items[0]["content"] == [{"type": "input_text", "text": "Hi"}]
    assert items[1]["content"] == [{"type": "output_text", "text": "Hello"}]
    assert items[0]["type"] == "message" and items[0]["status"] == "completed"
    [only] = request_items("Hi")
    assert (only["role"], only["content"]) == ("user", [{"type": "input_text", "text": "Hi"}])


@pytest.mark.parametrize("order, after, limit, ids, has_more", [
    ("desc", None, 20, ["e", "d", "c", "b", "a"], False),
    ("asc", None, 2, ["a", "b"], True),
    ("asc", "b", 2, ["c", "d"], True),
    ("asc", "c", 2, ["d", "e"], False),
    ("desc", "b", 5, ["a"], False),
    ("desc", "a", 5, [], False),
])
def test_input_items_are_paged_as_openai_pages_them(order, after, limit, ids, has_more):
    items = [{"type": "message", "id": i} for i in "abcde"]
    page = item_page(items, after, limit, order)
    assert [i["id"] for i in page["data"]] == ids and page["has_more"] is has_more
    assert (page["object"], page["first_id"], page["last_id"]) == ("list", ids[0] if ids else None,
                                                                   ids[-1] if ids else None)


def test_paging_after_an_unknown_item_is_a_400():
    with pytest.raises(OpenAIError) as info:
        item_page([{"id": "a"}], "zz", 20, "desc")
    assert (info.value.status, info.value.param) == (400, "after")


def test_reasoning_tokens_are_those_written_before_the_reasoning_ended():
    output = ResponseOutput(with_logprobs=False, reasoning_stream=ReasoningStream())
    pieces = [("<think>", [5]), ("plan", [6, 7]), ("</think>", [8]), ("\nyes", [9]), ("!", [10])]
    texts = [output.split(Event(None, text, ids, None, "stop" if i == len(pieces) - 1 else None))
             for i, (text, ids) in enumerate(pieces)]
    assert "".join(r for r, _ in texts) == "plan" and "".join(a for _, a in texts) == "yes!"
    assert output.reasoning_tokens == 4  # through the step that wrote </think>


def test_item_references_stand_for_the_kept_items_they_name():
    kept = {"msg_1": {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": None}]}}
    request_input = [{"role": "user", "content": "Hi"}, {"type": "item_reference", "id": "msg_1"},
                     {"role": "user", "content": "Again"}]
    assert referenced_ids(request_input) == ["msg_1"] and referenced_ids("Hi") == []
    items = resolved(request_input, kept)
    assert items[1] is kept["msg_1"] and request_items(items)[1]["id"] == "msg_1"
    c = chat({"input": items})
    assert [(m.role, m.text()) for m in c.messages] == [("user", "Hi"), ("assistant", "Hello"), ("user", "Again")]
    with pytest.raises(OpenAIError) as info:
        resolved(request_input, {})
    assert (info.value.status, info.value.param) == (400, "input") and "msg_1" in str(info.value)
