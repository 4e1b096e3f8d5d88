"""Engine behaviour users rely on: no leaked blocks, seeded sampling independent of the batch,
clear refusals, stop conditions, and cancellation through the async front."""

from __future__ import annotations

import asyncio

import pytest
import torch

from app.config import EngineConfig
from app.engine.async_engine import AsyncLLMEngine
from app.engine.front_config import FrontConfig
from app.engine.engine import LLMEngine
from app.outputs import RequestRejected
from app.sampling_params import SamplingParams
from tests.checkpoints import write_random_qwen2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_random_qwen2(tmp_path_factory.mktemp("qwen2"))


def make_engine(checkpoint, **overrides) -> LLMEngine:
    overrides.setdefault("num_kv_blocks", 128)
    return LLMEngine(EngineConfig(model=str(checkpoint), **overrides))


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 512, (int(torch.randint(1, 80, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def assert_no_block_referenced(engine: LLMEngine) -> None:
    bm = engine.block_manager
    assert bm.num_used_blocks == 0
    assert all(b.ref_count == 0 for b in bm.blocks)
    assert not bm.request_blocks


def test_no_leak_after_finish_and_abort(checkpoint):
    engine = make_engine(checkpoint, num_kv_blocks=40, max_num_batched_tokens=64)
    batch = prompts(12)
    for i, p in enumerate(batch):
        engine.add_request(str(i), p, SamplingParams(max_tokens=30, temperature=0.8, ignore_eos=True))
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
        if steps == 5:  # abort some running, some waiting
            for rid in ("0", "5", "11"):
                engine.abort_request(rid)
    assert engine.stats().num_preemptions > 0
    assert_no_block_referenced(engine)
    assert engine.block_manager.cached_blocks  # prefix cache kept what it may reuse


def test_seeded_request_same_alone_and_in_busy_batch(checkpoint):
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=7, ignore_eos=True)
    prompt = prompts(1, seed=3)[0]
    alone = make_engine(checkpoint).generate([prompt], params)[0]
    busy = make_engine(checkpoint, num_kv_blocks=48, max_num_batched_tokens=48)
    others = prompts(10, seed=4)
    mixed = [SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True)] * 5 + [params] + \
            [SamplingParams(max_tokens=40, temperature=1.0, ignore_eos=True)] * 5
    outputs = busy.generate(others[:5] + [prompt] + others[5:], mixed)
    assert busy.stats().num_preemptions > 0  # the seeded request's RNG survives recompute too
    assert outputs[5] == alone
    assert len(set(alone)) > 5


def test_extreme_but_valid_sampling_settings_still_generate(checkpoint):
    """Settings at the edge of their ranges (what an API fuzzer sends): a temperature too small
    for fp32 is greedy, a vanishing top_p keeps the most likely token; none breaks the step."""
    engine = make_engine(checkpoint)
    prompt = prompts(1, seed=5)[0]
    greedy = engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))[0]
    edges = [dict(temperature=5e-324), dict(temperature=1e-6, top_p=0.5), dict(temperature=0.8, top_p=5e-324),
             dict(temperature=0.8, top_p=1e-40, min_p=5e-324), dict(temperature=0.8, min_p=1.0)]
    outputs = engine.generate([prompt] * len(edges), [SamplingParams(max_tokens=8, ignore_eos=True, **e)
                                                      for e in edges])
    assert outputs == [greedy] * len(edges)
    for huge in (dict(temperature=1.7e308), dict(temperature=0.8, repetition_penalty=1e308)):
        assert len(engine.generate([prompt], SamplingParams(max_tokens=8, ignore_eos=True, **huge))[0]) == 8
    assert_no_block_referenced(engine)


def test_requests_that_cannot_fit_are_refused(checkpoint):
    engine = make_engine(checkpoint, num_kv_blocks=8, max_model_len=256)
    with pytest.raises(RequestRejected, match="maximum context length is 256"):
        engine.add_request("long", [3] * 250, SamplingParams(max_tokens=10))
    with pytest.raises(RequestRejected, match="whole pool has 8"):
        engine.add_request("big", [3] * 100, SamplingParams(max_tokens=100))
    with pytest.raises(RequestRejected, match="empty"):
        engine.add_request("empty", [], SamplingParams())
    with pytest.raises(RequestRejected, match="token ids"):
        engine.add_request("oov", [10**6], SamplingParams())
    assert not engine.has_unfinished_requests()


def test_stop_token_and_length_finish_reasons(checkpoint):
    engine = make_engine(checkpoint)
    prompt = prompts(1, seed=5)[0]
    free_run = engine.generate([prompt], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))[0]
    stop_at = free_run[4]
    engine.add_request("s", prompt, SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[stop_at],
                                                    ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert (outs[-1].finish_reason, outs[-1].stop_token_id) == ("stop", stop_at)
    assert sum((o.new_token_ids for o in outs), []) == free_run[:free_run.index(stop_at) + 1]
    engine.add_request("l", prompt, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert outs[-1].finish_reason == "length" and outs[-1].num_output_tokens == 3
    assert outs[-1].stop_token_id is None


def test_eos_stops_unless_ignored(checkpoint):
    engine = make_engine(checkpoint)
    prompt = prompts(1, seed=6)[0]
    free_run = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))[0]
    engine.model_config = type(engine.model_config)(**{**engine.model_config.__dict__,
                                                        "eos_token_ids": (free_run[2],)})
    stopped = engine.generate([prompt], SamplingParams(max_tokens=10, temperature=0))[0]
    assert stopped == free_run[:free_run.index(free_run[2]) + 1]
    # The model's EOS is no stop reason, even when the request also names it (as in vLLM).
    engine.add_request("eos", prompt, SamplingParams(max_tokens=10, temperature=0, stop_token_ids=[free_run[2]]))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    assert (outs[-1].finish_reason, outs[-1].stop_token_id) == ("stop", None)


def test_logprobs_are_returned_per_token(checkpoint):
    engine = make_engine(checkpoint)
    engine.add_request("lp", prompts(1)[0], SamplingParams(max_tokens=4, temperature=0, logprobs=2,
                                                           ignore_eos=True))
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    logprobs = [lp for o in outs for lp in o.new_logprobs]
    assert len(logprobs) == 4
    for lp in logprobs:
        assert lp.token_id == max(lp.top, key=lp.top.get) and len(lp.top) == 2 and lp.logprob <= 0


def test_async_engine_streams_and_cancellation_frees_blocks(checkpoint):
    engine = AsyncLLMEngine(EngineConfig(model=str(checkpoint), num_kv_blocks=64))

    async def main():
        async def complete(i):
            tokens = []
            async for out in engine.generate(f"c{i}", prompts(1, seed=i)[0],
                                             SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)):
                tokens += out.new_token_ids
            return tokens, out.finish_reason

        async def cancel_after_two_chunks():
            stream = engine.generate("x", prompts(1, seed=9)[0],
                                     SamplingParams(max_tokens=500, temperature=0, ignore_eos=True))
            async for i, _ in aenumerate(stream):
                if i == 1:
                    break
            await stream.aclose()

        results = await asyncio.gather(*(complete(i) for i in range(4)), cancel_after_two_chunks())
        for tokens, reason in results[:4]:
            assert len(tokens) == 8 and reason == "length"
        for _ in range(100):  # the abort lands before the engine's next step
            await asyncio.sleep(0.05)
            if engine.stats().num_blocks_used == 0 and engine.stats().num_requests_running == 0:
                break
        assert engine.stats().num_blocks_used == 0
        with pytest.raises(RequestRejected):
            async for _ in engine.generate("too-long", [3] * 2000, SamplingParams(max_tokens=10)):
                pass

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert_no_block_referenced(engine.engine)


def test_slow_reader_gets_steps_merged_into_fewer_chunks(checkpoint):
    """A caller that reads slower than the engine steps gets the queued steps as one chunk:
    same tokens, logprobs and finish, fewer hops."""
    engine = AsyncLLMEngine(EngineConfig(model=str(checkpoint), num_kv_blocks=64))
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, logprobs=2)

    async def read(request_id, delay):
        chunks = []
        async for out in engine.generate(request_id, prompts(1, seed=3)[0], params):
            chunks.append(out)
            await asyncio.sleep(delay)
        return chunks

    try:
        eager = asyncio.run(read("eager", 0))
        slow = asyncio.run(read("slow", 0.05))
    finally:
        engine.shutdown()
    assert len(slow) < len(eager)
    assert [t for c in slow for t in c.new_token_ids] == [t for c in eager for t in c.new_token_ids]
    assert [lp.token_id for c in slow for lp in c.new_logprobs] == [t for c in eager for t in c.new_token_ids]
    assert slow[-1].finished and slow[-1].finish_reason == "length" and slow[-1].num_output_tokens == 24
    assert all(len(c.new_logprobs) == len(c.new_token_ids) for c in slow)


def test_stream_interval_groups_steps_but_never_delays_the_first_chunk(checkpoint):
    engine = AsyncLLMEngine(EngineConfig(model=str(checkpoint), num_kv_blocks=64), front=FrontConfig(stream_interval_ms=200))
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)

    async def read(request_id):
        return [out async for out in engine.generate(request_id, prompts(1, seed=4)[0], params)]

    try:
        chunks = asyncio.run(read("grouped"))
        reference = LLMEngine(EngineConfig(model=str(checkpoint), num_kv_blocks=64)).generate(
            [prompts(1, seed=4)[0]], params)[0]
    finally:
        engine.shutdown()
    assert len(chunks[0].new_token_ids) == 1  # the first step's token, not held back
    assert 2 <= len(chunks) < 16
    assert [t for c in chunks for t in c.new_token_ids] == reference
    assert chunks[-1].finished and chunks[-1].num_output_tokens == 16


async def aenumerate(stream):
    i = 0
    async for item in stream:
        yield i, item
        i += 1


def test_building_an_engine_leaves_torch_dynamo_unimported():
    """Building the model on the meta device once ran arithmetic there (the rotary frequencies,
    the embedding's init), whose first use imports torch._dynamo: ~1 s of every engine's
    start-up, a replica's included. A fresh interpreter, so no other test has imported it."""
    import subprocess
    import sys
    from pathlib import Path
    checkpoint = Path(__file__).resolve().parent.parent / "checkpoints" / "tiny-target"
    code = ("import sys; from app.config import EngineConfig; from app.engine.engine import LLMEngine; "
            f"LLMEngine(EngineConfig(model={str(checkpoint)!r})); print('torch._dynamo' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[-1] == "False"
