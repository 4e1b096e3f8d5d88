"""The draft channel (app/engine/spec/draft_channel.py): an engine's proposals go straight to a
draft replica and come back exactly as the replica's worker made them; when the channel breaks,
is slow, or answers with the wrong key, that step has no drafts or goes through Serve, and the
engine finds a live replica again."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.spec.draft_channel import DirectDraftProposer, DraftChannelAddress, DraftChannelServer
from app.engine.spec.draft_worker import DraftWorker
from app.engine.spec.proposal import DraftInput, Proposal
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET


class LockedWorker:
    """One batch at a time through the draft worker, as the DraftModel replica runs it."""

    def __init__(self):
        self.worker = DraftWorker(EngineConfig(model=str(DEFAULT_DRAFT), num_kv_blocks=64))
        self.lock = threading.Lock()

    def propose_batch(self, batch: list[DraftInput]) -> list[Proposal]:
        with self.lock:
            return self.worker.propose_batch(batch)


@pytest.fixture(scope="module")
def worker() -> LockedWorker:
    return LockedWorker()


class ServePath:
    """What a target replica's DraftClient is to the proposer: Serve's way, counted."""

    def __init__(self, *servers: DraftChannelServer | None):
        self.servers = list(servers)  # what each search finds, in turn (None: no channel)
        self.searches = 0
        self.proposals = 0

    def find_draft_channel(self) -> DraftChannelAddress | None:
        self.searches += 1
        server = self.servers[min(self.searches, len(self.servers)) - 1]
        return server.address if server is not None else None

    def propose_batch(self, inputs: list[DraftInput]) -> list[Proposal]:
        self.proposals += 1
        return [Proposal([]) for _ in inputs]


def inputs() -> list[DraftInput]:
    g = torch.Generator().manual_seed(7)
    seqs = [torch.randint(5, 4000, (n,), generator=g).tolist() for n in (9, 40)]
    return [DraftInput("greedy", seqs[0], 4),
            DraftInput("sampled", seqs[1], 3, greedy=False, temperature=0.8, top_p=0.9, seed=11)]


def test_proposals_over_the_channel_are_the_workers_own(worker):
    server = DraftChannelServer(worker.propose_batch, "127.0.0.1")
    serve_path = ServePath(server)
    proposer = DirectDraftProposer(serve_path)
    try:
        expected = worker.propose_batch(inputs())
        for _ in range(3):
            got = proposer.propose_batch(inputs())
            assert [p.token_ids for p in got] == [p.token_ids for p in expected]
            assert got[0].probs is None
            # The worker reads the prompt from its prefix cache after the first call: the same
            # distribution, computed in another order (fp16 on the wire, so a rounding apart).
            torch.testing.assert_close(got[1].probs.decode(), expected[1].probs.decode(), rtol=0, atol=2e-3)
    finally:
        proposer.close()
        server.close()
    assert proposer.num_direct_calls == 3
    assert serve_path.searches == 1 and serve_path.proposals == 0


def test_a_broken_channel_fails_one_step_then_serve_proposes_until_a_live_replica_is_found(worker):
    dying = DraftChannelServer(worker.propose_batch, "127.0.0.1")
    live = DraftChannelServer(worker.propose_batch, "127.0.0.1")
    serve_path = ServePath(dying, live)
    proposer = DirectDraftProposer(serve_path, retry_after_s=0.5)
    try:
        assert proposer.propose_batch(inputs())[0].token_ids
        dying.close()
        with pytest.raises((OSError, EOFError)):
            proposer.propose_batch(inputs())
        assert proposer.propose_batch(inputs())[0].token_ids == []  # through Serve meanwhile
        assert serve_path.proposals == 1
        time.sleep(0.6)
        assert proposer.propose_batch(inputs())[0].token_ids  # the live replica's channel
    finally:
        proposer.close()
        live.close()
    assert serve_path.searches == 2 and proposer.num_direct_calls == 2


def test_a_slow_replica_times_out_the_step_and_the_late_answer_is_never_read(worker):
    release = threading.Event()

    def slow(batch):
        release.wait(5)
        return worker.propose_batch(batch)

    slow_server = DraftChannelServer(slow, "127.0.0.1")
    fast_server = DraftChannelServer(worker.propose_batch, "127.0.0.1")
    proposer = DirectDraftProposer(ServePath(slow_server, fast_server), timeout_s=0.3, retry_after_s=0.0)
    try:
        with pytest.raises(TimeoutError):
            proposer.propose_batch(inputs())
        release.set()
        expected = worker.propose_batch(inputs()[:1])
        assert [p.token_ids for p in proposer.propose_batch(inputs()[:1])] == [expected[0].token_ids]
    finally:
        proposer.close()
        slow_server.close()
        fast_server.close()


def test_a_wrong_key_opens_no_channel_and_nothing_is_unpickled():
    calls = []
    server = DraftChannelServer(lambda batch: calls.append(batch) or [], "127.0.0.1")

    class WrongKey(ServePath):
        def find_draft_channel(self):
            self.searches += 1
            return DraftChannelAddress(server.address.host, server.address.port, b"not the key")

    serve_path = WrongKey()
    proposer = DirectDraftProposer(serve_path)
    try:
        assert proposer.propose_batch(inputs()) == [Proposal([]), Proposal([])]  # Serve's way
    finally:
        proposer.close()
        server.close()
    assert serve_path.proposals == 1 and calls == []


def test_no_channel_means_every_proposal_goes_through_serve(worker):
    serve_path = ServePath(None)
    proposer = DirectDraftProposer(serve_path, retry_after_s=60)
    for _ in range(3):
        proposer.propose_batch(inputs())
    assert serve_path.proposals == 3 and serve_path.searches == 1


class Alternating(ServePath):
    """Every search finds the other replica, so each step's drafts come from the replica that
    did not draft the step before (its KV holds none of the tokens since)."""

    def find_draft_channel(self) -> DraftChannelAddress:
        self.searches += 1
        return self.servers[self.searches % len(self.servers)].address


def test_drafts_from_replicas_that_never_saw_the_sequence_give_the_same_tokens():
    def engine(proposer=None):
        return LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), speculative_method="draft" if proposer else None,
                                      num_kv_blocks=128, speculation_schedule={1: 4}, adaptive_speculation=False),
                         proposer)

    prompts = [list(range(100, 140)), [7, 8, 9] * 10]
    greedy = SamplingParams(max_tokens=24, temperature=0.0)
    seeded = SamplingParams(max_tokens=24, temperature=0.8, top_p=0.9, seed=3)
    replicas = [LockedWorker(), LockedWorker()]  # each with a KV pool of its own
    servers = [DraftChannelServer(r.propose_batch, "127.0.0.1") for r in replicas]
    one_replica = DraftChannelServer(LockedWorker().propose_batch, "127.0.0.1")
    alternating = DirectDraftProposer(Alternating(*servers), refind_after_s=0.0)
    steady = DirectDraftProposer(ServePath(one_replica))
    try:
        speculating = engine(alternating)
        assert speculating.generate(prompts, greedy) == engine().generate(prompts, greedy)
        assert speculating.speculator.stats.num_accepted_tokens > 0
        # A seeded sampled request drafts the same tokens whichever replica answers.
        assert speculating.generate(prompts[:1], seeded) == engine(steady).generate(prompts[:1], seeded)
    finally:
        for proposer in (alternating, steady):
            proposer.close()
        for server in servers + [one_replica]:
            server.close()
    assert alternating.serve_path.proposals == 0 and alternating.num_direct_calls > 4
    assert all(r.worker.num_calls > 1 for r in replicas)
