"""Paged decode attention (split-K, grouped GQA) against the engine's PyTorch attention."""

import pytest
import torch

from specserve_kernels.decode_attention import decode_attention
from specserve_kernels.reference import attention_ref, make_paged_case

TOL = {torch.float32: 2e-5, torch.float16: 2e-3}
GQA = [(2, 2), (4, 1), (8, 1), (10, 2)]  # (heads, kv_heads): ratios 1, 4, 8 and 5:1


def run_decode(case, scale=0.25, **kw):
    kv, meta = case.kv_cache, case.meta
    kw.setdefault("max_seq_len", meta.max_seq_len)
    return decode_attention(case.query, kv[0], kv[1], meta.block_tables, meta.seq_lens, scale, **kw)


def check(out, case, scale=0.25):
    ref = attention_ref(case, scale)
    assert not out.isnan().any(), "NaN in the output: a stray read of an unused slot"
    torch.testing.assert_close(out.float(), ref, atol=TOL[case.query.dtype], rtol=TOL[case.query.dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads", GQA)
@pytest.mark.parametrize("partition,per_split", [(16, False), (1024, False), (32, True)],
                         ids=["partitions", "one-partition", "program-per-split"])
def test_block_boundaries(dtype, heads, kv_heads, partition, per_split):
    lens = [1, 15, 16, 17, 33]
    case = make_paged_case([1] * len(lens), [n - 1 for n in lens], heads, kv_heads, 16, 16, dtype,
                           seed=heads)
    check(run_decode(case, partition_size=partition, split_size=16,
                     program_per_split=per_split), case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_long_context_split_k(dtype):
    """(1, 1328) and a short neighbour: six partitions of 256 against one, splits of 64,
    head_dim 32, block 32."""
    case = make_paged_case([1, 1], [1327, 40], 4, 1, 32, 32, dtype, seed=1)
    check(run_decode(case, partition_size=256, split_size=64), case)


def test_padded_head_dim_and_partition_not_a_power_of_two():
    """head_dim 24 (padded to 32); partition 40, five splits of 8 keys in blocks of 8: partial
    last splits and partitions."""
    case = make_paged_case([1, 1], [70, 5], 4, 2, 24, 8, torch.float32, seed=2)
    check(run_decode(case, partition_size=40, split_size=8), case)
    check(run_decode(case, partition_size=40, split_size=8, program_per_split=True), case)


def test_split_count_ignores_batch():
    """A sequence's output is bitwise the same alone, beside a much longer one, and with the
    grid sized for a max length far over the batch's (as under a CUDA graph)."""
    case = make_paged_case([1, 1], [299, 1000], 4, 1, 16, 16, torch.float32, seed=3)
    both = run_decode(case, partition_size=64, split_size=32)
    kv, m = case.kv_cache, case.meta
    alone = decode_attention(case.query[:1], kv[0], kv[1], m.block_tables[:1], m.seq_lens[:1],
                             0.25, max_seq_len=300, partition_size=64, split_size=32)
    static = run_decode(case, partition_size=64, split_size=32, max_seq_len=4096)
    assert torch.equal(both[:1], alone)
    assert torch.equal(both, static)


def test_a_one_partition_sequence_is_the_same_without_the_merge_and_through_it():
    """Short sequences get their output from the split kernel where every sequence fits one
    partition (no merge), and through the merge beside a long neighbour or in a grid sized for
    a long max length (a CUDA graph's): the same bits either way."""
    case = make_paged_case([1, 1, 1, 1], [3, 20, 63, 150], 8, 2, 16, 16, torch.float32, seed=4)
    kv, m = case.kv_cache, case.meta
    short = decode_attention(case.query[:3], kv[0], kv[1], m.block_tables[:3], m.seq_lens[:3], 0.25,
                             max_seq_len=64, partition_size=64, split_size=16)
    beside_long = run_decode(case, partition_size=64, split_size=16)
    static = run_decode(case, partition_size=64, split_size=16, max_seq_len=4096)
    assert torch.equal(short, beside_long[:3]) and torch.equal(beside_long, static)
    check(beside_long, case)


@pytest.mark.parametrize("per_split,partition_size", [(False, 16), (True, 16), (False, 64)],
                         ids=["program-per-partition", "program-per-split", "one-partition-no-merge"])
def test_empty_sequence_gives_zeros(per_split, partition_size):
    """seq_len 0 (a CUDA-graph padding row): no split runs, and zeros are written (by the
    merge, or with one partition by its program), never what the output buffer held before
    (NaN here: a NaN padding row crashed the CPU's draw of the graph's padding rows in CI); the
    real row beside it is unaffected."""
    case = make_paged_case([1, 1], [30, 5], 4, 1, 16, 16, torch.float32, seed=5)
    ref = attention_ref(case, 0.25)
    case.meta.seq_lens[1] = 0
    out = torch.full_like(case.query, float("nan"))
    run_decode(case, partition_size=partition_size, split_size=16, max_seq_len=64, program_per_split=per_split,
               out=out)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    torch.testing.assert_close(out[0], ref[0], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("head_major", [False, True], ids=["seq_major", "head_major"])
def test_a_program_per_split_gives_the_same_bits(dtype, head_major):
    """Either grid may serve any batch (a program per split is meant for small ones), so the
    choice must not change a single bit: lengths on and around split (8, half a cache block)
    and partition (64) boundaries, GQA 5:1 with a padded head_dim, and a grid sized for a far
    longer context (a CUDA graph's)."""
    lens = [1, 16, 17, 63, 64, 65, 100, 129, 200]
    case = make_paged_case([1] * len(lens), [n - 1 for n in lens], 10, 2, 24, 16, dtype, seed=9)
    kw = dict(partition_size=64, split_size=8, head_major=head_major)
    by_partition = run_decode(case, program_per_split=False, **kw)
    by_split = run_decode(case, program_per_split=True, **kw)
    assert torch.equal(by_partition, by_split)
    assert torch.equal(by_split, run_decode(case, program_per_split=True, max_seq_len=1024, **kw))
    check(by_split, case)


def test_split_size_divides_the_partition():
    case = make_paged_case([1], [20], 4, 1, 16, 16, torch.float32, seed=10)
    with pytest.raises(AssertionError, match="whole number of splits"):
        run_decode(case, partition_size=64, split_size=24)
    with pytest.raises(AssertionError, match="power of two"):
        run_decode(case, partition_size=96, split_size=48)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dots", ["fp32", "qk16", "16"])
@pytest.mark.parametrize("head_major", [False, True], ids=["seq_major", "head_major"])
def test_tuning_knobs(dtype, dots, head_major):
    """The sweep's knobs (benchmarks/decode_attention_sweep.py) keep the output: 16-bit dots, the KV-head-major
    grid, other warps/stages; block boundaries, splits and NaN-filled unused slots as above."""
    lens = [1, 16, 17, 70]
    case = make_paged_case([1] * len(lens), [n - 1 for n in lens], 10, 2, 24, 16, dtype, seed=7)
    kw = dict(partition_size=32, split_size=16, dots=dots, head_major=head_major, num_warps=8,
              num_stages=2)
    check(run_decode(case, **kw), case)
    check(run_decode(case, max_seq_len=4096, **kw), case)  # static grid, as under a CUDA graph
    check(run_decode(case, program_per_split=True, **kw), case)


def test_head_major_grid_is_bitwise_the_same():
    case = make_paged_case([1, 1, 1], [3, 40, 100], 8, 2, 16, 16, torch.float32, seed=8)
    a = run_decode(case, partition_size=32, split_size=16)
    b = run_decode(case, partition_size=32, split_size=16, head_major=True)
    assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("per_split,head_major", [(True, False), (True, True), (False, False)],
                         ids=["program-per-split", "program-per-split-head-major", "program-per-partition"])
def test_the_last_program_merges_as_the_merge_kernel_does(dtype, per_split, head_major):
    """merge_by_last_program: each (sequence, KV head)'s last unit to arrive folds the states
    instead of a merge kernel: the same bits, a padding row's zeros (NaN before, in the output
    buffer), and every count back at zero for the next launch (a CUDA graph's replay)."""
    from specserve_kernels.arrival_counts import _COUNTS
    lens = [1, 16, 17, 63, 64, 65, 100, 129, 200]
    case = make_paged_case([1] * len(lens), [n - 1 for n in lens], 10, 2, 24, 16, dtype, seed=11)
    case.meta.seq_lens[3] = 0
    kw = dict(partition_size=64, split_size=8, head_major=head_major, program_per_split=per_split, max_seq_len=256)
    by_kernel = run_decode(case, **kw)
    out = torch.full_like(case.query, float("nan"))
    by_last = run_decode(case, merge_by_last_program=True, out=out, **kw)
    assert torch.equal(by_last, by_kernel) and torch.equal(by_last[3], torch.zeros_like(by_last[3]))
    assert not _COUNTS[by_last.device].any()
    assert torch.equal(run_decode(case, merge_by_last_program=True, **kw), by_kernel)
