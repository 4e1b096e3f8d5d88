"""The decode kernels' softmax states: each split or partition of a sequence's keys sums to an
unnormalised state (its running max in log2 units, its mass, its output rows), and states are
folded left to right with explicit FMAs, so that a sequence's sum is the same whichever grid
computed it and whichever kernel folds it (`specserve_kernels/decode_attention.py`). Here: the fold,
where a unit's state is stored, and the merge of a sequence's stored states."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def fold(m, l, acc, m_add, l_add, acc_add):
    """Two softmax states (running max [G] in log2 units, mass [G], unnormalised output
    [G, D]) into one. `m` is -inf for the empty state, whose weight is then 0."""
    m_new = tl.maximum(m, m_add)
    keep = tl.exp2(m - m_new)
    add = tl.exp2(m_add - m_new)
    return m_new, tl.fma(l, keep, l_add * add), tl.fma(acc, keep[:, None], acc_add * add[:, None])


@triton.jit
def empty_state(BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr):
    return (tl.full([BLOCK_G], float("-inf"), tl.float32), tl.zeros([BLOCK_G], tl.float32),
            tl.zeros([BLOCK_G, BLOCK_D], tl.float32))


@triton.jit
def normalised(l, acc):
    """The output of a folded state; zeros for the empty one (a sequence of length 0)."""
    return acc / tl.where(l == 0.0, 1.0, l)[:, None]


@triton.jit
def state_ptrs(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, unit, offs_d,
                stride_pb, stride_ph, stride_ps, stride_lb, stride_lh):
    """Where a unit's (split's or partition's) state lives: output rows, max and mass."""
    acc_ptrs = (part_acc_ptr + b * stride_pb + heads[:, None] * stride_ph + unit * stride_ps
                + offs_d[None, :])
    offset = b * stride_lb + heads * stride_lh + unit
    return acc_ptrs, part_m_ptr + offset, part_l_ptr + offset


@triton.jit
def store_state(m, l, acc, part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, unit, offs_d, g_mask, d_mask,
                stride_pb, stride_ph, stride_ps, stride_lb, stride_lh):
    acc_ptrs, m_ptrs, l_ptrs = state_ptrs(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, unit, offs_d,
                                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh)
    tl.store(acc_ptrs, acc, mask=g_mask[:, None] & d_mask[None, :])
    tl.store(m_ptrs, m, mask=g_mask)
    tl.store(l_ptrs, l, mask=g_mask)


@triton.jit
def load_state(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, unit, offs_d, g_mask, d_mask,
                stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, FROM_L2: tl.constexpr):
    """FROM_L2: states other SMs wrote during this kernel (the last program's merge): read past
    this SM's L1, which does not see them."""
    acc_ptrs, m_ptrs, l_ptrs = state_ptrs(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, unit, offs_d,
                                          stride_pb, stride_ph, stride_ps, stride_lb, stride_lh)
    # padded rows of the group: a finite max, so folding them makes no NaN
    if FROM_L2:
        acc = tl.load(acc_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0, cache_modifier=".cg")
        m = tl.load(m_ptrs, mask=g_mask, other=0.0, cache_modifier=".cg")
        l = tl.load(l_ptrs, mask=g_mask, other=0.0, cache_modifier=".cg")
    else:
        acc = tl.load(acc_ptrs, mask=g_mask[:, None] & d_mask[None, :], other=0.0)
        m = tl.load(m_ptrs, mask=g_mask, other=0.0)
        l = tl.load(l_ptrs, mask=g_mask, other=0.0)
    return m, l, acc


@triton.jit
def store_output(l, acc, out_ptr, b, heads, offs_d, g_mask, d_mask, stride_ob, stride_oh):
    """A sequence's folded state, normalised, as its output rows."""
    out_ptrs = out_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptrs, normalised(l, acc).to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])


@triton.jit
def merged(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, seq_len, offs_d, g_mask, d_mask,
           stride_pb, stride_ph, stride_ps, stride_lb, stride_lh,
           PARTITION: tl.constexpr, SPLIT: tl.constexpr, PER_SPLIT: tl.constexpr,
           BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, FROM_L2: tl.constexpr):
    """A sequence's states folded, as the split kernel would fold them: splits into partitions
    (a program per split), partitions into the sequence's (mass, unnormalised output)."""
    partitions = tl.cdiv(seq_len, PARTITION)
    splits_per_partition = PARTITION // SPLIT
    splits = tl.cdiv(seq_len, SPLIT)
    m, l, acc = empty_state(BLOCK_G, BLOCK_D)
    for p in range(0, partitions):
        if PER_SPLIT:
            m_p, l_p, acc_p = empty_state(BLOCK_G, BLOCK_D)
            first = p * splits_per_partition
            # FROM_L2: not pipelined, since the pipeliner's asynchronous copies of the 4-byte max
            # and mass would go through L1 (cp.async.ca), past the ".cg" the loads ask for
            for s in tl.range(first, tl.minimum(first + splits_per_partition, splits),
                              num_stages=1 if FROM_L2 else 3):
                m_s, l_s, acc_s = load_state(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, s, offs_d, g_mask,
                                             d_mask, stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, FROM_L2)
                m_p, l_p, acc_p = fold(m_p, l_p, acc_p, m_s, l_s, acc_s)
        else:
            m_p, l_p, acc_p = load_state(part_acc_ptr, part_m_ptr, part_l_ptr, b, heads, p, offs_d, g_mask, d_mask,
                                         stride_pb, stride_ph, stride_ps, stride_lb, stride_lh, FROM_L2)
        m, l, acc = fold(m, l, acc, m_p, l_p, acc_p)
    return l, acc
