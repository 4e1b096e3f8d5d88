"""Overload: more concurrent requests than the KV pool holds all finish (queued, or preempted
and recomputed, with the same greedy text as alone); past `max_num_waiting_requests` new
requests get a 429 with an OpenAI error body instead of a queue that grows without bound. The
app runs vLLM's priority scheduling, so preemption here picks the lowest-priority (then newest)
request, and requests may carry a `priority`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from .helpers import target_stats, wait_for_idle_kv

pytestmark = pytest.mark.slow

NUM_KV_BLOCKS = 12  # 12 x 16 = 192 token slots in the whole pool
WAITING_CAP = 16
SERVE_APP_ARGS = {"num_kv_blocks": NUM_KV_BLOCKS, "max_num_waiting_requests": WAITING_CAP,
                  "scheduling_policy": "priority"}
MAX_TOKENS = 48  # prompt (< 16 tokens) + 48 -> 4 blocks per request at full length


@pytest.fixture(scope="module")
def client(serve_app) -> openai.OpenAI:
    return openai.OpenAI(base_url=serve_app.base_url, api_key="x", max_retries=0, timeout=300)


def complete(client, model, prompt: str, stream: bool, max_tokens: int = MAX_TOKENS, priority: int = 0):
    kwargs = dict(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                  extra_body={"ignore_eos": True, "priority": priority})
    if not stream:
        r = client.completions.create(**kwargs)
        return r.choices[0].text, r.usage.completion_tokens
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage.completion_tokens


def test_more_requests_than_the_kv_pool_holds_all_finish_with_the_same_text(serve_app, client):
    prompts = [f"Request {i}: the weather today is" for i in range(12)]  # 12 x 4 blocks = 4x the pool
    expected = [complete(client, serve_app.model, p, stream=False) for p in prompts[:3]]
    before = target_stats(serve_app)
    with ThreadPoolExecutor(len(prompts)) as pool:
        results = list(pool.map(lambda ip: complete(client, serve_app.model, ip[1], stream=ip[0] % 2 == 0,
                                                    priority=ip[0] % 3 - 1), enumerate(prompts)))
    after = wait_for_idle_kv(serve_app)
    assert all(n == MAX_TOKENS for _, n in results), results
    assert results[:3] == expected  # preemption and recompute give the text a lone request gets
    # The pool really was oversubscribed: running requests were preempted to make room.
    assert after["num_preemptions"] > before["num_preemptions"], (before, after)


def test_waiting_cap_answers_429_and_the_rest_finish(serve_app, client):
    n = 48  # 3x (cap + what the pool can run), at once
    def attempt(i: int):
        try:
            return complete(client, serve_app.model, f"Caller {i} says", stream=i % 2 == 1, max_tokens=96)
        except openai.RateLimitError as exc:
            return exc

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(attempt, range(n)))
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    served = [r for r in results if not isinstance(r, openai.RateLimitError)]
    assert refused, "no request was refused although 48 arrived at once for 12 KV blocks and a cap of 16"
    assert served and all(tokens == 96 for _, tokens in served), served
    for exc in refused:
        assert exc.status_code == 429
        error = exc.body if "message" in (exc.body or {}) else exc.body["error"]
        assert error["type"] == "rate_limit_error" and "overloaded" in error["message"], error
    wait_for_idle_kv(serve_app)
    # Nothing stays refused once the queue drains.
    assert complete(client, serve_app.model, "After the rush", stream=False)[1] == MAX_TOKENS
