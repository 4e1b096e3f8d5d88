"""A harmony app's prompt (deployments/harmony_prompt.py): what gpt-oss's chat template is given.

TEMPLATE is written here to the real template's constraints (checked by hand against gpt-oss's
chat_template.jinja, 2026-12-07): it writes a tool's description unguarded, a tool-call message's
content or thinking as its analysis (refusing both), only its first call, and names a tool result by
the call written before it. A reply this server returned (reasoning, a preamble as content, a call)
must go back through it as it stood, and every call and result keep their names."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from deployments.chat_prompt import chat_prompt_ids
from deployments.chat_protocol import ChatCompletionRequest
from deployments.openai_errors import OpenAIError
from deployments.tool_calls import HARMONY, HERMES
from tests.checkpoints import DEFAULT_TARGET, write_tokenizer_with_special_tokens
from tests.serve.test_harmony_served import HARMONY_TOKENS

TEMPLATE = """Reasoning: {{ reasoning_effort | default("medium") }}
{%- if tools %}<|start|>developer<|message|>{% for tool in tools %}{{ "// " + tool.function.description + "\\n" }}\
type {{ tool.function.name }};{% endfor %}<|end|>{% endif %}
{%- set last_call = namespace(name=none) %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}
{%- if message.content and message.thinking %}{{ raise_exception("Cannot pass both content and thinking") }}{% endif %}
{%- if message.content or message.thinking %}\
<|start|>assistant<|channel|>analysis<|message|>{{ message.content or message.thinking }}<|end|>{% endif %}
{%- set call = message.tool_calls[0].function %}\
<|start|>assistant to=functions.{{ call.name }}<|channel|>commentary json\
<|message|>{{ call.arguments | tojson }}<|call|>
{%- set last_call.name = call.name %}
{%- elif message.role == "tool" %}\
<|start|>functions.{{ last_call.name }} to=assistant<|channel|>commentary<|message|>{{ message.content }}<|end|>
{%- else %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>{% endif %}
{%- endfor %}{% if add_generation_prompt %}<|start|>assistant{% endif %}"""

NOW = {"type": "function", "function": {"name": "now", "description": "The time in a zone",
                                        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}
ZONE = {"type": "function", "function": {"name": "zone"}}  # no description
USER = {"role": "user", "content": "What time is it here?"}


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = write_tokenizer_with_special_tokens(tmp_path_factory.mktemp("harmony-prompt"), DEFAULT_TARGET,
                                               HARMONY_TOKENS)
    loaded = AutoTokenizer.from_pretrained(path)
    loaded.chat_template = TEMPLATE
    return loaded


def prompt(tokenizer, syntax=HARMONY, **fields) -> str:
    body = ChatCompletionRequest(model="m", **fields)
    return tokenizer.decode(chat_prompt_ids(tokenizer, body, syntax, native_tools=True))


def test_a_reply_with_reasoning_a_preamble_and_a_call_goes_back_as_one_analysis_then_the_call(tokenizer):
    reply = {"role": "assistant", "reasoning": "The user asks the time.", "content": "Let me look.",
             "tool_calls": [call("call_1", "now", '{"zone": "UTC"}')]}
    text = prompt(tokenizer, messages=[USER, reply, {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}],
                  tools=[NOW])
    assert text.endswith("<|start|>assistant<|channel|>analysis<|message|>The user asks the time.\nLet me look.<|end|>"
                         '<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{"zone": "UTC"}'
                         "<|call|>"
                         "<|start|>functions.now to=assistant<|channel|>commentary<|message|>12:00<|end|>"
                         "<|start|>assistant")


def test_each_of_several_calls_is_written_and_followed_by_its_own_result(tokenizer):
    reply = {"role": "assistant", "content": None, "reasoning": "Two lookups.",
             "tool_calls": [call("call_1", "zone", "{}"), call("call_2", "now", '{"zone": "CET"}')]}
    results = [{"role": "tool", "tool_call_id": "call_2", "content": "13:00"},  # in the other order
               {"role": "tool", "tool_call_id": "call_1", "content": "CET"}]
    text = prompt(tokenizer, messages=[USER, reply, *results], tools=[NOW, ZONE])
    assert text.endswith("<|start|>assistant<|channel|>analysis<|message|>Two lookups.<|end|>"
                         "<|start|>assistant to=functions.zone<|channel|>commentary json<|message|>{}<|call|>"
                         "<|start|>functions.zone to=assistant<|channel|>commentary<|message|>CET<|end|>"
                         '<|start|>assistant to=functions.now<|channel|>commentary json<|message|>{"zone": "CET"}'
                         "<|call|><|start|>functions.now to=assistant<|channel|>commentary<|message|>13:00<|end|>"
                         "<|start|>assistant")


def test_a_tool_without_a_description_is_written_with_an_empty_one(tokenizer):
    assert "// The time in a zone\ntype now;// \ntype zone;" in prompt(tokenizer, messages=[USER], tools=[NOW, ZONE])


def test_the_same_messages_for_a_template_of_another_convention_are_given_as_they_are(tokenizer):
    reply = {"role": "assistant", "reasoning": "r", "content": "c", "tool_calls": [call("call_1", "now", "{}")]}
    with pytest.raises(OpenAIError, match="Cannot pass both content and thinking"):
        prompt(tokenizer, syntax=HERMES, tools=[NOW],
               messages=[USER, reply, {"role": "tool", "tool_call_id": "call_1", "content": "x"}])


@pytest.mark.parametrize("effort", ["low", "medium", "high"])
def test_gpt_oss_efforts_reach_the_template(tokenizer, effort):
    assert prompt(tokenizer, messages=[USER], reasoning_effort=effort).startswith(f"Reasoning: {effort}")


@pytest.mark.parametrize("fields", [{"reasoning_effort": "none"}, {"reasoning_effort": "minimal"},
                                    {"reasoning_effort": "xhigh"},
                                    {"chat_template_kwargs": {"reasoning_effort": "max"}}])
def test_an_effort_gpt_oss_was_not_trained_at_is_refused(tokenizer, fields):
    with pytest.raises(OpenAIError) as refused:
        prompt(tokenizer, messages=[USER], **fields)
    assert (refused.value.status, refused.value.param) == (400, "reasoning_effort")
    assert "low, medium or high" in str(refused.value)
