"""A choice's events: every output token reaches an event, even a token whose text is held."""

from __future__ import annotations

from types import SimpleNamespace

from deployments.choices import Choice
from deployments.detokenizer import IncrementalDetokenizer
from tests.test_detokenizer import ByteTokenizer


def output(token_ids: list[int], n: int, finished: bool = False):
    return SimpleNamespace(new_token_ids=token_ids, num_output_tokens=n, num_cached_tokens=0, finished=finished,
                           finish_reason="stop" if finished else None, stop_token_id=None, new_logprobs=None,
                           prompt_logprobs=None)


def test_a_token_whose_text_is_held_comes_with_the_next_event():
    tok = ByteTokenizer()
    choice = Choice(0, 0, [], stream=None, detok=IncrementalDetokenizer(tok),
                    timer=SimpleNamespace(on_tokens=lambda n: None))
    first, second = tok.encode("é")  # one character, two tokens: the first alone writes nothing
    assert choice.advance(output([tok.encode("a")[0], first], 2)).token_ids == [tok.encode("a")[0], first]
    assert choice.advance(output([second], 3)) is not None  # "é" is whole now
    assert choice.advance(output([first], 4)) is None
    event = choice.advance(output([second, tok.EOS], 6, finished=True))
    assert (event.text, event.token_ids, event.finish_reason) == ("é", [first, second, tok.EOS], "stop")
