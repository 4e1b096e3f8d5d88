"""gpt-oss's harmony replies, served, through the real `openai` client: a model whose chat template
writes harmony messages (`<|channel|>`: the app reads its replies so, with the reasoning parser
"openai_gptoss", unconfigured) thinks in an analysis message and then calls a tool or answers in a
final message; the reply carries the analysis as `reasoning` and the call as OpenAI's `tool_calls`,
streamed or whole, in Chat Completions and the Responses API; a reasoning and a call fed back are
written as harmony messages again.

The app serves a model that writes a known text (tests/checkpoints.py: write_successor_model), in
a tokenizer that holds harmony's markers as special tokens, as o200k_harmony does: greedy, it writes
`<|channel|>analysis<|message|>` REASONING `<|end|>`, and the grammar (a required call, or an
output format) writes the next message. `<|call|>` and `<|return|>` are EOS in its
generation_config.json, as in gpt-oss's."""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests
from transformers import AutoTokenizer

from tests.checkpoints import DEFAULT_TARGET, write_successor_model, write_tokenizer_with_special_tokens
from tests.serve.api_helpers import streamed_chat
from tests.serve.test_text_then_tool_call_served import NOW, PARAMETERS

pytestmark = pytest.mark.slow

SERVE_APP_ARGS = {"draft_model": None, "speculative_method": None}
HARMONY_TOKENS = ["<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|call|>", "<|return|>"]  # and <|end|>
REASONING = "The user asks the time"
CHAT_TEMPLATE = """{%- if tools %}<|start|>developer<|message|>namespace functions {
{%- for tool in tools %}type {{ tool.function.name }} = (_: {{ tool.function.parameters | tojson }}) => any;{% endfor %}
}<|end|>{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{%- if message.thinking %}<|start|>assistant<|channel|>analysis<|message|>{{ message.thinking }}<|end|>{% endif %}
{%- for call in message.tool_calls %}<|start|>assistant to=functions.{{ call.function.name }}<|channel|>commentary json\
<|message|>{{ call.function.arguments | tojson }}<|call|>{% endfor %}
{%- elif message.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>{{ message.content }}<|end|>
{%- elif message.role == 'tool' %}<|start|>functions.now to=assistant<|channel|>commentary<|message|>\
{{ message.content }}<|end|>
{%- else %}<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>{% endif %}
{%- endfor %}{%- if add_generation_prompt %}<|start|>assistant{% endif %}"""
ANSWER_SCHEMA = {"type": "object", "properties": {"hour": {"type": "integer", "minimum": 0, "maximum": 23}},
                 "required": ["hour"], "additionalProperties": False}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    tokenizer_dir = write_tokenizer_with_special_tokens(tmp_path_factory.mktemp("harmony-tokenizer"), DEFAULT_TARGET,
                                                        HARMONY_TOKENS)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    written = ids("<|start|>assistant")[-1:] + ids(f"<|channel|>analysis<|message|>{REASONING}<|end|>")
    successors = dict(zip(written, written[1:]))
    assert len(successors) == len(written) - 1  # no token is written twice
    path = write_successor_model(tmp_path_factory.mktemp("harmony"), tokenizer_dir, successors, CHAT_TEMPLATE)
    config = json.loads((path / "generation_config.json").read_text())
    ends = [tokenizer.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")]
    config["eos_token_id"] = [*ends, tokenizer.eos_token_id]
    (path / "generation_config.json").write_text(json.dumps(config))
    return path, path


def chat(client, model, **kwargs):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": "What time is it?"}],
                                          temperature=0, max_tokens=96, **kwargs)


def test_a_required_call_comes_after_the_analysis_as_reasoning_and_tool_calls(serve_app, client):
    reply = chat(client, serve_app.model, tools=[NOW], tool_choice="required")
    [choice] = reply.choices
    assert (choice.message.reasoning, choice.message.content, choice.finish_reason) == (REASONING, None, "tool_calls")
    [call] = choice.message.tool_calls
    assert call.function.name == "now" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), PARAMETERS)
    assert 0 < reply.usage.completion_tokens_details.reasoning_tokens < reply.usage.completion_tokens
    streamed = streamed_chat(chat(client, serve_app.model, tools=[NOW], tool_choice="required", stream=True))
    assert (streamed.reasoning, streamed.content, streamed.finish_reason) == (REASONING, "", "tool_calls")
    assert streamed.call_list == [("now", call.function.arguments)]
    assert streamed.kinds.index("call") > max(i for i, kind in enumerate(streamed.kinds) if kind == "reasoning")


def test_an_output_format_binds_the_final_message_not_the_analysis(serve_app, client):
    response_format = {"type": "json_schema", "json_schema": {"name": "time", "schema": ANSWER_SCHEMA}}
    [choice] = chat(client, serve_app.model, response_format=response_format).choices
    assert (choice.message.reasoning, choice.finish_reason) == (REASONING, "stop")
    jsonschema.validate(json.loads(choice.message.content), ANSWER_SCHEMA)


def test_the_responses_api_gives_a_reasoning_item_then_the_call(serve_app, client):
    response = client.responses.create(model=serve_app.model, input="What time is it?", temperature=0,
                                       max_output_tokens=96, tools=[{"type": "function", **NOW["function"]}],
                                       tool_choice="required")
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert response.output[0].content[0].text == REASONING
    assert response.output[1].name == "now"
    jsonschema.validate(json.loads(response.output[1].arguments), PARAMETERS)


def test_a_reasoning_and_a_call_fed_back_are_harmony_messages_again(serve_app):
    messages = [{"role": "user", "content": "What time is it?"},
                {"role": "assistant", "content": "", "reasoning": "Look it up", "tool_calls": [{
                    "id": "call_1", "type": "function", "function": {"name": "now",
                                                                     "arguments": '{"zone": "CET", "local": false}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    tokens = requests.post(f"{serve_app.url}/tokenize", json={"model": serve_app.model, "messages": messages,
                                                                    "tools": [NOW]}, timeout=60).json()["tokens"]
    prompt = requests.post(f"{serve_app.url}/detokenize", json={"model": serve_app.model, "tokens": tokens},
                           timeout=60).json()["prompt"]
    assert ('<|start|>assistant<|channel|>analysis<|message|>Look it up<|end|><|start|>assistant to=functions.now'
            '<|channel|>commentary json<|message|>{"zone": "CET", "local": false}<|call|>') in prompt
