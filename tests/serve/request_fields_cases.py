"""vLLM's request fields through the served app and the real `openai` client: `bad_words`,
`cache_salt` with usage's cached tokens, `request_id`, chat's `echo`, `continuous_usage_stats`.

Imported by tests/serve/test_openai_api.py so that they run against that module's app."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

from tests.serve.api_helpers import PROMPTS, engine_text, wait_for_free_kv


def test_bad_words_are_never_written(serve_app, client, engine, tokenizer):
    """vLLM's `bad_words`: the word's token sequences (as it starts the text, and after a space)
    never appear in the output, which follows greedy decoding until one would."""
    prompt = PROMPTS[0]
    full, _ = engine_text(engine, tokenizer, tokenizer.encode(prompt), 24)
    word = next(w for w in full.split() if len(w) > 1)
    r = client.completions.create(model=serve_app.model, prompt=prompt, max_tokens=24, temperature=0, logprobs=0,
                                  extra_body={"bad_words": [word], "return_tokens_as_token_ids": True})
    ids = [int(t.removeprefix("token_id:")) for t in r.choices[0].logprobs.tokens]
    for sequence in (tokenizer.encode(word, add_special_tokens=False),
                     tokenizer.encode(" " + word, add_special_tokens=False)):
        assert not any(ids[i:i + len(sequence)] == sequence for i in range(len(ids))), (word, sequence, ids)
    assert r.choices[0].text != full


def test_usage_counts_cached_prompt_tokens_and_a_cache_salt_keeps_them_apart(serve_app, client):
    """OpenAI's `prompt_tokens_details.cached_tokens`; vLLM's `cache_salt`: requests share
    prefix-cache blocks only within one salt."""
    prompt = f"{uuid.uuid4().hex} " + "The quick brown fox jumps over the lazy dog. " * 8

    def cached(**extra) -> int:
        r = client.completions.create(model=serve_app.model, prompt=prompt, max_tokens=1, extra_body=extra)
        assert r.usage.prompt_tokens_details.cached_tokens < r.usage.prompt_tokens  # the last is computed
        return r.usage.prompt_tokens_details.cached_tokens

    assert cached() == 0
    assert cached() > 0
    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-a") > 0
    assert cached(cache_salt="tenant-b") == 0
    r = client.responses.create(model=serve_app.model, input=prompt, max_output_tokens=1)
    r = client.responses.create(model=serve_app.model, input=prompt, max_output_tokens=1)
    assert r.usage.input_tokens_details.cached_tokens > 0


def test_a_clients_request_id_names_the_response_and_two_clients_may_send_the_same(serve_app, client):
    """vLLM's `request_id` (else the X-Request-Id header, which Serve sets to its own request id
    when the client did not): the response's id. The engine's ids stay unique, so the same id
    sent twice at once runs twice."""
    def chat(**kwargs):
        return client.chat.completions.create(model=serve_app.model, max_tokens=24, temperature=0,
                                              messages=[{"role": "user", "content": "Say something"}], **kwargs)

    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: chat(extra_body={"request_id": "same-id"}), range(2)))
    assert [r.id for r in both] == ["chatcmpl-same-id"] * 2
    assert both[0].choices[0].message.content == both[1].choices[0].message.content
    assert chat(extra_body={"request_id": "body"}, extra_headers={"X-Request-Id": "header"}).id == "chatcmpl-body"
    assert chat(extra_headers={"X-Request-Id": "header"}).id == "chatcmpl-header"
    done = client.completions.create(model=serve_app.model, prompt="x", max_tokens=1, extra_body={"request_id": "c1"})
    assert done.id == "cmpl-c1"
    assert client.responses.create(model=serve_app.model, input="x", max_output_tokens=1,
                                   extra_body={"request_id": "r1"}).id == "resp_r1"
    assert chat().id.startswith("chatcmpl-")
    wait_for_free_kv(serve_app)


def test_chat_echo_puts_the_continued_assistant_message_before_the_reply(serve_app, client):
    """vLLM's chat `echo`, with `continue_final_message`: the reply reads as the whole message."""
    messages = [{"role": "user", "content": "Add two numbers."}, {"role": "assistant", "content": "def add(a, b):"}]
    continued = dict(add_generation_prompt=False, continue_final_message=True)

    def reply(stream=False, **extra):
        r = client.chat.completions.create(model=serve_app.model, messages=messages, max_tokens=12, temperature=0,
                                           stream=stream, extra_body={**continued, **extra})
        return "".join(c.choices[0].delta.content or "" for c in r if c.choices) if stream \
            else r.choices[0].message.content

    plain = reply()
    assert reply(echo=True) == reply(stream=True, echo=True) == "def add(a, b):" + plain
    user_last = client.chat.completions.create(model=serve_app.model, messages=messages[:1], max_tokens=4,
                                               temperature=0, extra_body={"echo": True})
    assert not user_last.choices[0].message.content.startswith("Add two")  # only an assistant turn is echoed


def test_continuous_usage_stats_put_the_usage_so_far_in_every_chunk(serve_app, client):
    chunks = list(client.chat.completions.create(
        model=serve_app.model, messages=[{"role": "user", "content": "Say something"}], max_tokens=12,
        temperature=0, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage is not None for c in chunks) and counts == sorted(counts) and counts[0] == 0
    assert counts[-1] == chunks[-1].usage.total_tokens - chunks[-1].usage.prompt_tokens > 0
    plain = list(client.completions.create(model=serve_app.model, prompt="def f():", max_tokens=6, stream=True,
                                           temperature=0, stream_options={"continuous_usage_stats": True}))
    counts = [c.usage.completion_tokens for c in plain]
    assert counts == sorted(counts) and 1 <= counts[0] and counts[-1] <= 6
    assert sum(1 for c in plain if c.usage.prompt_tokens != plain[0].usage.prompt_tokens) == 0


def test_a_requests_own_token_rules_hold_inside_an_output_format(serve_app, client, tokenizer):
    """`min_tokens`, `allowed_token_ids` and `bad_words` with an output format, as vLLM takes
    them: the output keeps to the format and to the rules, and the format alone decides where
    the two leave no token (here: the end of a finished choice, though min_tokens is not out)."""
    choices = ["yes", "no", "maybe"]

    def answer(**extra) -> str:
        r = client.completions.create(model=serve_app.model, prompt="answer: ", max_tokens=16, temperature=0,
                                      extra_body={"guided_choice": choices, **extra})
        return r.choices[0].text

    free = answer()
    assert free in choices and answer(min_tokens=12) == free
    assert answer(bad_words=[free]) in choices
    allowed = sorted({t for c in choices if c != free for t in tokenizer.encode(c, add_special_tokens=False)})
    assert answer(allowed_token_ids=allowed) in set(choices) - {free}
    dated = client.completions.create(model=serve_app.model, prompt="today = ", max_tokens=16, temperature=0,
                                      extra_body={"guided_regex": r"\d{4}-\d{2}", "min_tokens": 3,
                                                  "allowed_token_ids": [tokenizer.encode(c)[0] for c in "12-"]})
    assert set(dated.choices[0].text) <= set("12-") and len(dated.choices[0].text) == 7
