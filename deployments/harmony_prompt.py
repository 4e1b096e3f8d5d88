"""A harmony app's prompt: the messages, tools and reasoning effort as gpt-oss's chat template can
write them. vLLM writes gpt-oss's prompts with openai-harmony rather than the template; this server
renders every prompt with the model's template, so it gives that template what it expects:

- it writes one call a message (the first of `tool_calls`) and names a tool's result by the call
  written before it: an assistant message with several calls becomes one message a call, each
  followed by its result (matched by `tool_call_id`);
- it reads a tool-call message's `content` as its analysis and refuses `content` with `thinking`:
  the reasoning and the preamble (a reply's commentary, which this server returns as `content`)
  become one analysis, in that order;
- it writes each tool's `description` unguarded: a tool without one gets an empty one;
- gpt-oss reasons at low, medium or high effort: another `reasoning_effort` is refused.
"""

from __future__ import annotations

from deployments.openai_errors import OpenAIError

EFFORTS = ("low", "medium", "high")
REASONING_KEYS = ("thinking", "reasoning", "reasoning_content")  # render_messages writes all three


def harmony_messages(messages: list[dict]) -> list[dict]:
    """`messages` (deployments/tool_calls.py: render_messages' dicts) with one call a message."""
    out: list[dict] = []
    at = 0
    while at < len(messages):
        message = messages[at]
        at += 1
        if message["role"] != "assistant" or not message.get("tool_calls"):
            out.append(message)
            continue
        results = []
        while at < len(messages) and messages[at]["role"] == "tool":
            results.append(messages[at])
            at += 1
        out += _one_call_a_message(message, results)
    return out


def _one_call_a_message(message: dict, results: list[dict]) -> list[dict]:
    analysis = "\n".join(text for text in (message.get("thinking"), message["content"]) if text)
    bare = {k: v for k, v in message.items() if k not in REASONING_KEYS} | {"content": ""}
    out: list[dict] = []
    ids = set()
    for n, call in enumerate(message["tool_calls"]):
        out.append(bare | {"tool_calls": [call]} | ({"thinking": analysis} if n == 0 and analysis else {}))
        out += [r for r in results if r.get("tool_call_id") == call.get("id")]
        ids.add(call.get("id"))
    return out + [r for r in results if r.get("tool_call_id") not in ids]


def harmony_tools(tools: list[dict] | None) -> list[dict] | None:
    """`tools` (their dicts), each function with a description."""
    if tools is None:
        return None
    return [t | {"function": {"description": ""} | t["function"]} for t in tools]


def check_reasoning_effort(effort: str | None) -> None:
    """OpenAIError (400) for an effort gpt-oss was not trained at."""
    if effort is not None and effort not in EFFORTS:
        raise OpenAIError(400, f"reasoning_effort {effort!r}: this model reasons at low, medium or high "
                               "effort", param="reasoning_effort")
