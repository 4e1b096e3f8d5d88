#!/usr/bin/env python
"""Milliseconds per decode step of the default model on the CPU, one torch thread, at a few
batch sizes, and how much of it is the model's forward: each side in a fresh process, sides
alternated in rounds. The sides differ by environment only, by default with and without
transparent huge pages for glibc's malloc (what the engine process gets, app/engine/engine_process.py).

    python benchmarks/cpu_decode_step.py --batch-sizes 8 32 --rounds 3

Greedy rows (`--temperature 0`), 128-token random prompts, 100 timed steps once every row decodes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDES = {"4 KiB pages": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},
         "huge pages": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}}


def measure(batch: int, temperature: float, steps: int) -> dict:
    """In this process: (step ms, forward ms) over `steps` decode steps at `batch` rows."""
    import random

    import torch

    sys.path.insert(0, str(ROOT))
    from app.config import EngineConfig
    from app.engine.engine import LLMEngine
    from app.sampling_params import SamplingParams

    torch.set_num_threads(1)
    engine = LLMEngine(EngineConfig(model=str(ROOT / "checkpoints" / "tiny-target")))
    model = engine.runner.model
    forward_s = [0.0]
    forward = model.forward

    def timed_forward(*args, **kwargs):
        started = time.perf_counter()
        out = forward(*args, **kwargs)
        forward_s[0] += time.perf_counter() - started
        return out

    model.forward = timed_forward
    rng = random.Random(0)
    for i in range(batch):
        engine.add_request(f"r{i}", [rng.randrange(5, 4000) for _ in range(128)],
                           SamplingParams(max_tokens=steps + 50, ignore_eos=True, temperature=temperature))
    while not all(r.is_decoding for r in engine.scheduler.running):
        engine.step()
    for _ in range(10):
        engine.step()
    forward_s[0] = 0.0
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return {"step_ms": (time.perf_counter() - started) / steps * 1e3, "forward_ms": forward_s[0] / steps * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child, args.temperature, args.steps)))
        return
    results = {(side, b): [] for side in SIDES for b in args.batch_sizes}
    for r in range(args.rounds):
        for b in args.batch_sizes:
            for side in (list(SIDES) if r % 2 == 0 else list(reversed(SIDES))):
                env = {**os.environ, **SIDES[side]}
                out = subprocess.run([sys.executable, __file__, "--child", str(b), "--steps", str(args.steps),
                                      "--temperature", str(args.temperature)],
                                     env=env, check=True, capture_output=True, text=True).stdout
                results[(side, b)].append(json.loads(out.strip().splitlines()[-1]))
                print(f"round {r + 1}, batch {b}, {side}: {results[(side, b)][-1]}", flush=True)
    first, second = list(SIDES)
    print(f"\nms per decode step (median of {args.rounds} rounds); ratio = {first} / {second}")
    for b in args.batch_sizes:
        a = statistics.median(x["step_ms"] for x in results[(first, b)])
        h = statistics.median(x["step_ms"] for x in results[(second, b)])
        fa = statistics.median(x["forward_ms"] for x in results[(first, b)])
        fh = statistics.median(x["forward_ms"] for x in results[(second, b)])
        print(f"batch {b:>4}: {first} {a:6.2f} (forward {fa:5.2f}), {second} {h:6.2f} (forward {fh:5.2f}): "
              f"{a / h:.3f}x")


if __name__ == "__main__":
    main()
