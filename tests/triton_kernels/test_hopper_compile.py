"""The CUDA path's Triton kernels compile for an H100 (sm_90) without spilling, checked on
machines without a GPU (hopper_compile.py: what the interpreter cannot see)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HOPPER_COMPILE = Path(__file__).with_name("hopper_compile.py")
EXPECTED_KERNELS = {"_decode_split_kernel", "_decode_merge_kernel", "_prefill_kernel", "_rms_norm_kernel",
                    "_rotary_kv_write_kernel", "_silu_and_mul_kernel", "_filtered_sample_kernel",
                    "_chunk_max_kernel", "_fold_chunks_kernel", "_skinny_linear_kernel",
                    "_gate_up_silu_kernel"}


def run_harness(*flags: str):
    """hopper_compile.py's JSON answer, from a process without TRITON_INTERPRET (the interpreter
    replaces `triton.jit`)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(HOPPER_COMPILE), *flags], capture_output=True, text=True,
                          env=env, timeout=600)
    if done.returncode == 3:  # hopper_compile.HARNESS_UNSUPPORTED: this Triton's internals changed
        pytest.skip("hopper_compile.py cannot run on this Triton (it relies on its JIT's launch method "
                    f"and ASTSource): {done.stderr.strip().splitlines()[-1]}")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("dependent_launch", [False, True], ids=["plain-launch", "dependent-launch"])
def test_kernels_compile_for_sm90_without_spills(dependent_launch):
    compiled = run_harness("--json", *(["--dependent-launch"] if dependent_launch else []))
    assert {c["kernel"] for c in compiled} == EXPECTED_KERNELS
    spilled = [c for c in compiled if c["local_bytes"]]
    assert not spilled, f"local memory (register spills) on sm_90: {spilled}"
    # the loops that walk memory are software-pipelined (their loads asynchronous copies): every
    # decode launch's K/V tiles, the sampler's passes over the vocabulary, the merge of splits,
    # the skinny products' weights
    pipelined = [c for c in compiled if c["kernel"] in ("_decode_split_kernel", "_filtered_sample_kernel",
                                                        "_skinny_linear_kernel", "_gate_up_silu_kernel")
                 or (c["kernel"] == "_decode_merge_kernel" and c["label"] == "decode, a program per split")]
    assert len(pipelined) == 13 and all(c["async_copies"] for c in pipelined), pipelined
    # the last program to arrive reads parts other SMs wrote: from L2, never a stale L1 line
    # (the pipeliner's asynchronous copies of 4-byte values go through L1: cp.async.ca)
    arriving = [c for c in compiled if "merged by the last" in c["label"] or "split-K" in c["label"]]
    assert len(arriving) == 2 and not any(c["l1_loads_after_arrival"] for c in arriving), arriving
    # launched with PDL, a kernel may start before the one ahead of it ends: it must wait for
    # it before touching memory (every kernel of a decode step but the prefill kernel's)
    waiting = {c["kernel"] for c in compiled if c["waits_first"]}
    assert waiting == (EXPECTED_KERNELS - {"_prefill_kernel"} if dependent_launch else set())
    # the norm and rotary launches with a weight to prefetch ask L2 for it (specserve_kernels/l2_prefetch.py),
    # and only they: still waiting before they read or write (the prefetch may come first)
    prefetching = [c for c in compiled if c["l2_prefetches"]]
    assert {(c["label"], c["kernel"]) for c in prefetching} == {
        ("layer ops, prefetching the next weight", "_rms_norm_kernel"),
        ("layer ops, prefetching the next weight", "_rotary_kv_write_kernel")}
    assert all(c["waits_first"] == dependent_launch for c in prefetching)
    # and decode attention's K/V then leave L2 first, in that launch only
    evicting_first = {c["label"] for c in compiled if c["l2_evict_first"]}
    assert evicting_first == {"decode, K/V evict-first (while prefetching weights)"}


def test_steps_of_any_shape_share_the_compiled_kernels():
    """Outside CUDA graphs every step has its own number of tokens, block-table width and number
    of partitions; none of them may be a new Triton compile (a second or more on the first
    request of that shape). The variants left are the kernels' own choices: the split kernel's
    two endings (the output itself, or a state for the merge), RMSNorm with and without the
    residual add, the draw from 16-bit logits (in a graph), fp32 ones, and fp32 ones under a
    top-k cut, and the prefill kernel's query tiles (three at Llama-3-8B's group of 4, each
    warmed at start-up: `ModelRunner.warm_up`). The skinny linear compiles once for 1 to 16 rows,
    the gate_up projection with SiLU x up once a row configuration (1-16 rows, 17-64)."""
    assert run_harness("--eager-variants") == {"_decode_split_kernel": 2, "_decode_merge_kernel": 1, "_prefill_kernel": 3,
                        "_rms_norm_kernel": 2, "_rotary_kv_write_kernel": 1, "_silu_and_mul_kernel": 1,
                        "_filtered_sample_kernel": 3, "_skinny_linear_kernel": 1, "_gate_up_silu_kernel": 2}
