"""The engine's greedy output equals transformers `generate(do_sample=False)` token for token
(fp32), for prompts of very different lengths submitted together, under chunked prefill,
prefix-cache hits and forced preemption, on the default model and a random Qwen2 checkpoint."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_TARGET, write_random_qwen2

PROMPT_LENGTHS = (1, 3, 15, 16, 17, 64, 200, 513)
MAX_NEW = 24
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module", params=["default", "qwen2"])
def checkpoint(request, tmp_path_factory):
    if request.param == "default":
        assert (DEFAULT_TARGET / "config.json").is_file(), "the default checkpoint is missing"
        tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
        text = open(torch.__file__.replace("__init__.py", "functional.py")).read()
        ids = tok(text)["input_ids"]
        prompts = [ids[i * 7:i * 7 + n] for i, n in enumerate(PROMPT_LENGTHS)]
        path = DEFAULT_TARGET
    else:
        path = write_random_qwen2(tmp_path_factory.mktemp("qwen2"))
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(2, 512, (n,), generator=g).tolist() for n in PROMPT_LENGTHS]
    return path, prompts


@pytest.fixture(scope="module")
def reference(checkpoint):
    """transformers' greedy continuation of each prompt, one prompt at a time (no padding)."""
    path, prompts = checkpoint
    return transformers_greedy(path, prompts)


def transformers_greedy(path, prompts: list[list[int]]) -> list[list[int]]:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW,
                             min_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
        outs.append(gen[0, len(prompt):].tolist())
    return outs


def run_engine(path, prompts, **overrides):
    engine = LLMEngine(EngineConfig(model=str(path), num_kv_blocks=overrides.pop("num_kv_blocks", 512),
                                    **overrides))
    outputs = engine.generate(prompts, GREEDY)
    assert engine.block_manager.num_used_blocks == 0
    return engine, outputs


def test_batched(checkpoint, reference):
    path, prompts = checkpoint
    engine, outputs = run_engine(path, prompts, max_num_batched_tokens=2048)
    assert outputs == reference
    assert engine.stats().num_preemptions == 0


def test_chunked_prefill(checkpoint, reference):
    path, prompts = checkpoint
    engine, outputs = run_engine(path, prompts, max_num_batched_tokens=32)
    assert outputs == reference
    # The 513-token prompt alone needs 17 chunks of 32.
    assert engine.stats().num_steps >= 17 + MAX_NEW - 1


def test_prefix_cache_hits(checkpoint, reference):
    path, prompts = checkpoint
    engine = LLMEngine(EngineConfig(model=str(path), num_kv_blocks=512, max_num_batched_tokens=256))
    long = prompts[-1]
    assert engine.generate([long], GREEDY) == [reference[-1]]
    # Prompts that share the long prompt's first 480 tokens, then differ.
    shared = [long[:480] + p for p in prompts[:4]]
    expected = transformers_greedy(path, shared)
    hits_before = engine.stats().prefix_cache_hits
    assert engine.generate(shared, GREEDY) == expected
    stats = engine.stats()
    assert stats.prefix_cache_hits - hits_before >= 4 * 480 // 16 * 16
    assert stats.num_blocks_used == 0


def test_preemption(checkpoint, reference):
    path, prompts = checkpoint
    # Longest first: its prompt (33 blocks of 16) and the 200-token one (13) fill a pool of 46,
    # then both grow (to 34 and 14 blocks) and the newer one must be preempted.
    engine, outputs = run_engine(path, prompts[::-1], num_kv_blocks=46, max_num_batched_tokens=1024)
    assert engine.stats().num_preemptions > 0
    assert outputs == reference[::-1]
