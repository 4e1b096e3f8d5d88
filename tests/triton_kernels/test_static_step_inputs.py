"""The padded buffers a CUDA graph replays (`StaticStepInputs`, app/engine/cuda_graphs.py),
run eagerly under the interpreter: a step loaded into a larger shape, over buffers a previous
step left full, gives the step's own hidden states and writes only its own K/V slots, for a
plain decode step and for a verifying one whose sequences carry different numbers of drafts."""

import pytest
import torch

from app.config import EngineConfig
from app.engine.cuda_graphs import StaticStepInputs
from app.engine.engine import LLMEngine
from kernels.reference import make_meta

BLOCK = 16


def block_tables(context: list[int], query_lens: list[int]) -> torch.Tensor:
    """Each sequence's blocks after the previous one's, from block 1."""
    width = -(-max(c + q for c, q in zip(context, query_lens)) // BLOCK)
    rows, first = [], 1
    for c, q in zip(context, query_lens):
        n = -(-(c + q) // BLOCK)
        rows.append(list(range(first, first + n)) + [0] * (width - n))
        first += n
    return torch.tensor(rows, dtype=torch.int32)


@pytest.mark.parametrize("query_lens,seqs,query_len", [([1, 1, 1], 4, 1), ([3, 1, 2], 4, 3)],
                         ids=["decode", "verify"])
def test_padded_step_gives_the_steps_rows(tiny_checkpoint, query_lens, seqs, query_len):
    engine = LLMEngine(EngineConfig(model=str(tiny_checkpoint), attention_backend="triton", device="cpu",
                                    num_kv_blocks=32, max_model_len=256))
    model, backend, caches = engine.runner.model, engine.runner.backend, engine.runner.kv_caches
    context = [5, 16, 40]
    tables = block_tables(context, query_lens)
    meta = make_meta(query_lens, context, tables, BLOCK)
    gen = torch.Generator().manual_seed(3)
    for cache in caches:  # the cached prefix: random K/V; every other slot NaN
        cache.fill_(float("nan"))
        for row, c in zip(tables.tolist(), context):
            for p in range(c):
                cache[:, row[p // BLOCK], p % BLOCK] = torch.randn(cache[:, 0, 0].shape, generator=gen)
    tokens = sum(query_lens)
    input_ids = torch.randint(2, 128, (tokens,), generator=gen)
    positions = torch.tensor([c + j for c, q in zip(context, query_lens) for j in range(q)])
    before = [c.clone() for c in caches]

    with torch.inference_mode():
        want = model(input_ids, positions, caches, meta, backend)
    eager_caches = [c.clone() for c in caches]
    for cache, b in zip(caches, before):
        cache.copy_(b)

    inputs = StaticStepInputs(max_seqs=8, max_tokens=8 * query_len, max_blocks_per_seq=17, device="cpu")
    # A full earlier step over the same blocks: stale slots, starts and lengths in every buffer.
    full = [query_len] * seqs
    stale = make_meta(full, [1] * seqs, block_tables([1] * seqs, full), BLOCK)
    inputs.load(torch.ones(seqs * query_len, dtype=torch.long), torch.ones(seqs * query_len, dtype=torch.long),
                stale, seqs, query_len)
    assert inputs.load(input_ids, positions, meta, seqs, query_len) == tokens
    # Padding: no slot, no context, no query rows (a stale start could point past the shape's rows).
    padded = inputs.meta(seqs, query_len, reach=17 * BLOCK)
    assert (padded.slot_mapping[tokens:] == -1).all() and (padded.seq_lens[3:] == 0).all()
    if query_len > 1:  # (plain decode reads no starts: each sequence's row is its index)
        assert padded.query_start_loc.tolist() == meta.query_start_loc.tolist() + [tokens] * (seqs - 3)
    with torch.inference_mode():
        got = model(inputs.input_ids[:seqs * query_len], inputs.positions[:seqs * query_len], caches,
                    padded, backend)[:tokens]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for g, e in zip(caches, eager_caches):  # the step's slots written, nothing else
        assert torch.equal(g.isnan(), e.isnan())
        torch.testing.assert_close(g.nan_to_num(), e.nan_to_num(), atol=1e-5, rtol=1e-5)
