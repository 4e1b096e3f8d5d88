"""A thinking model's reasoning, served (`reasoning_parser: qwen3`), through the real `openai`
client: a reply is reasoning until `</think>`, in the message's and the deltas' `reasoning`
field and in a Responses `reasoning` item; thinking turned off is all answer; an output format
or a tool call binds the answer, not the reasoning.

The app serves a model that writes a known text (tests/checkpoints.py: write_successor_model):
greedy, it thinks "The capital of France", writes `</think>`, answers "Paris." and stops. With
thinking off (or `reasoning_effort: "none"`) its prompt ends after an empty
`<think>\\n\\n</think>\\n\\n`, as Qwen3's does, and it answers at once. A stream splits that
text at the tag: every reasoning delta comes before the first content delta. How many deltas it
takes depends on the machine (a reader that falls behind gets the steps it missed merged into
one), so no test here counts them: tests/test_reasoning.py feeds the parser piece by piece."""

from __future__ import annotations

import json

import pytest

from tests.checkpoints import DEFAULT_TARGET, write_successor_model
from tests.serve.api_helpers import StreamedChat, default_tokenizer, streamed_chat, streamed_response, token_ids

pytestmark = pytest.mark.slow

SERVE_APP_ARGS = {"reasoning_parser": "qwen3", "draft_model": None, "speculative_method": None}
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}
REASONING, ANSWER = "The capital of France", "Paris."
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% if enable_thinking is defined "
                 "and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}



@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """This module's app serves the model that writes REASONING, `</think>`, ANSWER."""
    thinking_prompt_end = token_ids("<|assistant|>\n")[-1]
    answering_prompt_end = token_ids("<|assistant|>\n<think>\n\n</think>\n\n")[-1]
    thought = token_ids(REASONING) + token_ids("</think>")
    answer = token_ids(ANSWER) + [default_tokenizer().eos_token_id]
    successors = dict(zip([thinking_prompt_end] + thought + answer, thought + answer))
    successors[answering_prompt_end] = answer[0]
    assert len(successors) == len(thought) + len(answer) + 1  # no token is written twice
    path = write_successor_model(tmp_path_factory.mktemp("thinker"), DEFAULT_TARGET, successors, CHAT_TEMPLATE)
    return path, path


def chat(client, model, stream: bool = False, **extra):
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=64, temperature=0,
                                          stream=stream, extra_body=extra)


def streamed(chunks) -> StreamedChat:
    """A streamed chat reply, assembled; asserts that no reasoning delta follows content."""
    reply = streamed_chat(chunks)
    assert reply.kinds == sorted(reply.kinds, key=["reasoning", "content", "call"].index), reply.kinds
    return reply


def test_the_reasoning_splits_from_the_answer_at_the_tag(serve_app, client):
    reply = chat(client, serve_app.model)
    [choice] = reply.choices
    assert (choice.message.reasoning, choice.message.content, choice.finish_reason) == (REASONING, ANSWER, "stop")
    thought = len(token_ids(REASONING) + token_ids("</think>"))
    assert reply.usage.completion_tokens_details.reasoning_tokens == thought
    assert reply.usage.completion_tokens == thought + len(token_ids(ANSWER)) + 1  # and the EOS
    streamed_reply = streamed(chat(client, serve_app.model, stream=True, stream_options={"include_usage": True}))
    assert (streamed_reply.reasoning, streamed_reply.content) == (REASONING, ANSWER)
    usage = streamed_reply.last_chunk.usage
    assert (usage.completion_tokens, usage.completion_tokens_details) == \
        (reply.usage.completion_tokens, reply.usage.completion_tokens_details)


def test_a_reply_cut_while_thinking_is_all_reasoning(serve_app, client):
    [choice] = chat(client, serve_app.model, max_tokens=4).choices
    assert (choice.message.reasoning, choice.message.content, choice.finish_reason) == ("The capital", None, "length")
    cut = streamed(chat(client, serve_app.model, stream=True, max_tokens=4))
    assert (cut.reasoning, cut.content, cut.finish_reason) == ("The capital", "", "length")


def test_a_beam_search_reply_splits_and_counts_its_reasoning(serve_app, client):
    """Two beams, the model's text first; usage counts the tokens of both, and the reasoning's."""
    reply = chat(client, serve_app.model, use_beam_search=True, n=2)
    best, second = reply.choices
    assert (best.message.reasoning, best.message.content) == (REASONING, ANSWER)
    thought = len(token_ids(REASONING) + token_ids("</think>"))
    second_tokens = reply.usage.completion_tokens - (thought + len(token_ids(ANSWER)) + 1)  # less the EOS too
    second_thought = reply.usage.completion_tokens_details.reasoning_tokens - thought
    if second.message.content:  # the tag closed its reasoning: some of its tokens were the answer
        assert 0 < second_thought < second_tokens
    else:
        assert second_thought == second_tokens


def test_include_reasoning_false_leaves_it_out(serve_app, client):
    message = chat(client, serve_app.model, include_reasoning=False).choices[0].message
    assert (message.reasoning, message.content) == (None, ANSWER)
    answer_only = streamed(chat(client, serve_app.model, stream=True, include_reasoning=False))
    assert (answer_only.kinds[0], answer_only.reasoning, answer_only.content) == ("content", "", ANSWER)


def test_thinking_turned_off_is_all_answer(serve_app, client):
    reply = chat(client, serve_app.model, **THINKING_OFF)
    assert (reply.choices[0].message.content, reply.choices[0].message.reasoning) == (ANSWER, None)
    assert reply.usage.completion_tokens_details.reasoning_tokens == 0
    answer_only = streamed(chat(client, serve_app.model, stream=True, **THINKING_OFF))
    assert (answer_only.kinds[0], answer_only.reasoning, answer_only.content) == ("content", "", ANSWER)
    effortless = client.chat.completions.create(model=serve_app.model, messages=MESSAGES, max_tokens=64,
                                                temperature=0, reasoning_effort="none").choices[0].message
    assert (effortless.content, effortless.reasoning) == (ANSWER, None)  # "none" implies enable_thinking false


def test_an_output_format_binds_the_answer_not_the_reasoning(serve_app, client):
    choice = {"structured_outputs": {"choice": ["yes", "no"]}}
    thinking = chat(client, serve_app.model, **choice).choices[0].message
    assert thinking.reasoning == REASONING and thinking.content in ("yes", "no")
    answered = chat(client, serve_app.model, **choice, **THINKING_OFF).choices[0].message
    assert answered.content in ("yes", "no") and answered.reasoning is None


def test_a_tool_call_follows_the_reasoning(serve_app, client):
    kwargs = dict(model=serve_app.model, messages=MESSAGES, tools=[WEATHER], tool_choice="required",
                  temperature=0, max_tokens=200)
    reply = client.chat.completions.create(**kwargs)
    [choice] = reply.choices
    assert (choice.message.reasoning, choice.message.content, choice.finish_reason) == (REASONING, None, "tool_calls")
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments)["city"], str)
    streamed_call = streamed(client.chat.completions.create(**kwargs, stream=True))
    assert (streamed_call.reasoning, streamed_call.call_list) == (REASONING, [(call.function.name, call.function.arguments)])


def test_a_response_gives_its_reasoning_item_then_its_message(serve_app, client):
    kwargs = dict(model=serve_app.model, input=MESSAGES[0]["content"], max_output_tokens=64, temperature=0)
    whole = client.responses.create(**kwargs)
    reasoning, message = whole.output
    assert (reasoning.type, reasoning.status, [part.text for part in reasoning.content]) == \
        ("reasoning", "completed", [REASONING])
    assert reasoning.id.startswith("rs_") and whole.output_text == ANSWER and whole.status == "completed"
    assert whole.usage.output_tokens_details.reasoning_tokens == len(token_ids(REASONING) + token_ids("</think>"))
    kinds, deltas, final = streamed_response(client, "response.reasoning_text.delta", **kwargs)
    assert "".join(deltas) == REASONING
    closed, opened = kinds.index("response.reasoning_text.done"), kinds.index("response.output_text.delta")
    assert closed < opened and kinds[-1] == "response.completed"
    assert [(i.type, i.status, [c.text for c in i.content]) for i in final.output] == \
        [("reasoning", "completed", [REASONING]), ("message", "completed", [ANSWER])]

    [item] = client.responses.create(**{**kwargs, "max_output_tokens": 4}).output
    assert (item.type, item.status, item.content[0].text) == ("reasoning", "incomplete", "The capital")
