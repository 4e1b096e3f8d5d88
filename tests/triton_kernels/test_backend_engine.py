"""The Triton backend behind the engine's interface: same caches and outputs as the PyTorch
backend, and the same greedy tokens from the whole engine on a tiny checkpoint."""

import pytest
import torch

from app.config import EngineConfig
from app.engine.engine import LLMEngine
from specserve_kernels.torch_attention import TorchAttentionBackend
from app.sampling_params import SamplingParams
from specserve_kernels.backend import TritonAttentionBackend
from specserve_kernels.reference import make_paged_case


@pytest.mark.parametrize("query_lens,context_lens", [([1, 1, 1], [0, 16, 40]),  # decode kernel
                                                     ([1, 6, 20], [30, 11, 0])],  # prefill kernel
                         ids=["decode", "mixed"])
@pytest.mark.parametrize("per_split,merge_last", [(False, False), (True, False), (True, True)],
                         ids=["program-per-partition", "program-per-split", "program-per-split-merged-by-the-last"])
def test_backend_matches_torch_backend(query_lens, context_lens, per_split, merge_last):
    case = make_paged_case(query_lens, context_lens, 8, 2, 16, 16, torch.float32, seed=11)
    n = case.query.shape[0]
    key, value = torch.randn(n, 2, 16), torch.randn(n, 2, 16)
    ours, theirs = case.kv_cache.clone(), case.kv_cache.clone()
    triton_backend = TritonAttentionBackend(partition_size=32, split_size=16,
                                            prefill_block_n=16, prefill_rows=16,
                                            decode_options=dict(merge_by_last_program=merge_last),
                                            program_per_split_up_to=3 if per_split else 0)
    triton_backend.write_kv(key, value, ours, case.meta)
    TorchAttentionBackend().write_kv(key, value, theirs, case.meta)
    assert torch.equal(ours.nan_to_num(), theirs.nan_to_num())
    out = triton_backend.attend(case.query, ours, case.meta, 0.25)
    # The exact per-sequence path: unused blocks hold NaN here.
    ref = TorchAttentionBackend(batch_decodes=False).attend(case.query, theirs, case.meta, 0.25)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=2e-5)


def test_decode_steps_of_up_to_the_limit_take_a_program_per_split(monkeypatch):
    """The grid follows the step's sequences (a graph's padded rows): a program per split up
    to `program_per_split_up_to`, a program per partition past it."""
    import specserve_kernels.backend as backend_module
    grids = []
    monkeypatch.setattr(backend_module, "decode_attention",
                        lambda *args, program_per_split, **options: grids.append(program_per_split))
    backend = TritonAttentionBackend(partition_size=32, split_size=16, program_per_split_up_to=2)
    for batch in (1, 2, 3):
        case = make_paged_case([1] * batch, [16] * batch, 8, 2, 16, 16, torch.float32, seed=batch)
        backend.attend(case.query, case.kv_cache, case.meta, 0.25)
    assert grids == [True, True, False]


def test_decode_graphs_take_a_short_reach_with_a_program_per_split_only():
    """The reaches decode graphs are captured for, ascending: one partition and the longest;
    with a program per split, whose grid has a program for every split of the reach, also
    SHORT_REACH (a partition's grid has one program a sequence and head at any shorter reach)."""
    from specserve_kernels.backend import SHORT_REACH
    by_partition = TritonAttentionBackend(partition_size=1024, split_size=64)
    per_split = TritonAttentionBackend(partition_size=1024, split_size=64, program_per_split_up_to=16)
    assert by_partition.graph_reaches(8192) == [1024, 8192]
    assert per_split.graph_reaches(8192) == [SHORT_REACH, 1024, 8192]
    assert by_partition.graph_reaches(600) == [600] and per_split.graph_reaches(600) == [SHORT_REACH, 600]
    assert per_split.graph_reaches(100) == [100]


@pytest.mark.parametrize("small_steps_per_split", [False, True], ids=["default-grid", "per-split-up-to-2-merged-by-last"])
def test_engine_greedy_tokens_match_torch_backend(tiny_checkpoint, monkeypatch, small_steps_per_split):
    """Chunked prefill (budget 24 tokens), a shared 16-token prefix (prefix-cache hit) and
    decodes past a block boundary, through the engine with either backend; with decode steps
    of up to 2 sequences taking a program per split, merged by each sequence's last program,
    and the 3-sequence steps a program per partition."""
    if small_steps_per_split:
        options = dict(decode_options=dict(merge_by_last_program=True), program_per_split_up_to=2)
        monkeypatch.setattr(TritonAttentionBackend, "for_dtype", classmethod(lambda cls, dtype: cls(**options)))
    gen = torch.Generator().manual_seed(0)
    shared = torch.randint(2, 128, (16,), generator=gen).tolist()
    prompts = [shared + [5, 6, 7], torch.randint(2, 128, (37,), generator=gen).tolist(), shared + [9]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = {}
    for backend in ("torch", "triton"):
        engine = LLMEngine(EngineConfig(model=str(tiny_checkpoint), attention_backend=backend,
                                        device="cpu", num_kv_blocks=32, max_num_batched_tokens=24,
                                        max_model_len=256))
        assert engine.runner.backend.name == backend
        if backend == "triton":
            assert engine.runner.backend.program_per_split_up_to == (2 if small_steps_per_split else 0)
        outputs[backend] = engine.generate(prompts, params)
        assert engine.stats().prefix_cache_hits > 0
    assert outputs["triton"] == outputs["torch"]


def test_the_start_up_warm_up_writes_no_kv(tiny_checkpoint):
    """On CUDA the model runner runs padding steps at start-up so Triton compiles the eager
    steps' kernels before the first request: they must leave every cache as it was."""
    engine = LLMEngine(EngineConfig(model=str(tiny_checkpoint), attention_backend="triton", device="cpu",
                                    num_kv_blocks=32, max_num_batched_tokens=24, max_model_len=512))
    gen = torch.Generator().manual_seed(0)
    for cache in engine.runner.kv_caches:
        cache.copy_(torch.randn(cache.shape, generator=gen))
    before = [cache.clone() for cache in engine.runner.kv_caches]
    engine.runner.warm_up()
    assert all(torch.equal(cache, was) for cache, was in zip(engine.runner.kv_caches, before))


def test_the_warm_up_runs_a_prompt_for_each_row_configuration_of_the_linear_kernels_on(monkeypatch,
                                                                                      tiny_checkpoint):
    """Outside CUDA graphs (prompts) a row configuration of the skinny or fused gate_up kernels
    would compile on the first request that reaches it: the warm-up runs a prompt of its
    largest batch, for the configurations that take the kernel and only while it is on, with
    every row's logits (where ROW_CONFIGS names the lm_head, its rows are the prompt's)."""
    import specserve_kernels.gate_up_silu as fused
    import specserve_kernels.skinny_linear as skinny
    from app.engine.model_runner import linear_kernel_batches
    engine = LLMEngine(EngineConfig(model=str(tiny_checkpoint), attention_backend="triton", device="cpu",
                                    num_kv_blocks=32, max_num_batched_tokens=24, max_model_len=200))
    lengths, logits_rows = [], []

    class Recorder:
        def __call__(self, input_ids, *rest):
            lengths.append(len(input_ids))
            return torch.zeros(len(input_ids), 4)

        def compute_logits(self, hidden, fp32):
            logits_rows.append(len(hidden))

    monkeypatch.setattr(engine.runner, "model", Recorder())
    tiles = dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=64, NUM_STAGES=2, num_warps=4)
    monkeypatch.setattr(skinny, "ROW_CONFIGS", {"o_proj": ((16, skinny.CONFIG), (64, None), (128, tiles))})
    monkeypatch.setattr(fused, "ENABLED", False)
    assert linear_kernel_batches() == [16, 128]
    engine.runner.warm_up()
    backend_lengths = [n for n, _ in engine.runner.backend.warm_up_shapes(200)]
    assert 128 in lengths and 64 in backend_lengths and lengths.count(64) == 1 and 256 not in lengths
    assert logits_rows == lengths
    monkeypatch.setattr(fused, "ENABLED", True)
    monkeypatch.setattr(fused, "ROW_CONFIGS", ((16, dict(tiles, BLOCK_M=16)), (256, dict(tiles, BLOCK_M=64))))
    assert linear_kernel_batches() == [16, 64, 128, 256]  # 64: the fused kernel's one-tile variant past 16 rows
    monkeypatch.setattr(skinny, "ENABLED", False)
    monkeypatch.setattr(fused, "ENABLED", False)
    assert linear_kernel_batches() == []
    lengths.clear()
    engine.runner.warm_up()
    assert 128 not in lengths
