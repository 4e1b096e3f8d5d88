"""Text, then a tool call, served: under `tool_choice: "auto"`, a model whose calls open with a
tag (Qwen's and Hermes' `<tool_call>`) may write a sentence first, and the reply has both, as vLLM's
hermes, qwen3_coder and glm47 parsers give them: `content` with the sentence, `tool_calls` with the call.

The app serves a model that writes a known text (tests/checkpoints.py: write_successor_model):
greedy, it writes "Checking." and then `<tool_call>`; the call grammar writes the rest, a call of
the one tool. Its chat template teaches Hermes' JSON calls, Qwen3-Coder's XML parameters
(`<function=`) or GLM-4.7's (`<arg_key>`), and the app reads calls as the template writes them.
In `hermes_special`, the tokenizer holds `<tool_call>` and `</tool_call>` as special tokens
(as Hermes-2-Pro's and Mistral's hold their markers): the grammar lets the model write its own
marker token, and the reply reads it (deployments/markup_tokens.py). In `kimi_k2`, the model
writes Kimi K2's special tokens, and its call's id is the name it writes, `functions.now:N`. In
`gemma4` and `cohere_command3`, its markers (and Gemma 4's string quote, `<|"|>`) are special tokens,
as in those models' tokenizers, and the call is in Gemma 4's notation or in Cohere's action list."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from transformers import AutoTokenizer

from tests.checkpoints import DEFAULT_TARGET, write_successor_model, write_tokenizer_with_special_tokens
from tests.serve.api_helpers import streamed_chat, streamed_response

pytestmark = pytest.mark.slow

SERVE_APP_ARGS = {"draft_model": None, "speculative_method": None}
SENTENCE = "Checking."
CALL_FORMS = {  # how each convention's template teaches a call
    "hermes": '<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>',
    "hermes_special": '<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=NAME>\n<parameter=NAME>\nVALUE\n</parameter>\n</function>\n</tool_call>",
    "glm47": "<tool_call>NAME<arg_key>NAME</arg_key><arg_value>VALUE</arg_value></tool_call>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>"
               "ARGUMENTS<|tool_call_end|><|tool_calls_section_end|>",
    "gemma4": '<|tool_call>call:NAME{KEY:<|"|>TEXT<|"|>}<tool_call|>',
    "cohere_command3": '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": ..., "parameters": ...}\n]'
                       '<|END_ACTION|>',
}
KIMI_MARKERS = ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                "<|tool_call_end|>", "<|tool_calls_section_end|>"]
SPECIAL_TOKENS = {"hermes_special": ["<tool_call>", "</tool_call>"], "kimi_k2": KIMI_MARKERS,
                  "gemma4": ["<|tool_call>", "<tool_call|>", '<|"|>'],
                  "cohere_command3": ["<|START_ACTION|>", "<|END_ACTION|>"]}
# what the model writes after SENTENCE, else <tool_call>
TAG = {"kimi_k2": "<|tool_calls_section_begin|>", "gemma4": "<|tool_call>", "cohere_command3": "<|START_ACTION|>"}
WRITTEN = {  # how each begins the call of `now`
    "hermes": "<tool_call>\n{", "hermes_special": "<tool_call>\n{",
    "qwen3_coder": "<tool_call>\n<function=now>\n<parameter=zone>\n",
    "glm47": "<tool_call>now<arg_key>zone</arg_key><arg_value>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.now:",
    "gemma4": "<|tool_call>call:now{local:",  # keys sorted, as Gemma 4's template writes them
    "cohere_command3": '<|START_ACTION|>[\n    {',
}
CHAT_TEMPLATE = ("{% if tools %}<|system|>\nTo call a function, write CALL_FORM. The functions: {{ tools | tojson }}"
                 "<|end|>\n{% endif %}"
                 "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
# Values the grammar bounds: the model's greedy choice past `<tool_call>` is arbitrary.
PARAMETERS = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}, "local": {"type": "boolean"}},
              "required": ["zone", "local"], "additionalProperties": False}
NOW = {"type": "function", "function": {"name": "now", "description": "The time now.", "parameters": PARAMETERS}}


@pytest.fixture(scope="module", params=list(CALL_FORMS))
def convention(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def checkpoints(convention, tmp_path_factory):
    """This module's app serves the model that writes SENTENCE, then its convention's tag, with a
    template that teaches calls in each convention (an app for each)."""
    tokenizer_dir = DEFAULT_TARGET
    if convention in SPECIAL_TOKENS:
        tokenizer_dir = write_tokenizer_with_special_tokens(tmp_path_factory.mktemp("tokenizer"), DEFAULT_TARGET,
                                                            SPECIAL_TOKENS[convention])
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    written = tokenizer.encode("<|assistant|>\n")[-1:] + tokenizer.encode(SENTENCE + TAG.get(convention, "<tool_call>"))
    if convention in SPECIAL_TOKENS:
        assert written[-1] in tokenizer.all_special_ids  # the marker is one special token
    successors = dict(zip(written, written[1:]))
    assert len(successors) == len(written) - 1  # no token is written twice
    template = CHAT_TEMPLATE.replace("CALL_FORM", CALL_FORMS[convention])
    path = write_successor_model(tmp_path_factory.mktemp(convention), tokenizer_dir, successors, template)
    return path, path


def valid_arguments(arguments: str) -> dict:
    """The arguments, parsed and checked against the tool's schema: a string and a boolean, typed."""
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, PARAMETERS)
    return parsed


def request(model: str) -> dict:
    return dict(model=model, messages=[{"role": "user", "content": "What time is it?"}], tools=[NOW],
                tool_choice="auto", parallel_tool_calls=False, temperature=0, max_tokens=64)


def test_the_reply_has_the_text_and_then_the_call(serve_app, client, convention):
    reply = client.chat.completions.create(**request(serve_app.model), logprobs=True)
    [choice] = reply.choices
    written = "".join(t.token for t in choice.logprobs.content)  # the call as the model wrote it
    assert written.startswith(SENTENCE + WRITTEN[convention]), written
    assert (choice.message.content, choice.finish_reason) == (SENTENCE, "tool_calls")
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name) == ("function", "now") and valid_arguments(call.function.arguments)
    assert re.fullmatch(r"functions\.now:\d+", call.id) if convention == "kimi_k2" else call.id.startswith("call_")


def test_the_stream_sends_the_text_first_then_the_call(serve_app, client):
    whole = client.chat.completions.create(**request(serve_app.model)).choices[0].message.tool_calls[0]
    streamed = streamed_chat(client.chat.completions.create(**request(serve_app.model), stream=True))
    assert (streamed.content, streamed.finish_reason) == (SENTENCE, "tool_calls")
    assert streamed.kinds == sorted(streamed.kinds, key=["content", "call"].index)  # the text, then the call
    assert streamed.call_list == [("now", whole.function.arguments)]


def test_a_response_gives_the_message_item_then_the_call_item(serve_app, client):
    kwargs = dict(model=serve_app.model, input="What time is it?", tools=[{"type": "function", **NOW["function"]}],
                  parallel_tool_calls=False, temperature=0, max_output_tokens=64)
    whole = client.responses.create(**kwargs)
    message, call = whole.output
    assert (message.type, message.content[0].text, call.type, call.name) == \
        ("message", SENTENCE, "function_call", "now") and valid_arguments(call.arguments)
    kinds, deltas, final = streamed_response(client, "response.output_text.delta", **kwargs)
    assert "".join(deltas) == SENTENCE and kinds[-1] == "response.completed"
    message_done = kinds.index("response.output_item.done")
    assert message_done < kinds.index("response.function_call_arguments.done")
    assert kinds[message_done + 1] == "response.output_item.added"  # the call's item, after the message's
    assert [(i.type, i.status) for i in final.output] == [("message", "completed"), ("function_call", "completed")]
    assert final.output[1].arguments == call.arguments
