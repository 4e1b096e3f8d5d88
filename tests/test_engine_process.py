"""The engine in a process of its own (what a TargetModel replica runs): the same tokens as the
engine in-process, cancellation that frees KV, formats and drafts that cross the process
boundary, and no orphan on either side when one of the two processes dies."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from transformers import AutoTokenizer

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.engine_process import EngineProcess, child_environment
from app.engine.async_engine import AsyncLLMEngine
from app.engine.block_manager import block_hashes
from app.engine.messages import (AbortRequest, AddRequest, CacheReport, DropFormat, Drafts, EngineFailed, EngineReady,
                                 FormatIndex, ProposeDrafts, ReportCache, StartEngine, StepOutputs, Stop)
from app.engine.spec.draft_channel import DraftChannelServer
from app.engine.spec.draft_worker import DraftWorker
from app.guided.compiler import compile_regex
from app.guided.guide import CompiledFormat
from app.guided.output_format import OutputFormat
from app.guided.vocabulary import load_guided_vocabulary
from app.outputs import EngineDied, RequestRejected
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET
from tests.procfs import is_running

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
DATE = r"\d{4}-\d{2}-\d{2}"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(DEFAULT_TARGET)


def config(**overrides) -> EngineConfig:
    return EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=128, **overrides)


async def collect(engine, request_id, prompt, params, guided=(None, None)) -> list[int]:
    """`guided`: (OutputFormat, its index) when the output must follow a format."""
    return [t async for out in engine.generate(request_id, prompt, params, *guided) for t in out.new_token_ids]


def wait_until(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_same_tokens_as_the_engine_in_process_and_a_cancelled_stream_frees_its_blocks(tokenizer):
    texts = ["def add(a, b):", "The capital of France", "import numpy as np\n", "1, 2, 3,"]
    prompts = [tokenizer.encode(t) for t in texts]
    reference = LLMEngine(config()).generate(prompts, GREEDY)
    engine = EngineProcess(config())

    async def main():
        async def cancel_after_two_chunks():
            stream = engine.generate("x", prompts[0], SamplingParams(max_tokens=500, temperature=0, ignore_eos=True))
            for _ in range(2):
                await stream.__anext__()
            await stream.aclose()

        outputs = await asyncio.gather(*(collect(engine, f"r{i}", p, GREEDY) for i, p in enumerate(prompts)),
                                       cancel_after_two_chunks())
        for _ in range(100):  # the abort reaches the child before its next step
            if engine.stats().num_blocks_used == 0 and engine.stats().num_requests_running == 0:
                break
            await asyncio.sleep(0.05)
        return outputs[:4]

    try:
        assert asyncio.run(main()) == reference
        assert engine.stats().num_blocks_used == 0
        with pytest.raises(RequestRejected, match="maximum context length"):  # refused by the front
            asyncio.run(collect(engine, "too-long", [3] * 3000, GREEDY))
        assert engine.limits.max_model_len == LLMEngine(config()).max_model_len
    finally:
        engine.shutdown()


def test_a_guided_request_follows_its_format_in_the_child_and_the_index_crosses_once(tokenizer):
    vocab = load_guided_vocabulary(DEFAULT_TARGET)
    index = compile_regex(DATE, vocab)
    date = (OutputFormat(DATE), index)
    prompt = tokenizer.encode("today = ")
    params = SamplingParams(max_tokens=20, temperature=0)
    in_process = LLMEngine(config())
    in_process.add_request("ref", prompt, params,
                           CompiledFormat(index, vocab).decoder(in_process.model_config.vocab_size))
    reference = _run_to_end(in_process)["ref"]
    engine = EngineProcess(config())
    sent = []
    submit = engine._submit
    engine._submit = lambda command: (sent.append(type(command)), submit(command))
    try:
        first = asyncio.run(collect(engine, "a", prompt, params, date))
        second = asyncio.run(collect(engine, "b", prompt, params, date))
    finally:
        engine.shutdown()
    assert first == second == reference
    assert re.fullmatch(DATE, tokenizer.decode(first, skip_special_tokens=True))
    assert sent.count(FormatIndex) == 1 and sent.count(AddRequest) == 2


def _run_to_end(engine: LLMEngine) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            out.setdefault(o.request_id, []).extend(o.new_token_ids)
    return out


class CountingProposer:
    """The draft model in the front, as the TargetModel's DraftClient would be, counting calls."""

    def __init__(self, fail: bool = False):
        self.worker = DraftWorker(dataclasses.replace(config(), model=str(DEFAULT_DRAFT)))
        self.fail = fail
        self.calls = 0

    def propose_batch(self, inputs):
        self.calls += 1
        if self.fail:
            raise ConnectionError("draft replica unreachable")
        return self.worker.propose_batch(inputs)


class ChannelFront(CountingProposer):
    """A front whose Serve handle finds a draft replica with a channel; the replica's channel
    breaks (as when it is killed) during its `break_on_call`-th proposal."""

    def __init__(self, break_on_call: int | None = None):
        super().__init__()
        self.lock = threading.Lock()
        self.channel_calls = 0
        self.break_on_call = break_on_call
        self.server = DraftChannelServer(self._over_channel, "127.0.0.1")

    def find_draft_channel(self):
        return self.server.address

    def _over_channel(self, inputs):
        self.channel_calls += 1
        if self.channel_calls == self.break_on_call:
            self.server.close()
        with self.lock:
            return self.worker.propose_batch(inputs)

    def propose_batch(self, inputs):
        with self.lock:
            return super().propose_batch(inputs)


def speculate(front_proposer, prompt: list[int], params: SamplingParams):
    """One request through an engine process that drafts k=4 through `front_proposer` (the
    proposer its front holds): its tokens and the engine's speculation counters."""
    engine = EngineProcess(config(speculative_method="draft", speculation_schedule={1: 4}), front_proposer)
    try:
        return asyncio.run(collect(engine, "spec", prompt, params)), engine.stats().spec
    finally:
        engine.shutdown()


@pytest.mark.parametrize("break_on_call", [None, 1], ids=["channel", "channel-breaks"])
def test_the_engine_process_calls_the_draft_channel_its_front_finds(tokenizer, break_on_call):
    prompt = tokenizer.encode("def fibonacci(n):\n    ")
    params = dataclasses.replace(GREEDY, max_tokens=40)
    reference = LLMEngine(config()).generate([prompt], params)[0]
    front = ChannelFront(break_on_call)
    try:
        tokens, spec = speculate(front, prompt, params)
    finally:
        front.server.close()
    assert tokens == reference
    assert spec.num_drafts > 0
    if break_on_call is None:  # each step's proposal, and the next step's drafts sent ahead
        assert front.calls == 0 and spec.num_proposer_failures == 0
        assert front.channel_calls == spec.num_proposals + spec.num_drafts_sent_ahead
        assert 0 < spec.num_drafts_ahead_used < spec.num_drafts
    else:  # one step without drafts, then the front's Serve path (nothing sent ahead) until the retry
        assert spec.num_proposer_failures == 1 and front.channel_calls == 1 and front.calls > 0
        assert spec.num_drafts_sent_ahead == 0


@pytest.mark.parametrize("fail", [False, True], ids=["drafts", "failing-proposer"])
def test_drafts_come_from_the_front_s_proposer_and_never_change_greedy_output(tokenizer, fail):
    prompt = tokenizer.encode("def fibonacci(n):\n    ")
    reference = LLMEngine(config()).generate([prompt], GREEDY)[0]
    proposer = CountingProposer(fail=fail)
    tokens, spec = speculate(proposer, prompt, GREEDY)
    assert tokens == reference
    assert proposer.calls > 0
    if fail:
        assert spec.num_proposer_failures > 0 and spec.num_drafts == 0
    else:
        assert spec.num_drafts > 0 and spec.num_proposer_failures == 0


def test_a_dead_engine_process_ends_open_streams_with_an_error_and_refuses_new_requests(tokenizer):
    engine = EngineProcess(config())
    prompt = tokenizer.encode("Once upon a time")

    async def killed_mid_stream():
        stream = engine.generate("long", prompt, SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True))
        await stream.__anext__()
        os.kill(engine.pid, signal.SIGKILL)
        async for _ in stream:
            pass

    try:
        with pytest.raises(EngineDied, match="engine process exited"):
            asyncio.run(asyncio.wait_for(killed_mid_stream(), 30))
        assert engine.error is not None
        with pytest.raises(EngineDied, match="engine process exited"):
            asyncio.run(collect(engine, "after", prompt, GREEDY))
    finally:
        engine.shutdown()


@pytest.mark.parametrize("front", [EngineProcess, AsyncLLMEngine])
def test_the_cache_report_holds_the_hashes_a_router_computes_from_the_prompt(tokenizer, front):
    """What a prefix-aware router relies on: the full blocks of a finished prompt are reported
    with the hashes `block_hashes` gives for the same tokens in another process, newest last,
    bounded by `max_blocks`."""
    engine = front(config())
    prompt = tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 8)

    async def run():
        await collect(engine, "r", prompt, SamplingParams(max_tokens=1, temperature=0))
        return await asyncio.wait_for(engine.cache_report(4096), 30), await engine.cache_report(2)

    try:
        report, newest_two = asyncio.run(run())
    finally:
        engine.shutdown()
    expected = block_hashes(prompt, report.block_size)
    assert len(expected) >= 4
    assert set(expected) <= set(report.block_hashes)
    assert newest_two.block_hashes == report.block_hashes[-2:]


def test_a_cache_report_asked_of_a_dead_engine_process_raises_instead_of_hanging(tokenizer):
    engine = EngineProcess(config())
    try:
        os.kill(engine.pid, signal.SIGKILL)
        assert wait_until(lambda: engine.error is not None)
        with pytest.raises(EngineDied):
            asyncio.run(asyncio.wait_for(engine.cache_report(16), 10))
    finally:
        engine.shutdown()


def test_the_engine_process_exits_when_its_front_is_killed():
    """A replica killed outright leaves no engine (and no KV pool) behind."""
    script = ("import time; from app.config import EngineConfig; from app.engine.engine_process import "
              f"EngineProcess; e = EngineProcess(EngineConfig(model={str(DEFAULT_TARGET)!r}, num_kv_blocks=64)); "
              "print(e.pid, flush=True); time.sleep(600)")
    front = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(front.stdout.readline())
        assert is_running(child)
        front.kill()
        front.wait()
        assert wait_until(lambda: not is_running(child))
    finally:
        front.kill()


def test_every_message_round_trips_across_the_process_boundary():
    """The typed records the front and the engine process exchange come out of a real socket
    pair, in a child process, equal to what went in (what the engine loop's dispatch matches)."""
    import multiprocessing

    from app.engine.engine_stats import EngineStats
    from app.engine.request_limits import RequestLimits
    from app.engine.spec.proposal import DraftInput, Proposal
    from app.outputs import BeamHypothesis, RequestOutput, TokenLogprob

    fmt = OutputFormat("[0-9]{3}")
    stats = EngineStats(1, 0, 64, 3, 0.05, 10, 4, 0, 10, 5, 7)
    messages = [
        StartEngine(config(), True), EngineReady(RequestLimits(2048, 16, 64, 4096), stats),
        EngineFailed("Traceback ..."), AddRequest("r", [1, 2, 3], SamplingParams(max_tokens=4, seed=3), fmt),
        AddRequest("plain", [5], SamplingParams(beam_width=2, temperature=0)), AbortRequest("r"),
        DropFormat(fmt), ReportCache(4096), CacheReport(16, [-5048900421954299991, 7]), Stop(),
        StepOutputs([RequestOutput("r", [7], new_logprobs=[TokenLogprob(7, -0.5, {7: -0.5})]),
                     RequestOutput("b", [], finished=True, beams=[BeamHypothesis([1, 0], -1.0, -0.5, "stop")])],
                    stats),
        ProposeDrafts([DraftInput("r", [1, 2], 3, True, 1.0, 1.0, 0, 0.0, 9)]),
        Drafts([Proposal([4, 5])]), Drafts(None, "ConnectionError: gone")]
    ours, theirs = multiprocessing.Pipe()
    echo = multiprocessing.get_context("spawn").Process(target=_echo, args=(theirs, len(messages)))
    echo.start()
    try:
        for message in messages:
            ours.send(message)
            assert ours.recv() == message
    finally:
        echo.join(timeout=30)
    assert echo.exitcode == 0


def _echo(conn, count: int) -> None:
    for _ in range(count):
        conn.send(conn.recv())


def test_the_engine_process_asks_glibc_for_huge_pages_and_keeps_the_user_s_tunables():
    assert child_environment({}, ["/a", ""])["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    kept = child_environment({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, ["/a"])
    assert kept["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    assert kept["PYTHONPATH"] == "/a"
    own = child_environment({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, [])
    assert own["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=0"
