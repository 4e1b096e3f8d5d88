"""A KV pool of more than 2^31 elements per K (or V) tensor: block index x block stride
overflows int32 there, so every kernel must widen before multiplying (sglang #20389,
vllm #50427). The pool is allocated but never filled: untouched pages cost no memory, and
only the few blocks at its top end that the test uses are ever written."""

import pytest
import torch

from specserve_kernels.decode_attention import decode_attention
from specserve_kernels.kv_cache_write import write_kv_cache
from specserve_kernels.prefill_attention import prefill_attention
from specserve_kernels.reference import attention_ref, make_meta, PagedCase

BLOCK_SIZE, HEAD_DIM, KV_HEADS, HEADS = 16, 16, 1, 4
NUM_BLOCKS = 2**31 // (BLOCK_SIZE * KV_HEADS * HEAD_DIM) + 64  # top blocks start past 2^31


@pytest.fixture(scope="module")
def huge_cache():
    k = torch.empty(NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.float16)
    v = torch.empty_like(k)
    assert (NUM_BLOCKS - 10) * k.stride(0) > 2**31
    k[-12:].fill_(float("nan"))  # the region in use, and its neighbours, start as NaN
    v[-12:].fill_(float("nan"))
    return k, v


def test_huge_pool(huge_cache):
    """Write a step's K/V through slots past 2^31, then decode and extend-prefill over them;
    compare with the reference run on a small copy of the blocks used."""
    k_cache, v_cache = huge_cache
    query_lens, context_lens = [3, 1], [20, 13]
    blocks = [[NUM_BLOCKS - 2, NUM_BLOCKS - 9], [NUM_BLOCKS - 5, NUM_BLOCKS - 8]]
    tables = torch.tensor(blocks, dtype=torch.int32)
    gen = torch.Generator().manual_seed(0)
    # fill every position of both sequences through the kernel (slots > 2^31)
    fill = make_meta([q + c for q, c in zip(query_lens, context_lens)], [0, 0], tables, BLOCK_SIZE)
    assert int(fill.slot_mapping.min()) * k_cache.stride(1) > 2**31
    n = fill.slot_mapping.numel()
    key = torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen).half()
    value = torch.randn(n, KV_HEADS, HEAD_DIM, generator=gen).half()
    write_kv_cache(key, value, k_cache, v_cache, fill.slot_mapping)
    flat_k = k_cache.view(-1, KV_HEADS, HEAD_DIM)
    assert torch.equal(flat_k[fill.slot_mapping], key)

    # reference on a small cache holding copies of the blocks used, in the same order
    used = sorted({b for row in blocks for b in row})
    small = torch.stack([torch.stack([k_cache[b] for b in used]), torch.stack([v_cache[b] for b in used])])
    small_tables = torch.tensor([[used.index(b) for b in row] for row in blocks], dtype=torch.int32)
    meta = make_meta(query_lens, context_lens, tables, BLOCK_SIZE)
    query = torch.randn(sum(query_lens), HEADS, HEAD_DIM, generator=gen).half()
    ref = attention_ref(PagedCase(query, small, make_meta(query_lens, context_lens, small_tables,
                                                          BLOCK_SIZE)), 0.25)

    out = prefill_attention(query, k_cache, v_cache, meta.block_tables, meta.query_start_loc,
                            meta.context_lens, 0.25, meta.max_query_len, block_n=16, target_rows=16)
    torch.testing.assert_close(out.float(), ref, atol=2e-3, rtol=2e-3)

    # decode: the last token of each sequence alone
    dec_meta = make_meta([1, 1], [22, 13], tables, BLOCK_SIZE)
    dec_q = query[[2, 3]]
    dec = decode_attention(dec_q, k_cache, v_cache, dec_meta.block_tables, dec_meta.seq_lens,
                           0.25, dec_meta.max_seq_len, partition_size=16, split_size=16)
    torch.testing.assert_close(dec.float(), ref[[2, 3]], atol=2e-3, rtol=2e-3)
