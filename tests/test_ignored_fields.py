"""A request field this server does not read is kept aside and named for the log (vLLM logs
them too), not silently lost: three vLLM fields went unnoticed that way."""

from __future__ import annotations

from deployments.chat_protocol import ChatCompletionRequest
from deployments.protocol import CompletionRequest

USER = [{"role": "user", "content": "x"}]


def test_fields_this_server_does_not_read_are_named():
    body = ChatCompletionRequest.model_validate({"messages": USER, "temperature": 0.5, "best_of_n": 3,
                                                 "guided_decoding_backend": "xgrammar", "unused": None})
    assert body.ignored_fields == ["best_of_n", "guided_decoding_backend"]  # a null counts as unset
    assert body.temperature == 0.5
    assert ChatCompletionRequest.model_validate({"messages": USER}).ignored_fields == []
    assert CompletionRequest.model_validate({"prompt": "x", "max_tokens": 3, "min_tokenz": 2}).ignored_fields == [
        "min_tokenz"]
