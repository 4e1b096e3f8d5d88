"""Served sampling and scoring through the real `openai` client: penalties and logit bias, n
and logprobs, echo and prompt logprobs, best_of, beam search. Imported by test_openai_api.py,
so they run against its app."""

from __future__ import annotations

import pytest

from tests.serve.api_helpers import PROMPTS, chat_ids, wait_for_free_kv


def test_penalties_and_logit_bias_match_the_engine(serve_app, client, engine, tokenizer):
    """The OpenAI SDK's own fields (presence/frequency penalty, logit_bias with string keys) and
    vLLM's repetition_penalty reach the selection step: greedy output equals the engine's."""
    from app.sampling_params import SamplingParams

    ids = tokenizer.encode("the the the the the the")
    settings = dict(presence_penalty=0.5, frequency_penalty=1.0, logit_bias={13: -100, 200: 2.5})
    [expected] = engine.generate([ids], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True,
                                                       repetition_penalty=1.3, **settings))
    r = client.completions.create(
        model=serve_app.model, prompt=ids, max_tokens=16, temperature=0,
        presence_penalty=settings["presence_penalty"], frequency_penalty=settings["frequency_penalty"],
        logit_bias={str(t): b for t, b in settings["logit_bias"].items()},
        extra_body={"ignore_eos": True, "repetition_penalty": 1.3})
    assert r.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    counts = {}
    for penalty in (0.0, 2.0):  # greedy repeats " 3," to the end; a strong penalty breaks that
        out = client.completions.create(model=serve_app.model, prompt="1, 2, 3, 1, 2, 3, 1, 2, 3,",
                                        max_tokens=32, temperature=0, frequency_penalty=penalty,
                                        logprobs=0, extra_body={"ignore_eos": True})
        tokens = out.choices[0].logprobs.tokens
        counts[penalty] = max(tokens.count(t) for t in tokens)
    assert counts[0.0] >= 10 and counts[2.0] <= counts[0.0] // 2, counts
    forced = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=5, temperature=0,
                                       logit_bias={"777": 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].text == tokenizer.decode([777] * 5, skip_special_tokens=True)


def test_allowed_token_ids_choose_among_those_alone(serve_app, client, engine, tokenizer):
    """vLLM's `allowed_token_ids`: greedy picks the likeliest allowed token, as the engine does;
    sampled output keeps to them."""
    from app.sampling_params import SamplingParams

    ids = tokenizer.encode(PROMPTS[0])
    free = engine.generate([ids], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))[0]
    allowed = sorted({free[1], 300, 301, 777} - {free[0]})
    expected = engine.generate([ids], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True,
                                                     allowed_token_ids=allowed))[0]
    assert set(expected) <= set(allowed) and expected != free[:6]
    greedy = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True, "allowed_token_ids": allowed})
    assert greedy.choices[0].text == tokenizer.decode(expected, skip_special_tokens=True)
    sampled = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=12, temperature=1.5, seed=3,
                                        logprobs=0, extra_body={"ignore_eos": True, "allowed_token_ids": allowed})
    assert set(sampled.choices[0].logprobs.tokens) <= {tokenizer.decode([t]) for t in allowed}


def test_logprobs_name_tokens_by_id_when_asked(serve_app, client, tokenizer):
    """vLLM's `return_tokens_as_token_ids`: "token_id:ID" wherever logprobs name a token."""
    ids = tokenizer.encode(PROMPTS[0])
    by_text = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=4, temperature=0, logprobs=2,
                                        extra_body={"ignore_eos": True})
    by_id = client.completions.create(model=serve_app.model, prompt=ids, max_tokens=4, temperature=0, logprobs=2,
                                      extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    named = [int(t.removeprefix("token_id:")) for t in by_id.choices[0].logprobs.tokens]
    assert [tokenizer.decode([t]) for t in named] == by_text.choices[0].logprobs.tokens
    assert all(k.startswith("token_id:") for top in by_id.choices[0].logprobs.top_logprobs for k in top)
    chat = client.chat.completions.create(model=serve_app.model, max_tokens=3, logprobs=True, top_logprobs=2,
                                          temperature=0, messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True})
    content = chat.choices[0].logprobs.content
    assert all(t.token.startswith("token_id:") and all(a.token.startswith("token_id:") for a in t.top_logprobs)
               for t in content)


def test_n_choices_and_logprobs(serve_app, client):
    r = client.completions.create(model=serve_app.model, prompt=PROMPTS[0], max_tokens=5, n=3,
                                  temperature=1.0, seed=7, logprobs=2,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == 15
    for c in r.choices:
        assert len(c.logprobs.token_logprobs) == 5 and all(lp <= 0 for lp in c.logprobs.token_logprobs)
        assert all(len(top) <= 2 for top in c.logprobs.top_logprobs)
    chat = client.chat.completions.create(model=serve_app.model, max_tokens=4, logprobs=True,
                                          top_logprobs=3, temperature=0,
                                          messages=[{"role": "user", "content": "hi"}],
                                          extra_body={"ignore_eos": True})
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(t.top_logprobs) == 3 for t in content)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(serve_app, client, tokenizer, stream):
    """lm-eval style scoring: echo + logprobs puts the prompt's text and its tokens' logprobs
    before the completion's; vLLM's prompt_logprobs gives the same scores by token id."""
    import torch
    from transformers import AutoModelForCausalLM

    prompt = PROMPTS[1]
    ids = tokenizer.encode(prompt)
    model = AutoModelForCausalLM.from_pretrained(serve_app.checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    plain = client.completions.create(model=serve_app.model, prompt=prompt, max_tokens=3, temperature=0,
                                      logprobs=2, extra_body={"ignore_eos": True}).choices[0]
    asked = dict(model=serve_app.model, prompt=prompt, max_tokens=3, temperature=0, logprobs=2, echo=True,
                 extra_body={"ignore_eos": True, "prompt_logprobs": 1})
    if stream:
        chunks = [c.choices[0] for c in client.completions.create(stream=True, **asked) if c.choices]
        text = "".join(c.text for c in chunks)
        tokens = [t for c in chunks if c.logprobs for t in c.logprobs.tokens]
        scores = [v for c in chunks if c.logprobs for v in c.logprobs.token_logprobs]
        tops = [t for c in chunks if c.logprobs for t in c.logprobs.top_logprobs]
        by_id = next(c.prompt_logprobs for c in chunks if getattr(c, "prompt_logprobs", None))
    else:
        choice = client.completions.create(**asked).choices[0]
        text, tokens = choice.text, choice.logprobs.tokens
        scores, tops, by_id = choice.logprobs.token_logprobs, choice.logprobs.top_logprobs, choice.prompt_logprobs
    assert text == prompt + plain.text
    assert tokens == [tokenizer.decode([t]) for t in ids] + plain.logprobs.tokens
    assert scores[0] is None and tops[0] is None and len(scores) == len(ids) + 3
    for p in range(1, len(ids)):
        assert scores[p] == pytest.approx(reference[p - 1, ids[p]].item(), abs=2e-4)
        assert len(tops[p]) == 2 and max(tops[p].values()) == pytest.approx(reference[p - 1].max().item(), abs=2e-4)
        entry = by_id[p][str(ids[p])]
        assert entry["logprob"] == pytest.approx(scores[p], abs=1e-6) and entry["rank"] >= 1
        assert len(by_id[p]) <= 2  # the prompt token and its top alternative (the same when it is the top)
    assert by_id[0] is None and len(by_id) == len(ids)
    assert scores[len(ids):] == pytest.approx(plain.logprobs.token_logprobs, abs=1e-5)


def test_best_of_returns_the_likeliest_of_its_candidates(serve_app, client):
    """best_of=4, n=2 returns the two of the four seeded candidates (the same four that n=4
    gives) with the highest cumulative logprob, best first, and bills all four."""
    asked = dict(model=serve_app.model, prompt=PROMPTS[0], max_tokens=6, temperature=1.0, seed=11,
                 extra_body={"ignore_eos": True, "speculative_decoding": False})
    candidates = client.completions.create(n=4, logprobs=0, **asked).choices
    ranked = sorted(candidates, key=lambda c: sum(c.logprobs.token_logprobs), reverse=True)
    assert len({c.text for c in candidates}) > 1  # the seeds gave different candidates
    best = client.completions.create(n=2, best_of=4, **asked)
    assert [c.text for c in best.choices] == [c.text for c in ranked[:2]]
    assert [c.index for c in best.choices] == [0, 1] and best.choices[0].logprobs is None
    assert best.usage.completion_tokens == 4 * 6


def engine_beams(engine, prompt_ids: list[int], beams: int, max_tokens: int) -> list[list[int]]:
    from app.sampling_params import SamplingParams

    engine.add_request("beams", prompt_ids, SamplingParams(max_tokens=max_tokens, temperature=0, beam_width=beams))
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                return [h.token_ids for h in out.beams]
    raise AssertionError("the beam search did not finish")


def test_beam_search_returns_the_best_beams(serve_app, client, tokenizer, engine):
    """vLLM's `use_beam_search` (extra_body) with best_of=4 beams and n=2: the two best beams of
    the engine's search (tests/test_beam_search.py holds it to transformers), best first, for
    completions and chat; usage counts the beams returned; a stop token that ended a beam is its
    stop_reason; no KV block is left."""
    prompt_ids = tokenizer.encode(PROMPTS[1])
    expected = engine_beams(engine, prompt_ids, 4, 12)
    got = client.completions.create(model=serve_app.model, prompt=PROMPTS[1], max_tokens=12, n=2, best_of=4,
                                    extra_body={"use_beam_search": True})
    assert [c.text for c in got.choices] == [tokenizer.decode(ids, skip_special_tokens=True) for ids in expected[:2]]
    assert [c.index for c in got.choices] == [0, 1]
    assert got.usage.completion_tokens == sum(len(ids) for ids in expected[:2])
    # vLLM's stop_reason on beams: the request's own stop token that ended one (scored by its
    # logprob alone, the short beam comes first); null at the length limit.
    stop = expected[0][2]
    stopped = client.completions.create(model=serve_app.model, prompt=PROMPTS[1], max_tokens=12, n=2, best_of=4,
                                        extra_body={"use_beam_search": True, "length_penalty": 0.0,
                                                    "stop_token_ids": [stop]})
    reasons = [(c.finish_reason, c.stop_reason) for c in stopped.choices]
    assert reasons[0] == ("stop", stop) and all(r in (("stop", stop), ("stop", None), ("length", None))
                                                for r in reasons), reasons
    messages = [{"role": "user", "content": "def add(a, b):"}]
    expected = engine_beams(engine, chat_ids(tokenizer, messages), 3, 10)
    chat = client.chat.completions.create(model=serve_app.model, messages=messages, max_tokens=10, n=3,
                                          extra_body={"use_beam_search": True, "length_penalty": 1.0})
    assert [c.message.content for c in chat.choices] == [
        tokenizer.decode(ids, skip_special_tokens=True) for ids in expected]
    assert all(c.finish_reason in ("stop", "length") for c in chat.choices)
    wait_for_free_kv(serve_app)
