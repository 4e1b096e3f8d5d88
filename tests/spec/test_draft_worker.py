"""The draft side: proposals equal the draft model's own greedy continuation, a sequence seen
before recomputes only its new tokens, and draft distributions survive the trip exactly."""

from __future__ import annotations

import pytest
import torch

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.engine.spec.draft_worker import DraftWorker, uncached_tails
from app.engine.spec.proposal import CompactProbs, DraftInput
from app.sampling_params import SamplingParams
from tests.checkpoints import DEFAULT_DRAFT, DEFAULT_TARGET


@pytest.fixture(scope="module")
def worker() -> DraftWorker:
    return DraftWorker(EngineConfig(model=str(DEFAULT_DRAFT), num_kv_blocks=64))


def sequences(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(5, 4000, (int(l),), generator=g).tolist() for l in torch.randint(1, 70, (n,), generator=g)]


def test_greedy_proposals_are_the_draft_models_greedy_continuation(worker):
    seqs = sequences(4)
    proposals = worker.propose_batch([DraftInput(str(i), s, 5) for i, s in enumerate(seqs)])
    reference = LLMEngine(EngineConfig(model=str(DEFAULT_DRAFT), num_kv_blocks=64)).generate(
        seqs, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    assert [p.token_ids for p in proposals] == reference
    assert all(p.probs is None for p in proposals)
    assert worker.block_manager.num_used_blocks == 0


def test_a_sequence_seen_before_recomputes_only_its_tail(worker):
    seq = sequences(1)[0] * 3  # > 2 blocks
    worker.propose_batch([DraftInput("a", seq, 4)])
    before = worker.num_computed_tokens
    worker.propose_batch([DraftInput("a", seq + [17, 18], 4)])
    recomputed = worker.num_computed_tokens - before
    bs = worker.block_manager.block_size
    assert recomputed <= bs + 2 + 3  # the partial block, the new tokens, k - 1 decode steps


def test_a_call_for_sequences_seen_before_fits_the_tail_graphs():
    """Once a sequence's prompt is in, each call's first forward runs at most
    `uncached_tails(config).query_len` tokens of it: the shape for which a draft on CUDA
    captures graphs. Tokens accepted since the last call are k + 1 at most, the partial block
    is below block_size."""
    engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=128, speculative_method="draft",
                                    draft_model=str(DEFAULT_DRAFT), speculation_schedule=4,
                                    adaptive_speculation=False, prompt_lookup_first=False))
    worker = engine.speculator.proposer
    first_forwards: dict[int, int] = {}  # call -> the most tokens of one sequence in its first forward
    execute = worker.runner.execute

    def recording(batch, *args, **kwargs):
        first_forwards.setdefault(worker.num_calls, max(batch.values()))
        return execute(batch, *args, **kwargs)

    worker.runner.execute = recording
    engine.generate([s + s for s in sequences(2)], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    tails = list(first_forwards.values())
    bound = uncached_tails(worker.config).query_len
    assert bound == worker.config.block_size + 4 and not uncached_tails(worker.config).every_row_sampled
    assert tails[0] > bound and len(tails) > 5  # the prompts, then the calls of each step
    assert max(tails[1:]) <= bound


def test_sampled_proposals_carry_their_distribution(worker):
    seq = sequences(1)[0]
    inp = DraftInput("s", seq, 3, greedy=False, temperature=0.9, top_k=50, seed=5)
    first, again = worker.propose_batch([inp]), worker.propose_batch([inp])
    assert first[0].token_ids == again[0].token_ids  # the seed fixes the draft's stream
    probs = first[0].probs.decode()
    assert probs.shape == (3, 4096)
    assert torch.allclose(probs.sum(-1), torch.ones(3))
    assert ((probs > 0).sum(-1) <= 50).all()  # top-k applied on the draft side too
    for row, token in zip(probs, first[0].token_ids):
        assert row[token] > 0


@pytest.mark.parametrize("nonzero", [5, 4096])
def test_compact_probs_round_trip(nonzero):
    g = torch.Generator().manual_seed(0)
    probs = torch.zeros(3, 4096)
    for row in probs:
        idx = torch.randperm(4096, generator=g)[:nonzero]
        row[idx] = torch.rand(nonzero, generator=g)
    probs /= probs.sum(-1, keepdim=True)
    compact = CompactProbs.encode(probs)
    assert (compact.indices is not None) == (nonzero == 5)
    assert compact.nbytes <= probs.numel() * 2
    decoded = compact.decode(width=4100)
    assert decoded.shape == (3, 4100) and (decoded[:, 4096:] == 0).all()
    half = probs.half().float()
    assert torch.equal(decoded[:, :4096], half / half.sum(-1, keepdim=True))


def test_the_draft_cache_is_salted_as_the_targets(worker):
    """A request's `cache_salt` reaches the draft side: its blocks are not another salt's."""
    seq = sequences(1)[0] * 3
    worker.propose_batch([DraftInput("a", seq, 4, cache_salt="tenant-a")])
    before = worker.num_computed_tokens
    worker.propose_batch([DraftInput("b", seq, 4, cache_salt="tenant-b")])
    assert worker.num_computed_tokens - before >= len(seq)  # all of it again
    before = worker.num_computed_tokens
    worker.propose_batch([DraftInput("c", seq, 4, cache_salt="tenant-a")])
    assert worker.num_computed_tokens - before < len(seq)
