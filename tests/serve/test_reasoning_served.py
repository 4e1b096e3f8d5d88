"""A thinking model's reasoning, served (`reasoning_parser: qwen3`), through the real `openai`
client: a reply is reasoning until `</think>`, in the message's and the deltas' `reasoning`
field and in a Responses `reasoning` item; thinking turned off is all answer; an output format
binds the answer, not the reasoning. The test model never writes `</think>`, so every reply here
is cut while thinking; the split at the tag itself is tests/test_reasoning.py's."""

from __future__ import annotations

import pytest

from tests.serve.api_helpers import chat_ids, engine, engine_text, streamed_response  # noqa: F401 - `engine` is a fixture

pytestmark = pytest.mark.slow

SERVE_APP_ARGS = {"reasoning_parser": "qwen3", "draft_model": None, "speculative_method": None}
MESSAGES = [{"role": "user", "content": "Explain the code"}]
MAX_TOKENS = 24
THINKING_OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def raw_output(engine, tokenizer) -> str:  # noqa: F811
    """What the model writes for MESSAGES, greedy: the engine alone, no parser."""
    text, n = engine_text(engine, tokenizer, chat_ids(tokenizer, MESSAGES), MAX_TOKENS)
    assert n == MAX_TOKENS and "</think>" not in text and text.strip()
    return text


def chat(client, model, stream: bool = False, **extra):
    return client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0,
                                          stream=stream, extra_body={"ignore_eos": True, **extra})


def streamed(chunks) -> tuple[str, str]:
    """(reasoning, content) of a streamed chat reply, from its deltas."""
    reasoning, content = [], []
    for chunk in chunks:
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning", None) or "")
            content.append(choice.delta.content or "")
    return "".join(reasoning), "".join(content)


def test_a_reply_cut_while_thinking_is_all_reasoning(serve_app, client, raw_output):
    message = chat(client, serve_app.model).choices[0].message
    assert message.reasoning == raw_output and message.content is None
    assert streamed(chat(client, serve_app.model, stream=True)) == (raw_output, "")


def test_chat_usage_counts_the_reasoning_tokens(serve_app, client):
    assert chat(client, serve_app.model).usage.completion_tokens_details.reasoning_tokens == MAX_TOKENS
    [*_, last] = chat(client, serve_app.model, stream=True, stream_options={"include_usage": True})
    assert (last.usage.completion_tokens, last.usage.completion_tokens_details.reasoning_tokens) == \
        (MAX_TOKENS, MAX_TOKENS)
    off = chat(client, serve_app.model, **THINKING_OFF).usage
    assert (off.completion_tokens, off.completion_tokens_details.reasoning_tokens) == (MAX_TOKENS, 0)


def test_include_reasoning_false_leaves_it_out(serve_app, client):
    message = chat(client, serve_app.model, include_reasoning=False).choices[0].message
    assert message.reasoning is None and message.content is None
    assert streamed(chat(client, serve_app.model, stream=True, include_reasoning=False)) == ("", "")


def test_thinking_turned_off_is_all_answer(serve_app, client, engine, tokenizer):  # noqa: F811
    ids = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False,
                                                         enable_thinking=False), add_special_tokens=False)
    expected, _ = engine_text(engine, tokenizer, ids, MAX_TOKENS)
    message = chat(client, serve_app.model, **THINKING_OFF).choices[0].message
    assert message.content == expected and message.reasoning is None
    assert streamed(chat(client, serve_app.model, stream=True, **THINKING_OFF)) == ("", expected)


def test_an_output_format_binds_the_answer_not_the_reasoning(serve_app, client, raw_output):
    choice = {"structured_outputs": {"choice": ["yes", "no"]}}
    thinking = chat(client, serve_app.model, **choice).choices[0].message
    assert thinking.reasoning == raw_output and thinking.content is None  # free until </think>
    answered = chat(client, serve_app.model, **choice, **THINKING_OFF).choices[0].message
    assert answered.content in ("yes", "no") and answered.reasoning is None


def test_a_response_gives_its_reasoning_item(serve_app, client, raw_output):
    kwargs = dict(model=serve_app.model, input=MESSAGES[0]["content"], max_output_tokens=MAX_TOKENS,
                  temperature=0, extra_body={"ignore_eos": True})
    whole = client.responses.create(**kwargs)
    [item] = whole.output
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.status == "incomplete"
    assert [part.text for part in item.content] == [raw_output] and whole.output_text == ""
    assert whole.status == "incomplete" and whole.usage.output_tokens_details.reasoning_tokens == MAX_TOKENS
    kinds, deltas, final = streamed_response(client, "response.reasoning_text.delta", **kwargs)
    assert "".join(deltas) == raw_output
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.reasoning_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]
    assert [i.model_dump(exclude={"id"}) for i in final.output] == [i.model_dump(exclude={"id"}) for i in whole.output]

