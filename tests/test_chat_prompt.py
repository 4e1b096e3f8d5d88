"""A chat request's template fields reach the model's chat template as vLLM passes them:
`chat_template_kwargs` as template variables (Qwen3's `enable_thinking`), `reasoning_effort` as
one too (and "none" as `enable_thinking` false), and
`continue_final_message` leaves the last assistant message open."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from deployments.chat_prompt import chat_prompt_ids
from deployments.chat_protocol import ChatCompletionRequest
from deployments.tokenize_protocol import TokenizeChatRequest
from deployments.tool_calls import PLAIN
from tests.checkpoints import DEFAULT_TARGET

# The default target's template, plus a Qwen3-style switch for the thinking block.
TEMPLATE = ("{% for d in documents or [] %}<|doc|>{{ d['title'] }}: {{ d['text'] }}\n{% endfor %}"
            "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
            "{% endfor %}{% if reasoning_effort is defined %}<|effort|>{{ reasoning_effort }}\n{% endif %}"
            "{% if add_generation_prompt %}<|assistant|>\n"
            "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
USER = [{"role": "user", "content": "Add two numbers."}]


@pytest.fixture(scope="module")
def tokenizer():
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    tok.chat_template = TEMPLATE
    return tok


def prompt_text(tokenizer, request_class, body: dict) -> str:
    ids = chat_prompt_ids(tokenizer, request_class.model_validate(body), PLAIN, native_tools=False)
    return tokenizer.decode(ids)


@pytest.mark.parametrize("request_class", [ChatCompletionRequest, TokenizeChatRequest])
def test_chat_template_kwargs_are_the_templates_variables(tokenizer, request_class):
    plain = prompt_text(tokenizer, request_class, {"messages": USER})
    no_thinking = prompt_text(tokenizer, request_class, {"messages": USER,
                                                         "chat_template_kwargs": {"enable_thinking": False}})
    assert plain == "<|user|>\nAdd two numbers.<|end|>\n<|assistant|>\n"
    assert no_thinking == plain + "<think>\n\n</think>\n\n"


@pytest.mark.parametrize("request_class", [ChatCompletionRequest, TokenizeChatRequest])
def test_reasoning_effort_is_a_template_variable_and_none_turns_thinking_off(tokenizer, request_class):
    def text(**fields) -> str:
        return prompt_text(tokenizer, request_class, {"messages": USER, **fields})

    low = text(reasoning_effort="low")
    assert "<|effort|>low\n" in low and "<think>" not in low
    off = text(reasoning_effort="none")
    assert off == text(chat_template_kwargs={"reasoning_effort": "none", "enable_thinking": False})
    assert "<think>\n\n</think>" in off
    # the request's own variables win over what the effort implies
    assert "<think>" not in text(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True})
    with pytest.raises(ValidationError, match="reasoning_effort"):
        request_class.model_validate({"messages": USER, "reasoning_effort": "extreme"})


@pytest.mark.parametrize("request_class", [ChatCompletionRequest, TokenizeChatRequest])
def test_continue_final_message_leaves_the_assistant_message_open(tokenizer, request_class):
    messages = USER + [{"role": "assistant", "content": "def add(a, b):"}]
    text = prompt_text(tokenizer, request_class, {"messages": messages, "add_generation_prompt": False,
                                                  "continue_final_message": True})
    assert text == "<|user|>\nAdd two numbers.<|end|>\n<|assistant|>\ndef add(a, b):"


@pytest.mark.parametrize("request_class", [ChatCompletionRequest, TokenizeChatRequest])
def test_documents_reach_the_template_and_special_tokens_are_added_only_when_asked(tokenizer, request_class,
                                                                                  monkeypatch):
    docs = [{"title": "Guide", "text": "Add with +."}]
    text = prompt_text(tokenizer, request_class, {"messages": USER, "documents": docs})
    assert text == "<|doc|>Guide: Add with +.\n<|user|>\nAdd two numbers.<|end|>\n<|assistant|>\n"
    asked, encode = [], tokenizer.encode  # the shipped tokenizer adds no BOS: watch what is asked of it
    monkeypatch.setattr(tokenizer, "encode", lambda text, add_special_tokens: asked.append(add_special_tokens)
                        or encode(text, add_special_tokens=add_special_tokens))
    for given in ({}, {"add_special_tokens": True}):
        chat_prompt_ids(tokenizer, request_class.model_validate({"messages": USER, **given}), PLAIN, native_tools=False)
    assert asked == [False, True]


@pytest.mark.parametrize("body,named", [
    ({"chat_template_kwargs": {"tokenize": True, "add_generation_prompt": False}}, "add_generation_prompt, tokenize"),
    ({"chat_template": "{{ messages }}"}, "model's own chat template only"),
    ({"continue_final_message": True}, "continue_final_message needs add_generation_prompt to be false"),
])
@pytest.mark.parametrize("request_class", [ChatCompletionRequest, TokenizeChatRequest])
def test_template_fields_the_server_owns_or_that_contradict_are_refused(request_class, body, named):
    with pytest.raises(ValidationError, match=named):
        request_class.model_validate({"messages": USER, **body})

