"""The OpenAI-compatible API of a real Serve application, through the real `openai` client."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.procfs import engine_processes, listening_process_names, replica_stages, thread_niceness

pytestmark = pytest.mark.slow

from tests.serve.api_helpers import (PROMPTS, chat_ids, engine, engine_text, max_model_len,  # noqa: F401
                                     wait_for_free_kv)  # engine: a fixture


def test_models_and_health(serve_app, client):
    assert [m.id for m in client.models.list().data] == [serve_app.model]
    assert max_model_len(serve_app) == 2048  # resolved from the checkpoint by the builder
    # An argument given to the app reaches the engine.
    assert serve_app.target_handle().stats.remote().result()["num_blocks_total"] == serve_app.args["num_kv_blocks"]
    assert requests.get(serve_app.url + "/health", timeout=30).status_code == 200


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads listening sockets from /proc")
def test_http_comes_in_through_haproxy(serve_app, client):
    """`serve_config.yaml` starts Serve with HAProxy as its HTTP ingress: the app's port is
    HAProxy's, not the Python proxy actor's, which relayed every streamed chunk."""
    port = int(serve_app.url.rsplit(":", 1)[1])
    assert listening_process_names(port) == {"haproxy"}
    chunks = client.completions.create(model=serve_app.model, prompt="def add(a, b):", max_tokens=4,
                                       temperature=0, stream=True)
    assert len([c for c in chunks if c.choices and c.choices[0].text]) >= 1


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_completions_match_the_engine(serve_app, client, engine, tokenizer, stream):
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        expected, n = engine_text(engine, tokenizer, ids, 24)
        if stream:
            chunks = list(client.completions.create(
                model=serve_app.model, prompt=prompt, max_tokens=24, temperature=0, stream=True,
                stream_options={"include_usage": True}))
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            assert chunks[-1].choices == [] and chunks[-1].usage is not None
            usage = chunks[-1].usage
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
            assert all("\ufffd" not in c.choices[0].text for c in chunks if c.choices) or "\ufffd" in expected
        else:
            r = client.completions.create(model=serve_app.model, prompt=prompt, max_tokens=24,
                                          temperature=0)
            assert r.id and r.created and r.object == "text_completion"
            text, usage, finish = r.choices[0].text, r.usage, r.choices[0].finish_reason
        assert text == expected
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), n)
        assert usage.total_tokens == len(ids) + n
        assert finish == ("length" if n == 24 else "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_greedy_chat_matches_the_engine(serve_app, client, engine, tokenizer, stream):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something"}]
    ids = chat_ids(tokenizer, messages)
    expected, n = engine_text(engine, tokenizer, ids, 20)
    if stream:
        chunks = list(client.chat.completions.create(
            model=serve_app.model, messages=messages, max_tokens=20, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        assert chunks[0].choices[0].delta.role == "assistant"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        usage = chunks[-1].usage
    else:
        r = client.chat.completions.create(model=serve_app.model, messages=messages,
                                           max_completion_tokens=20, temperature=0)
        assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
        text, usage = r.choices[0].message.content, r.usage
    assert text == expected
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), n)


def test_stop_string_cuts_exactly(serve_app, client, engine, tokenizer):
    prompt = PROMPTS[0]
    full, _ = engine_text(engine, tokenizer, tokenizer.encode(prompt), 32)
    stop = full[6:9]
    if len(full) < 10 or not stop.strip():
        pytest.skip(f"greedy output too short or blank for a stop string: {full!r}")
    expected = full[:full.index(stop)]
    for stream in (False, True):
        r = client.completions.create(model=serve_app.model, prompt=prompt, max_tokens=32,
                                      temperature=0, stop=[stop], stream=stream)
        chunks = list(r) if stream else [r]
        assert "".join(c.choices[0].text for c in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == "stop"
        assert chunks[-1].choices[0].stop_reason == stop  # vLLM's extra: which stop string


def test_stop_reason_names_the_stop_token_and_is_null_at_the_length_limit(serve_app, client, engine, tokenizer):
    """vLLM's `stop_reason`: the request's own stop token id that ended a choice; null when the
    length limit (or the model's EOS) ended it."""
    from app.sampling_params import SamplingParams

    messages = [{"role": "user", "content": "Say something"}]
    ids = chat_ids(tokenizer, messages)
    free = engine.generate([ids], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    stop_at = free[3]
    for stream in (False, True):
        r = client.chat.completions.create(model=serve_app.model, messages=messages, max_tokens=8,
                                           temperature=0, stream=stream,
                                           extra_body={"stop_token_ids": [stop_at], "ignore_eos": True})
        last = [c for c in r if c.choices][-1].choices[0] if stream else r.choices[0]
        assert (last.finish_reason, last.stop_reason) == ("stop", stop_at)
        r = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=2, temperature=0,
                                      stream=stream, extra_body={"ignore_eos": True})
        last = [c for c in r if c.choices][-1].choices[0] if stream else r.choices[0]
        assert last.finish_reason == "length" and last.stop_reason is None


def test_stop_text_is_left_out_unless_include_stop_str_in_output(serve_app, client, engine, tokenizer):
    """As vLLM: the stop string and the text of the request's own stop token that ended the
    output are not in it, unless `include_stop_str_in_output`."""
    from app.sampling_params import SamplingParams

    ids = tokenizer.encode(PROMPTS[0])
    free = engine.generate([ids], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    stop_at = next(t for t in free[3:] if tokenizer.decode([t], skip_special_tokens=True).strip())  # it has text
    before = tokenizer.decode(free[:free.index(stop_at)], skip_special_tokens=True)
    with_it = tokenizer.decode(free[:free.index(stop_at) + 1], skip_special_tokens=True)
    for include, expected in [(False, before), (True, with_it)]:
        for stream in (False, True):
            r = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=8, temperature=0,
                                          stream=stream, extra_body={"stop_token_ids": [stop_at], "ignore_eos": True,
                                                                     "include_stop_str_in_output": include})
            chunks = list(r) if stream else [r]
            assert "".join(c.choices[0].text for c in chunks if c.choices) == expected, (include, stream)
    stop = with_it[len(before) - 2:len(before) + 1]  # across a token boundary
    r = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=8, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    text = tokenizer.decode(free, skip_special_tokens=True)
    assert r.choices[0].text == text[:text.index(stop) + len(stop)] and r.choices[0].stop_reason == stop


def test_special_tokens_are_written_only_when_asked_and_the_ending_eos_only_when_included(serve_app, client,
                                                                                          tokenizer):
    """vLLM's `skip_special_tokens: false` writes special tokens out; the model's EOS that ended
    the output is still left out, unless `include_stop_str_in_output`."""
    user, eos = tokenizer.convert_tokens_to_ids(["<|user|>", "<|end|>"])

    def forced(token: int, **extra):
        return client.completions.create(model=serve_app.model, prompt="x", max_tokens=1,
                                         logit_bias={str(token): 100}, extra_body=extra).choices[0]
    assert forced(user).text == "" and forced(user, skip_special_tokens=False).text == "<|user|>"
    ended = forced(eos, skip_special_tokens=False)
    assert (ended.text, ended.finish_reason, ended.stop_reason) == ("", "stop", None)
    assert forced(eos, skip_special_tokens=False, include_stop_str_in_output=True).text == "<|end|>"


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens(serve_app, client, engine, tokenizer):
    """vLLM's `truncate_prompt_tokens`: the engine reads the prompt's last k tokens, usage counts
    them, and `echo` writes what was read."""
    ids = tokenizer.encode(PROMPTS[1])
    expected, _ = engine_text(engine, tokenizer, ids[-4:], 8)
    r = client.completions.create(model=serve_app.model, prompt=PROMPTS[1], max_tokens=8, temperature=0,
                                  echo=True, extra_body={"truncate_prompt_tokens": 4})
    assert len(ids) > 4 and r.usage.prompt_tokens == 4
    assert r.choices[0].text == tokenizer.decode(ids[-4:]) + expected


def test_min_tokens_holds_stop_tokens_and_stop_strings_back(serve_app, client, engine, tokenizer):
    """vLLM's `min_tokens`: no stop token (EOS included) is chosen, and no stop string ending in
    their text counts, until that many tokens are out."""
    from app.sampling_params import SamplingParams

    ids = tokenizer.encode(PROMPTS[0])
    free = engine.generate([ids], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))[0]
    stop_at = free[2]
    held = engine.generate([ids], SamplingParams(max_tokens=16, temperature=0, stop_token_ids=[stop_at],
                                                 min_tokens=8))[0]
    r = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=16, temperature=0,
                                  extra_body={"stop_token_ids": [stop_at], "min_tokens": 8})
    assert r.usage.completion_tokens == len(held) >= 8 and stop_at not in held[:8]
    # A stop string ending inside the first 4 tokens' text (the first of tokens 2-4 not blank).
    stop = next(text for text in (tokenizer.decode([t]) for t in free[1:4]) if text.strip())
    params = dict(model=serve_app.model, prompt=ids, max_tokens=16, temperature=0, stop=[stop],
                  extra_body={"ignore_eos": True})
    early = client.completions.create(**params).choices[0]
    late = client.completions.create(**{**params, "extra_body": {"ignore_eos": True, "min_tokens": 4}}).choices[0]
    assert early.finish_reason == "stop" and late.text.startswith(early.text + stop)


def test_32_concurrent_streams_finish_with_correct_usage(serve_app, client, tokenizer):
    def run(i: int):
        prompt = f"Request number {i}: {PROMPTS[i % len(PROMPTS)]}"
        chunks = list(client.completions.create(
            model=serve_app.model, prompt=prompt, max_tokens=12, temperature=0.8, seed=i,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        return prompt, chunks

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(run, range(32)))
    for prompt, chunks in results:
        usage = chunks[-1].usage
        assert usage.prompt_tokens == len(tokenizer.encode(prompt))
        assert usage.completion_tokens == 12
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    wait_for_free_kv(serve_app)


def test_client_closing_a_stream_frees_its_kv_blocks(serve_app, client, tokenizer):
    prompt = PROMPTS[1]
    # Long enough that it cannot finish before the client goes (and within the KV pool).
    max_tokens = min(max_model_len(serve_app), 2048) - len(tokenizer.encode(prompt))
    stream = client.completions.create(model=serve_app.model, prompt=prompt, max_tokens=max_tokens,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    it = iter(stream)
    next(it), next(it)
    before = serve_app.target_handle().stats.remote().result()
    assert before["num_requests_running"] == 1 and before["num_blocks_used"] > 0, before
    stream.close()  # the client goes away mid-stream
    after = wait_for_free_kv(serve_app)
    # Freed by the abort, not by running to max_tokens.
    assert after["generation_tokens"] - before["generation_tokens"] < max_tokens // 2, (before, after)


def error_body(response: requests.Response) -> dict:
    body = response.json()
    assert set(body["error"]) >= {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    return body["error"]


def test_bad_input_gets_openai_errors_and_the_server_keeps_serving(serve_app, client):
    url = serve_app.base_url
    post = lambda path, **kw: requests.post(url + path, timeout=60, **kw)  # noqa: E731
    limit = max_model_len(serve_app)
    cases = [
        ("/completions", dict(data="{not json", headers={"content-type": "application/json"}), 400),
        ("/completions", dict(json={"prompt": "x", "max_tokens": "many"}), 400),
        ("/completions", dict(json={"max_tokens": 4}), 400),  # no prompt
        ("/completions", dict(json={"prompt": "x", "temperature": -0.5}), 400),
        ("/completions", dict(json={"prompt": "x", "n": 0}), 400),
        ("/completions", dict(json={"prompt": "x", "model": "no-such-model"}), 404),
        ("/completions", dict(json={"prompt": [7] * limit, "max_tokens": 1}), 400),
        ("/completions", dict(json={"prompt": [3] * 8, "max_tokens": limit}), 400),
        ("/completions", dict(json={"prompt": [10 ** 7], "max_tokens": 1}), 400),  # not in the vocabulary
        ("/completions", dict(json={"prompt": "x", "presence_penalty": 3}), 400),
        ("/completions", dict(json={"prompt": "x", "repetition_penalty": 0}), 400),
        ("/completions", dict(json={"prompt": "x", "logit_bias": {"abc": 1}}), 400),
        ("/completions", dict(json={"prompt": "x", "logit_bias": {"5": 150}}), 400),
        ("/completions", dict(json={"prompt": "x", "logit_bias": {str(10 ** 7): 1}}), 400),
        ("/completions", dict(json={"prompt": "x", "prompt_logprobs": 21}), 400),
        ("/completions", dict(json={"prompt": "x", "n": 3, "best_of": 2}), 400),
        ("/completions", dict(json={"prompt": "x", "best_of": 2, "stream": True}), 400),
        ("/completions", dict(json={"prompt": "x", "echo": True, "logprobs": -1}), 400),
        ("/completions", dict(json={"prompt": "x", "use_beam_search": True}), 400),  # one beam
        ("/completions", dict(json={"prompt": "x", "use_beam_search": True, "n": 2, "stream": True}), 400),
        ("/completions", dict(json={"prompt": "x", "use_beam_search": True, "n": 2, "temperature": 0.7}), 400),
        ("/completions", dict(json={"prompt": "x", "use_beam_search": True, "n": 2, "logprobs": 1}), 400),
        ("/completions", dict(json={"prompt": "x", "use_beam_search": True, "n": 2,
                                    "early_stopping": "sometimes"}), 400),
        # 16 beams x 1,000 tokens is more than the 256-block pool can hold.
        ("/completions", dict(json={"prompt": "x", "use_beam_search": True, "n": 16, "max_tokens": 1000}), 400),
        ("/chat/completions", dict(json={"messages": [{"role": "user", "content": "x"}], "use_beam_search": True,
                                         "n": 2, "response_format": {"type": "json_object"}}), 400),
        ("/chat/completions", dict(json={"messages": []}), 400),
        ("/chat/completions", dict(json={"messages": [{"role": "user", "content": "x"}],
                                         "response_format": {"type": "json_schema", "json_schema": {
                                             "schema": {"type": "foo"}}}}), 400),
        ("/chat/completions", dict(json={"messages": [{"role": "user", "content": "x"}],
                                         "response_format": {"type": "json_schema"}}), 400),
    ]
    for path, kwargs, status in cases:
        r = post(path, **kwargs)
        assert r.status_code == status, (path, kwargs, r.status_code, r.text)
        error_body(r)
    assert "invalid JSON schema" in error_body(post("/chat/completions", json={
        "messages": [{"role": "user", "content": "x"}], "response_format": {
            "type": "json_schema", "json_schema": {"schema": {"type": "foo"}}}}))["message"]
    assert "context length" in error_body(post("/completions", json={"prompt": [7] * limit}))["message"]
    assert "KV blocks" in error_body(post("/completions", json={
        "prompt": "x", "use_beam_search": True, "n": 16, "max_tokens": 1000}))["message"]
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=serve_app.model, prompt="x", temperature=-1)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    r = client.completions.create(model=serve_app.model, prompt="still here", max_tokens=3)
    assert r.usage.completion_tokens >= 1


def test_metrics_endpoint_counts_requests(serve_app, client):
    def scrape() -> dict:
        text = requests.get(serve_app.url + "/metrics", timeout=30).text
        return {s.name + str(sorted(s.labels.items())): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def total(samples: dict, name: str) -> float:
        return sum(v for k, v in samples.items() if k.startswith(name + "["))

    before = scrape()
    client.completions.create(model=serve_app.model, prompt="count me", max_tokens=4,
                              extra_body={"ignore_eos": True})
    after = scrape()
    assert total(after, "specserve:generation_tokens_total") - total(before, "specserve:generation_tokens_total") == 4
    assert total(after, "specserve:request_success_total") > total(before, "specserve:request_success_total")
    assert any(k.startswith("specserve:kv_cache_usage_perc[") for k in after)


def replica_thread_niceness(app_name: str) -> dict[str, set[int]]:
    """Stage name -> the niceness of every thread of its replica processes, and "<stage> engine"
    -> that of the engine processes they started."""
    stages = replica_stages(app_name)
    found: dict[str, set[int]] = {}
    for pid, stage in stages.items():
        found.setdefault(stage, set()).update(thread_niceness(pid))
    for pid, parent in engine_processes().items():
        if parent in stages:
            found.setdefault(f"{stages[parent]} engine", set()).update(thread_niceness(pid))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="reads thread niceness from /proc; Ray sets worker niceness on Linux only")
def test_model_stages_run_at_normal_cpu_priority(serve_app):
    """Ray lowers each worker's start-up thread to niceness 15 but not its gRPC/I-O threads, so
    an engine would lose its core to the chunk traffic it produces; the model stages keep their
    whole process, and the target's engine process, at the cluster's niceness
    (deployments/worker_niceness.py)."""
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the raylet (and its workers) start from ours
    niceness = replica_thread_niceness(serve_app.name)
    assert {"Ingress", "TargetModel", "DraftModel", "TargetModel engine"} <= set(niceness), niceness
    assert max(niceness["Ingress"]) > base, niceness  # Ray's lowering is in effect elsewhere
    assert niceness["TargetModel"] == niceness["TargetModel engine"] == {base}, niceness
    assert niceness["DraftModel"] == {base}, niceness


def test_serve_config_yaml_names_every_stage_and_the_custom_policy():
    """What `serve run serve_config.yaml` deploys (without starting it: cheap)."""
    from pathlib import Path

    import yaml
    from ray.serve.schema import ServeDeploySchema

    from deployments.app_args import AppArgs

    path = Path(__file__).resolve().parents[2] / "serve_config.yaml"
    [app_cfg] = ServeDeploySchema.model_validate(yaml.safe_load(path.read_text())).applications
    assert app_cfg.import_path == "app.builder:build_app" and app_cfg.route_prefix == "/"
    args = AppArgs.model_validate(app_cfg.args)
    assert Path(args.model).name == "tiny-target" and Path(args.draft_model).name == "tiny-draft"
    stages = {d.name: d for d in app_cfg.deployments}
    assert set(stages) == {"Ingress", "TargetModel", "DraftModel", "ConstraintService", "MetricsHub",
                           "ResponseStore"}
    target = stages["TargetModel"]
    assert target.max_ongoing_requests >= 100
    # The builder gives the model stages their resources (GPU shares) and priority: a dict in
    # the file would replace them whole.
    assert "ray_actor_options" not in target.model_fields_set
    assert "ray_actor_options" not in stages["DraftModel"].model_fields_set
    policy = target.autoscaling_config["policy"]["policy_function"]
    assert policy == "deployments.autoscaling:engine_load_policy"


@pytest.mark.parametrize("method", ["draft", "ngram", None])
def test_serve_config_stages_exist_whatever_the_speculation_method(method):
    """Every stage the config's `deployments:` section names is in the built graph, also when a
    user switches speculation to ngram or off (Serve refuses a config naming a missing stage)."""
    from pathlib import Path

    import yaml
    from ray.serve._private.build_app import build_app as build_graph

    from deployments.builder import build_app

    path = Path(__file__).resolve().parents[2] / "serve_config.yaml"
    [app_cfg] = yaml.safe_load(path.read_text())["applications"]
    args = {**app_cfg["args"], "speculative_method": method, "device": "cpu"}
    built = build_graph(build_app(args), name="config-check")
    assert {d["name"] for d in app_cfg["deployments"]} <= {d.name for d in built.deployments}


# Sampling and scoring, tool calls, /tokenize and the Responses API run against this module's app (one app start
# for all).
from tests.serve.sampling_cases import *  # noqa: E402,F401,F403
from tests.serve.tool_call_cases import *  # noqa: E402,F401,F403
from tests.serve.custom_tool_cases import *  # noqa: E402,F401,F403
from tests.serve.responses_api_cases import *  # noqa: E402,F401,F403
from tests.serve.request_fields_cases import *  # noqa: E402,F401,F403
from tests.serve.stored_responses_cases import *  # noqa: E402,F401,F403
from tests.serve.background_responses_cases import *  # noqa: E402,F401,F403
from tests.serve.model_routes_cases import *  # noqa: E402,F401,F403
