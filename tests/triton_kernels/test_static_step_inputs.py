"""The CUDA-graph runner's buffers and choices (app/engine/cuda_graphs.py,
app/engine/static_step_inputs.py), run under the interpreter, where each "replay" runs the
captured step's forward again over the same static buffers (`EagerStep`): what the graph would
compute, without the capture itself (tests/triton_kernels/test_gpu.py covers that on a GPU).

- A step loaded into a larger shape, over buffers a previous step left full, gives the step's
  own hidden states, logits and argmax, and writes only its own K/V slots: a plain decode step
  and a verifying one whose sequences carry different numbers of drafts.
- Through the engine with overlapped scheduling: plain decode steps, greedy and sampled, are
  chosen inside the replay, the rows whose tokens the step in flight chose read them on the
  device (from the graph's choice, or from tokens chosen after it and copied in), and the
  tokens are the engine's without graphs.
"""

import numpy as np
import pytest
import torch

from app.config import EngineConfig
from app.engine.cuda_graphs import CudaGraphDecodeRunner, MultiTokenSteps
from app.engine.engine import LLMEngine
from app.engine.spec.draft_worker import DraftWorker
from app.engine.spec.proposal import DraftInput
from app.engine.step_inputs import StepArrays
from app.sampling_params import SamplingParams
from specserve_kernels.reference import make_meta

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


def step_arrays(input_ids: torch.Tensor, positions: torch.Tensor, meta) -> StepArrays:
    """The host arrays of a step given as tensors (on any device)."""
    host = lambda t: t.cpu().numpy()  # noqa: E731
    return StepArrays(
        input_ids=host(input_ids), positions=host(positions), slot_mapping=host(meta.slot_mapping),
        query_start_loc=host(meta.query_start_loc), seq_lens=host(meta.seq_lens),
        context_lens=host(meta.context_lens), block_tables=host(meta.block_tables),
        query_lens=meta.query_lens_cpu, seq_lens_list=meta.seq_lens_cpu,
        sample_rows=list(range(len(input_ids))))


def engine_on_cpu(checkpoint, **config) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(checkpoint), attention_backend="triton", device="cpu",
                                  max_model_len=256, **config))


@pytest.mark.parametrize("query_lens", [[1, 1, 1], [3, 1, 2]], ids=["decode", "verify"])
def test_padded_step_gives_the_steps_rows(tiny_checkpoint, query_lens):
    engine = engine_on_cpu(tiny_checkpoint, num_kv_blocks=32)
    model, backend, caches = engine.runner.model, engine.runner.backend, engine.runner.kv_caches
    graphs = CudaGraphDecodeRunner(model, caches, backend, max_batch_size=8, max_blocks_per_seq=17,
                                   device="cpu", multi_token=MultiTokenSteps(query_len=3, max_seqs=4))
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
        hidden = model(input_ids, positions, caches, meta, backend)
        logits = model.compute_logits(hidden, fp32=False)
    eager_caches = [c.clone() for c in caches]
    for cache, b in zip(caches, before):
        cache.copy_(b)

    # A full earlier step of the largest shape over the same blocks: stale slots, starts,
    # lengths and block-table rows in every buffer, and both host buffers used.
    query_len = max(query_lens)
    most = 8 if query_len == 1 else 4
    full = [query_len] * most
    stale = make_meta(full, [1] * most, block_tables([1] * most, full), BLOCK)
    stale_ids = torch.ones(most * query_len, dtype=torch.long)
    for _ in range(2):
        graphs.inputs.load(step_arrays(stale_ids, stale_ids, stale), None, None, most, query_len,
                           graphs.max_seq_len)

    step = step_arrays(input_ids, positions, meta)
    assert graphs.can_run(step)
    got = graphs.run(step)
    # Padding: no slot, no context, no query rows (a stale start could point past the shape's rows).
    seqs = 4
    padded = graphs.inputs.meta(seqs, query_len, reach=graphs.max_seq_len)
    assert (padded.slot_mapping[tokens:] == -1).all() and (padded.seq_lens[3:] == 0).all()
    if query_len > 1:  # (plain decode reads no starts: each sequence's row is its index)
        assert padded.query_start_loc.tolist() == meta.query_start_loc.tolist() + [tokens] * (seqs - 3)
    torch.testing.assert_close(got.hidden, hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.logits, logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(got.argmax, got.logits.argmax(-1))
    for g, e in zip(caches, eager_caches):  # the step's slots written, nothing else
        assert torch.equal(g.isnan(), e.isnan())
        torch.testing.assert_close(g.nan_to_num(), e.nan_to_num(), atol=1e-5, rtol=1e-5)


def params_of(kind: str, i: int) -> SamplingParams:
    common = dict(max_tokens=10, ignore_eos=True)
    if kind == "greedy" or i % 2 == 0:
        return SamplingParams(temperature=0.0, **common)
    sampled = dict(temperature=0.9, top_p=0.8 if i % 4 == 1 else 1.0, min_p=0.05 if i % 4 == 3 else 0.0,
                   seed=i if i % 3 else None, **common)  # seeded and unseeded draws
    return SamplingParams(top_k=5 if kind == "top-k" else 0, **sampled)


@pytest.mark.parametrize("kind,chosen_in_graph", [("greedy", True), ("sampled", True), ("top-k", False)])
def test_overlapped_steps_through_the_graph_runner_give_the_plain_engines_tokens(tiny_checkpoint, kind,
                                                                                  chosen_in_graph):
    """Greedy requests beside sampled ones, seeded and not, with top-p and min-p: the graph
    chooses every token of a decode step (its argmax, or a draw with the uniforms the host
    sent), and the next step's rows read them on the device. With a top-k cut the step is
    chosen after the replay and its tokens are copied in for the next. Prompts of different
    lengths, so some steps mix a prompt chunk in and run eagerly. The tokens are those of the
    same engine without graphs."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(2, 128, (n,), generator=gen).tolist() for n in (3, 17, 9, 30, 6, 11)]
    params = [params_of(kind, i) for i in range(len(prompts))]
    config = dict(num_kv_blocks=40, max_num_seqs=6, max_num_batched_tokens=24, enable_prefix_caching=False,
                  overlap_scheduling=True)
    expected = engine_on_cpu(tiny_checkpoint, **config).generate(prompts, params)
    engine = engine_on_cpu(tiny_checkpoint, **config)
    runner = engine.runner
    runner.cuda_graphs = CudaGraphDecodeRunner(runner.model, runner.kv_caches, runner.backend,
                                               max_batch_size=6, max_blocks_per_seq=17, device="cpu")
    selections = []
    on_device = engine.selector.on_device
    engine.selector.on_device = lambda *a, **k: selections.append(on_device(*a, **k)) or selections[-1]
    assert engine.generate(prompts, params) == expected
    in_graph = sum(s.tokens_only for s in selections)
    assert in_graph >= 8 if chosen_in_graph else in_graph == 0  # the steady decode steps
    assert engine.in_flight is None and not engine.block_manager.tables.row_of


def test_step_arrays_cross_in_one_copy_of_the_rows_used(tiny_checkpoint):
    """The block tables go last, each row as wide as the graph's reach, and only the step's
    rows are copied: a step of one sequence copies the fixed fields and one narrow row; a
    block allocated past the reach is not copied over the next row."""
    engine = engine_on_cpu(tiny_checkpoint, num_kv_blocks=32)
    runner = engine.runner
    graphs = CudaGraphDecodeRunner(runner.model, runner.kv_caches, runner.backend, max_batch_size=4,
                                   max_blocks_per_seq=17, device="cpu")
    inputs = graphs.inputs
    assert graphs.reaches == [256, 272] and inputs.block_table_columns(256) == 16
    meta = make_meta([1], [20], torch.tensor([[3, 4, 9]], dtype=torch.int32), BLOCK)  # a block ahead
    step = step_arrays(torch.tensor([9]), torch.tensor([20]), meta)
    for reach, columns in ((256, 16), (32, 2)):
        inputs.block_table_space.fill_(7)
        inputs.load(step, None, None, 1, 1, reach)
        row = inputs.block_tables(1, reach)[0].tolist()
        assert len(row) == columns and row[:3] == [3, 4, 9][:columns]
        assert (inputs.block_table_space[columns:] == 7).all()  # rows past the step's: not copied
    assert inputs.slot_mapping[0].item() == 4 * BLOCK + 4 and inputs.input_ids[0].item() == 9
    assert np.array_equal(inputs.from_source[:1].numpy(), [-1])


def test_a_draft_worker_takes_its_greedy_tokens_from_the_graphs_argmax(tiny_checkpoint):
    """A draft's plain steps replay graphs that take each row's argmax with the logits: the
    worker proposes from it (no fp32 copy of the logits, no second argmax) and casts only its
    sampled rows, proposing the tokens and distributions of the same worker without graphs."""
    config = EngineConfig(model=str(tiny_checkpoint), attention_backend="triton", device="cpu",
                          max_model_len=256, num_kv_blocks=40)
    gen = torch.Generator().manual_seed(6)
    inputs = [DraftInput(str(i), torch.randint(2, 128, (n,), generator=gen).tolist(), 4, greedy=i != 1,
                         temperature=0.8, top_p=0.9, seed=i) for i, n in enumerate((5, 19, 12))]
    expected = DraftWorker(config).propose_batch(inputs)
    worker = DraftWorker(config)
    runner = worker.runner
    runner.cuda_graphs = CudaGraphDecodeRunner(runner.model, runner.kv_caches, runner.backend,
                                               max_batch_size=4, max_blocks_per_seq=17, device="cpu")
    argmaxes = []
    sample = worker._sample
    worker._sample = lambda logits, argmax, *a: argmaxes.append(argmax) or sample(logits, argmax, *a)
    proposals = worker.propose_batch(inputs)
    assert [p.token_ids for p in proposals] == [p.token_ids for p in expected]
    assert proposals[1].probs.decode().equal(expected[1].probs.decode())
    assert sum(a is not None for a in argmaxes) == 3  # the k - 1 one-token steps replayed graphs
