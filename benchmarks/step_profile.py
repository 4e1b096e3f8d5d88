#!/usr/bin/env python
"""Where an offline step's time goes: the offline benchmark's workload (or its first
--num-requests) through the engine under torch.profiler, ops grouped by their self CPU time,
and the rest of the wall time (Python outside any op: scheduling, prepare, selection's host
side, update) as one line.

    python benchmarks/step_profile.py --num-requests 200

The profiler adds its own cost per op, so the shares matter, not the total.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.offline_runner import add_workload_args, make_workload, vocab_size  # noqa: E402

GROUPS = {  # op name substring -> what it is in the model
    "paged_attention": "attention: paged decode/verify kernel",
    "scaled_dot_product": "attention: prompt chunks (SDPA)",
    "flash_attention": "attention: prompt chunks (SDPA)",
    "addmm": "linear layers", "aten::mm": "linear layers", "aten::linear": "linear layers",
    "aten::matmul": "linear layers", "_linear_pointwise": "linear layers",
    "add_rms_norm": "add + RMSNorm", "rms_norm": "add + RMSNorm",
    "rotary": "rotary + KV write", "silu": "SiLU x up",
    "embedding": "embedding", "argmax": "selection (device ops)", "softmax": "selection (device ops)",
}


def group_of(op: str) -> str:
    return next((name for key, name in GROUPS.items() if key in op), "other ops")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(parser)
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from app.config import EngineConfig
    from app.engine.engine import LLMEngine
    from app.sampling_params import SamplingParams

    workload = make_workload(args.num_requests, vocab_size(args.model), args.seed)
    engine = LLMEngine(EngineConfig(model=args.model, num_kv_blocks=4096, max_num_seqs=args.max_num_seqs,
                                    max_num_batched_tokens=args.max_num_batched_tokens))
    engine.generate([workload[0][0][:32]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    params = [SamplingParams(max_tokens=out, temperature=0, ignore_eos=True) for _, out in workload]
    steps_before = engine.num_steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        engine.generate([p for p, _ in workload], params)
        wall = time.perf_counter() - start
    by_group: dict[str, float] = defaultdict(float)
    others: dict[str, float] = {}
    for event in prof.key_averages():
        by_group[group_of(event.key)] += event.self_cpu_time_total / 1e6
        if group_of(event.key) == "other ops":
            others[event.key] = event.self_cpu_time_total / 1e6
    in_ops = sum(by_group.values())
    print(f"{args.num_requests} requests, {engine.num_steps - steps_before} steps, {wall:.1f} s wall "
          f"(profiled), torch threads {torch.get_num_threads()}")
    print(f"{'where':<40} {'seconds':>8} {'share':>6}")
    rows = sorted(by_group.items(), key=lambda kv: -kv[1])
    rows.append(("host Python outside ops (wall - ops)", max(wall - in_ops, 0.0)))
    for name, seconds in rows:
        print(f"{name:<40} {seconds:8.2f} {seconds / wall:6.1%}")
    print("largest of the other ops:")
    for name, seconds in sorted(others.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {name:<38} {seconds:8.2f} {seconds / wall:6.1%}")


if __name__ == "__main__":
    main()
