"""Prompt logprobs (echo + logprobs, vLLM's prompt_logprobs): each prompt token's logprob equals
transformers' log-softmax of the previous position's logits, across prompt chunks and for a
prompt whose blocks are already in the prefix cache."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_TARGET

TEXTS = ["The quick brown fox jumps over the lazy dog, and then the dog sleeps all afternoon.",
         "def add(a, b):\n    return a + b\n\nprint(add(2, 3))"]


@pytest.fixture(scope="module")
def prompts():
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    return [tok.encode(t) for t in TEXTS]


@pytest.fixture(scope="module")
def reference(prompts):
    """transformers' log-softmax: row p scores token p + 1."""
    model = AutoModelForCausalLM.from_pretrained(DEFAULT_TARGET, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(torch.tensor([p])).logits[0].log_softmax(-1) for p in prompts]


def run(engine: LLMEngine, prompts, top_n: int):
    ids = [f"p{i}-{engine.num_steps}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=top_n))
    found = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.prompt_logprobs is not None:
                assert out.request_id not in found  # once, in the first output
                found[out.request_id] = out.prompt_logprobs
    return [found[rid] for rid in ids]


def check(scored, prompt, reference, top_n):
    assert len(scored) == len(prompt) and scored[0] is None
    for p, lp in enumerate(scored[1:]):
        row = reference[p]
        assert lp.token_id == prompt[p + 1]
        assert lp.logprob == pytest.approx(row[prompt[p + 1]].item(), abs=2e-4)
        x = row[prompt[p + 1]]
        assert 1 + int((row > x + 1e-4).sum()) <= lp.rank <= 1 + int((row > x - 1e-4).sum())
        values, ids = row.topk(top_n)
        assert len(lp.top) == top_n
        for t, v in zip(ids.tolist(), values.tolist()):  # near-ties may swap: compare by value
            assert lp.top.get(t, v) == pytest.approx(v, abs=2e-4)
        assert sorted(lp.top.values(), reverse=True) == pytest.approx(values.tolist(), abs=2e-4)


@pytest.mark.parametrize("budget", [1024, 7])  # whole prompts, then prompts cut into chunks
def test_prompt_logprobs_match_transformers(prompts, reference, budget):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64, block_size=4,
                                    max_num_batched_tokens=budget))
    for scored, prompt, ref in zip(run(engine, prompts, top_n=3), prompts, reference):
        check(scored, prompt, ref, top_n=3)


def test_cached_prompt_is_still_scored(prompts, reference):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64, block_size=4))
    engine.generate(prompts[:1], SamplingParams(max_tokens=1))  # the prompt's blocks are now cached
    [scored] = run(engine, prompts[:1], top_n=0)
    check(scored, prompts[0], reference[0], top_n=0)
    assert engine.stats().prefix_cache_hits == 0  # the scored request did not take the cached blocks


def test_requests_without_prompt_logprobs_get_none(prompts):
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=64))
    engine.add_request("a", prompts[0], SamplingParams(max_tokens=2))
    while engine.has_unfinished_requests():
        assert all(out.prompt_logprobs is None for out in engine.step())
