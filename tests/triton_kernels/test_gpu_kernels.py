"""GPU checks of the CUDA path's kernels (`pytest -m gpu`; skipped without CUDA): in bf16 at
Llama-3-8B shapes against their fp32 references (attention, the KV write, RMSNorm, rotary, the
skinny linear, gate_up with SiLU x up), the rope table's rows against the computed cos/sin, and the argmax kernel
against torch's. The engine's checks are in test_gpu.py."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BF16_TOL = dict(atol=3e-2, rtol=3e-2)


def _case(query_lens, context_lens, heads, kv_heads, head_dim=128, dtype=torch.bfloat16):
    from specserve_kernels.reference import make_paged_case
    return make_paged_case(query_lens, context_lens, heads, kv_heads, head_dim, 16, dtype,
                           seed=sum(query_lens), device="cuda")


@pytest.mark.parametrize("heads,kv_heads", [(32, 32), (32, 8), (32, 4), (40, 8)])
def test_decode_bf16(heads, kv_heads):
    from specserve_kernels.decode_attention import decode_attention
    from specserve_kernels.reference import attention_ref
    case = _case([1] * 6, [0, 15, 16, 511, 1327, 4100], heads, kv_heads)
    kv, m = case.kv_cache, case.meta
    for partition in (256, 8192):
        outs = [decode_attention(case.query, kv[0], kv[1], m.block_tables, m.seq_lens, 0.088,
                                 m.max_seq_len, partition_size=partition, program_per_split=per_split,
                                 dots="16", head_major=True)
                for per_split in (False, True)]
        torch.testing.assert_close(outs[0].float(), attention_ref(case, 0.088), **BF16_TOL)
        # either grid may be chosen for any batch: the compiled folds must give the same bits
        assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("per_split", [True, False], ids=["program-per-split", "program-per-partition"])
def test_decode_merged_by_the_last_program_bf16(per_split):
    """Each sequence's last program merges its states instead of the merge kernel: the same
    bits launch after launch and in a CUDA graph's replays (a state read before it was
    written, or a count left set, would change them), zeros for a padding row."""
    from specserve_kernels.decode_attention import decode_attention
    case = _case([1] * 6, [0, 15, 16, 511, 1327, 4100], 32, 8)
    kv, m = case.kv_cache, case.meta
    m.seq_lens[0] = 0

    def attend(merge_by_last_program):
        return decode_attention(case.query, kv[0], kv[1], m.block_tables, m.seq_lens, 0.088, 8192,
                                partition_size=1024, split_size=64, program_per_split=per_split, dots="16",
                                head_major=True, merge_by_last_program=merge_by_last_program)

    want = attend(False)
    assert all(torch.equal(attend(True), want) for _ in range(20))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = attend(True)
    for _ in range(5):
        graph.replay()
        assert torch.equal(replayed, want)
    assert torch.equal(want[0], torch.zeros_like(want[0]))


@pytest.mark.parametrize("heads,kv_heads", [(32, 8), (40, 8), (16, 16)])
def test_prefill_bf16(heads, kv_heads):
    from specserve_kernels.prefill_attention import prefill_attention
    from specserve_kernels.reference import attention_ref
    case = _case([1, 5, 129, 700, 17], [1327, 13, 334, 0, 16], heads, kv_heads)
    kv, m = case.kv_cache, case.meta
    out = prefill_attention(case.query, kv[0], kv[1], m.block_tables, m.query_start_loc,
                            m.context_lens, 0.088, m.max_query_len)
    torch.testing.assert_close(out.float(), attention_ref(case, 0.088), **BF16_TOL)


def test_write_norm_rotary_bf16():
    from specserve_kernels.torch_attention import write_kv_cache as write_ref
    from app.models.rope import RotaryEmbedding
    from specserve_kernels.kv_cache_write import write_kv_cache
    from specserve_kernels.reference import rms_norm_ref, rotary_ref
    from specserve_kernels.rmsnorm import rms_norm
    from specserve_kernels.rotary import apply_rotary_
    dev, bf16 = "cuda", torch.bfloat16
    key, value = torch.randn(2, 300, 8, 128, device=dev, dtype=bf16)
    slots = torch.randperm(64 * 16, device=dev)[:300]
    slots[::7] = -1
    got = torch.zeros(2, 64, 16, 8, 128, device=dev, dtype=bf16)
    want = got.clone()
    write_kv_cache(key, value, got[0], got[1], slots)
    write_ref(key, value, want, slots)
    assert torch.equal(got, want)
    x, r = torch.randn(2, 33, 4096, device=dev, dtype=bf16)
    w = torch.rand(4096, device=dev, dtype=bf16) + 0.5
    y, h = rms_norm(x, w, 1e-5, residual=r)
    y_ref, h_ref = rms_norm_ref(x, w, 1e-5, residual=r)
    assert torch.equal(h, h_ref)
    torch.testing.assert_close(y, y_ref, atol=2e-2, rtol=2e-2)
    q, k = torch.randn(33, 32, 128, device=dev, dtype=bf16), torch.randn(33, 8, 128, device=dev, dtype=bf16)
    cos, sin = RotaryEmbedding(128, 500000.0, None).to(dev).cos_sin(torch.arange(33, device=dev) * 97, bf16)
    q_ref, k_ref = rotary_ref(q, k, cos, sin)
    apply_rotary_(q, k, cos, sin)
    torch.testing.assert_close(q, q_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(k, k_ref, atol=2e-2, rtol=2e-2)


def test_rope_table_rows_are_the_computed_cos_sin_bit_for_bit():
    """A CUDA step gathers cos/sin from the table `ModelRunner` builds; each row must be what
    computing it for that position gives (the fp32 engine equals transformers token for token)."""
    from app.models.rope import RotaryEmbedding
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    positions = torch.randint(0, 16384, (4096,), device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        rope = RotaryEmbedding(128, 500000.0, scaling).to("cuda")
        computed = rope.cos_sin(positions, dtype)
        rope.tabulate(16384, dtype)
        gathered = rope.cos_sin(positions, dtype)
        assert all(torch.equal(a, b) for a, b in zip(gathered, computed))


def test_argmax_kernel_is_torchs_on_bf16_logits():
    """bf16 logits tie often: the first index of the maximum, as torch.argmax takes it."""
    from specserve_kernels.argmax import argmax_rows
    logits = (torch.randn(256, 128256, device="cuda") * 4).to(torch.bfloat16)
    argmax = torch.empty(256, dtype=torch.long, device="cuda")
    argmax_rows(logits, argmax)
    assert torch.equal(argmax, torch.argmax(logits, dim=-1))
    assert (logits == logits.max(-1, keepdim=True).values).sum(-1).max() > 1, "rows with ties"


def test_skinny_linear_bf16_at_llama_shapes():
    import torch.nn.functional as F
    from specserve_kernels.skinny_linear import MAX_ROWS, skinny_linear
    for in_features, out_features in ((4096, 6144), (4096, 4096), (14336, 4096)):
        w = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) / in_features ** 0.5
        bias = torch.randn(out_features, device="cuda", dtype=torch.bfloat16)
        for rows in (1, 5, MAX_ROWS):
            x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
            want = F.linear(x.float(), w.float(), bias.float())
            torch.testing.assert_close(skinny_linear(x, w, bias).float(), want, **BF16_TOL)


@pytest.mark.parametrize("tiles", [dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, NUM_STAGES=4, num_warps=8),
                                   dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, NUM_STAGES=3, num_warps=8, SPLIT_K=4),
                                   dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, NUM_STAGES=4, num_warps=4, SPLIT_K=2)],
                         ids=["row-tiles", "split-k-4", "split-k-2"])
def test_skinny_linear_in_tiles_of_rows_bf16_at_llama_shapes(tiles):
    """What benchmarks/linears.py times at 64 and 256 rows: within bf16 rounding of the fp32
    reference at o_proj's and down_proj's shapes, the same bits launch after launch and in a
    CUDA graph's replays (split-K's last part to arrive sums the parts in their order: were a
    part's sums read before they were written, or a count left set, they would differ)."""
    import torch.nn.functional as F
    from specserve_kernels.skinny_linear import skinny_linear
    for in_features, out_features in ((4096, 4096), (14336, 4096)):
        w = torch.randn(out_features, in_features, device="cuda", dtype=torch.bfloat16) / in_features ** 0.5
        for rows in (64, 200, 256):
            x = torch.randn(rows, in_features, device="cuda", dtype=torch.bfloat16)
            got = skinny_linear(x, w, None, tiles)
            torch.testing.assert_close(got.float(), F.linear(x.float(), w.float()), **BF16_TOL)
            assert all(torch.equal(skinny_linear(x, w, None, tiles), got) for _ in range(20))
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                replayed = skinny_linear(x, w, None, tiles)
            for _ in range(5):
                graph.replay()
                assert torch.equal(replayed, got)


def test_gate_up_silu_bf16_at_llama_shapes():
    """At every row configuration (one tile of 16 rows, then tiles of 64 and 128): within bf16
    rounding of the fp32 reference, and the skinny projection at the same tiles then the SiLU
    kernel's numbers on most elements (each half is summed the same way, but two kernels
    compiled apart need not order their sums alike)."""
    import torch.nn.functional as F
    from specserve_kernels.gate_up_silu import config_for, gate_up_silu
    from specserve_kernels.silu_mul import silu_and_mul
    from specserve_kernels.skinny_linear import skinny_linear
    hidden, intermediate = 4096, 14336
    w = torch.randn(2 * intermediate, hidden, device="cuda", dtype=torch.bfloat16) / hidden ** 0.5
    for rows in (1, 5, 16, 40, 64, 200, 256):
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16)
        got = gate_up_silu(x, w)
        gate, up = F.linear(x.float(), w.float()).chunk(2, dim=-1)
        torch.testing.assert_close(got.float(), F.silu(gate) * up, **BF16_TOL)
        assert (got == silu_and_mul(skinny_linear(x, w, None, config_for(rows)))).float().mean() > 0.99, rows
