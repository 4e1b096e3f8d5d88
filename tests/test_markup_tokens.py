"""Markup tokens (deployments/markup_tokens.py): a tokenizer that holds its model's tool-call
markers (or reasoning tags) as special tokens. The guided vocabulary lets formats write those tokens, the
detokenizer writes them out, and the other special tokens (EOS, turn markers) stay out of both."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import AutoTokenizer

from app.guided.compiler import compile_regex, regex_for_format
from app.guided.vocabulary import build_guided_vocabulary
from deployments.chat_protocol import ChatCompletionRequest
from deployments.detokenizer import IncrementalDetokenizer
from deployments.markup_tokens import markup_tokens, skipped_special_ids
from deployments.builder import text_conventions
from deployments.tool_calls import HERMES, MISTRAL, PLAIN, requested_tool_format
from tests.checkpoints import DEFAULT_TARGET, write_tokenizer_with_special_tokens

NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = write_tokenizer_with_special_tokens(tmp_path_factory.mktemp("tokenizer"), DEFAULT_TARGET,
                                               ["<tool_call>", "</tool_call>"])
    return AutoTokenizer.from_pretrained(path)


def test_the_markers_special_tokens_are_markup_and_no_others(tokenizer):
    assert markup_tokens(tokenizer, HERMES.markers) == ("</tool_call>", "<tool_call>")
    assert markup_tokens(tokenizer, MISTRAL.markers) == ()  # its `[TOOL_CALLS]` is not in this tokenizer
    ends_with_eos = dataclasses.replace(HERMES, suffix="</tool_call><|endoftext|><|end|>")
    assert markup_tokens(tokenizer, ends_with_eos.markers) == ("</tool_call>", "<tool_call>", "<|end|>")  # never EOS


def test_the_app_keeps_the_reasoning_tags_only_with_a_reasoning_parser(tmp_path):
    path = write_tokenizer_with_special_tokens(tmp_path, DEFAULT_TARGET, ["<think>", "</think>", "<tool_call>"])
    assert text_conventions(str(path), "hermes", "qwen3") == (HERMES, "qwen3", ("</think>", "<think>", "<tool_call>"))
    assert text_conventions(str(path), "hermes", None) == (HERMES, None, ("<tool_call>",))
    assert text_conventions(str(path), None, "deepseek_r1") == (PLAIN, "deepseek_r1", ("</think>", "<think>"))


def test_a_markup_token_is_written_as_its_text_and_opens_a_required_call(tokenizer):
    open_id = tokenizer.convert_tokens_to_ids("<tool_call>")
    end_id = tokenizer.convert_tokens_to_ids("<|end|>")
    plain = build_guided_vocabulary(tokenizer)
    assert plain.token_bytes[open_id] is None
    vocab = build_guided_vocabulary(tokenizer, markup_tokens=markup_tokens(tokenizer, HERMES.markers))
    assert vocab.token_bytes[open_id] == b"<tool_call>"
    assert vocab.token_bytes[end_id] is None and vocab.token_bytes[tokenizer.eos_token_id] is None
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=[NOW], tool_choice="required")
    index = compile_regex(regex_for_format(requested_tool_format(request, HERMES).format), vocab)
    assert open_id in index.get_allowed_tokens(index.get_initial_state())


def test_the_detokenizer_writes_markup_and_skips_the_other_special_tokens(tokenizer):
    ids = tokenizer.encode("<tool_call>\n{}</tool_call><|end|>")
    markup = markup_tokens(tokenizer, HERMES.markers)

    def text(**kwargs) -> str:
        detokenizer = IncrementalDetokenizer(tokenizer, **kwargs)
        return detokenizer.add_tokens(ids) + detokenizer.finish()

    assert text(skipped_special_ids=skipped_special_ids(tokenizer, markup)) == "<tool_call>\n{}</tool_call>"
    assert text() == "\n{}"
    assert text(skip_special_tokens=False) == "<tool_call>\n{}</tool_call><|end|>"
    assert text(skip_special_tokens=False, skipped_special_ids=skipped_special_ids(tokenizer, markup)) == \
        "<tool_call>\n{}</tool_call><|end|>"
    assert skipped_special_ids(tokenizer, ()) is None
