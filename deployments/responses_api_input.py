"""A Responses API request as the chat completion the ingress runs for it: `instructions` and
`input` items become chat messages, function tools and `tool_choice` chat's nested shapes,
`text.format` chat's `response_format`, `max_output_tokens` `max_tokens`. Everything a chat
request checks (the template, tool grammars, sampling fields) is then checked once, the same way.

Input items: messages (a string, or `input_text` / `output_text` parts), `function_call` and
`custom_tool_call` items (an assistant turn's calls, consecutive ones in one turn) and their
`..._output` items (tool turns). Custom tools (`{"type": "custom", "name": ..., "format": ...}`)
become chat's custom tools (deployments/custom_tools.py). A `reasoning` item's text goes with the
assistant turn after it, as that turn's `reasoning` (templates of thinking models may render it).
References to kept items (`item_reference`) were replaced by the items before
(deployments/response_items.py). Other item kinds (images, files) and tools other than functions
and custom tools are a 400 naming the item.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from deployments.chat_protocol import ChatCompletionRequest, ChatMessage
from deployments.custom_tools import function_call
from deployments.openai_errors import OpenAIError
from deployments.responses_api_protocol import NEEDS_STORED_RESPONSES, ResponsesRequest
from deployments.tool_protocol import CustomCall, CustomTool, CustomToolCall, FunctionCall, FunctionDefinition, ToolCall

TEXT_PARTS = ("input_text", "output_text", "text")
CALL_ITEMS = ("function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output")


class MessageItem(BaseModel):
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[dict[str, Any]]


class FunctionCallItem(BaseModel):
    call_id: str
    name: str
    arguments: str


class CustomToolCallInputItem(BaseModel):
    call_id: str
    name: str
    input: str


class FunctionCallOutputItem(BaseModel):
    call_id: str
    output: str | list[dict[str, Any]]


def chat_request(body: ResponsesRequest, history: list[dict[str, Any]] = ()) -> ChatCompletionRequest:
    """The chat completion `body` asks for; OpenAIError (400) for what cannot be one.
    `history`: the stored items of the response `body` continues (`previous_response_id`)."""
    for name in NEEDS_STORED_RESPONSES:
        if getattr(body, name) is not None:
            raise OpenAIError(400, f"{name}: this server keeps no stored conversations or prompts; send "
                                   "the conversation in `input`, or continue a response with "
                                   "previous_response_id", param=name)
    instructions = [ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    fields: dict[str, Any] = {**body.sampling_extras, "messages": instructions + input_messages(body, history),
                              "stream": body.stream, "parallel_tool_calls": body.parallel_tool_calls}
    effort = (body.reasoning or {}).get("effort")
    for name, value in (("max_tokens", body.max_output_tokens), ("temperature", body.temperature),
                        ("top_p", body.top_p), ("user", body.user), ("reasoning_effort", effort)):
        if value is not None:
            fields[name] = value
    if body.wants_logprobs:
        fields |= {"logprobs": True, "top_logprobs": body.top_logprobs or 0}
    if body.tools:
        fields["tools"] = [chat_tool(i, t) for i, t in enumerate(body.tools)]
    if body.tool_choice is not None:
        fields["tool_choice"] = chat_tool_choice(body.tool_choice)
    if body.text is not None and body.text.format is not None:
        fields["response_format"] = response_format(body.text.format)
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise OpenAIError(400, f"{where}: {first['msg']}" if where else first["msg"],
                          param=str(first["loc"][0]) if first["loc"] else None) from None


def input_messages(body: ResponsesRequest, history: list[dict[str, Any]] = ()) -> list[ChatMessage]:
    """The chat messages of `history` (the stored items of the response `body` continues,
    deployments/response_items.py), then of `body`'s input. A reasoning item goes with the
    assistant turn after it; with none after it, it is an assistant turn of its own (the reply
    of a response cut while it reasoned)."""
    own = [{"role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    messages: list[ChatMessage] = []
    call_names: dict[str, str] = {}  # call_id -> function name, for the tool turns that answer them
    reasoning = None  # a reasoning item's, for the assistant turn that follows it
    for i, item in enumerate([*history, *own], start=-len(history)):  # history's indices: < 0
        kind = item.get("type", "message")
        if kind == "reasoning":
            reasoning = "".join(part.get("text", "") for part in item.get("content") or ())
            continue
        if kind == "message":
            m = _parsed(MessageItem, item, i)
            answers = m.role == "assistant"
        elif kind in CALL_ITEMS:
            answers = kind in ("function_call", "custom_tool_call")
        else:
            raise OpenAIError(400, f"input[{i}]: items of type {kind!r} are not supported here (messages, "
                                   f"{', '.join(CALL_ITEMS)} are)", param="input")
        if reasoning is not None and not answers:
            messages.append(ChatMessage(role="assistant", reasoning=reasoning))
            reasoning = None
        if kind == "message":
            messages.append(ChatMessage(role=m.role, content=_text(m.content, i), reasoning=reasoning))
        elif answers:
            c = _parsed(FunctionCallItem if kind == "function_call" else CustomToolCallInputItem, item, i)
            call_names[c.call_id] = c.name
            call = (ToolCall(id=c.call_id, function=FunctionCall(name=c.name, arguments=c.arguments))
                    if kind == "function_call" else function_call(CustomToolCall(id=c.call_id, custom=CustomCall(
                        name=c.name, input=c.input))))
            last = messages[-1] if messages else None
            if reasoning is None and last is not None and last.role == "assistant":  # one turn: its text and calls
                last.tool_calls = (last.tool_calls or []) + [call]
            else:
                messages.append(ChatMessage(role="assistant", tool_calls=[call], reasoning=reasoning))
        else:
            o = _parsed(FunctionCallOutputItem, item, i)
            messages.append(ChatMessage(role="tool", tool_call_id=o.call_id, name=call_names.get(o.call_id),
                                        content=_text(o.output, i)))
        reasoning = None
    if not messages:
        raise OpenAIError(400, "input: give at least one message", param="input")
    if reasoning is not None:
        messages.append(ChatMessage(role="assistant", reasoning=reasoning))
    return messages


def _parsed(model: type[BaseModel], item: dict, index: int):
    try:
        return model.model_validate(item)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise OpenAIError(400, f"input[{index}].{where}: {first['msg']}", param="input") from None


def _text(content: str | list[dict[str, Any]], index: int) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for part in content:
        kind = part.get("type")
        if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
            raise OpenAIError(400, f"input[{index}]: content of type {kind!r} is not supported; this "
                                   "model reads text (input_text) only", param="input")
        texts.append(part["text"])
    return "".join(texts)


def chat_tool(index: int, tool: dict[str, Any]) -> dict[str, Any]:
    """A Responses tool (`name`, `parameters` or `format` beside `type`) in chat's nested shape."""
    kind = tool.get("type")
    if kind not in ("function", "custom"):
        raise OpenAIError(400, f"tools[{index}]: tools of type {kind!r} are not supported "
                               "here; function and custom tools are", param="tools")
    fields = {k: tool[k] for k in (FunctionDefinition if kind == "function" else CustomTool).model_fields if k in tool}
    if "name" not in fields:
        raise OpenAIError(400, f"tools[{index}]: a {kind} tool needs a name", param="tools")
    return {"type": kind, kind: fields}


def chat_tool_choice(choice: str | dict[str, Any]) -> str | dict[str, Any]:
    """The Responses API's `tool_choice` in chat's nested shape: a function named at the top level, or
    `allowed_tools` with its mode and tools beside its type."""
    if isinstance(choice, str):
        return choice
    if _names_a_tool(choice):
        return _named_tool(choice)
    tools = choice.get("tools")
    if choice.get("type") == "allowed_tools" and choice.get("mode") in ("auto", "required") and tools and all(
            isinstance(t, dict) and _names_a_tool(t) for t in tools):
        return {"type": "allowed_tools", "allowed_tools": {"mode": choice["mode"],
                                                           "tools": [_named_tool(t) for t in tools]}}
    raise OpenAIError(400, 'tool_choice: give "none", "auto", "required", {"type": "function" or "custom", "name": '
                           '...} or {"type": "allowed_tools", "mode": "auto" or "required", "tools": [{"type": '
                           f'"function", "name": ...}}, ...]}}; got {choice}', param="tool_choice")


def _names_a_tool(choice: dict[str, Any]) -> bool:
    return choice.get("type") in ("function", "custom") and isinstance(choice.get("name"), str)


def _named_tool(choice: dict[str, Any]) -> dict[str, Any]:
    return {"type": choice["type"], choice["type"]: {"name": choice["name"]}}


def response_format(text_format) -> dict[str, Any]:
    if text_format.type != "json_schema":
        return {"type": text_format.type}
    return {"type": "json_schema", "json_schema": {
        "name": text_format.name, "description": text_format.description,
        "schema": text_format.schema_, "strict": text_format.strict}}


# A chat request's field names in errors, as a Responses request names them.
RESPONSES_PARAMS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
                    "logprobs": "include"}


def as_responses_error(exc: OpenAIError) -> OpenAIError:
    exc.param = RESPONSES_PARAMS.get(exc.param, exc.param)
    return exc
