#!/usr/bin/env python
"""Where the machine's cores go while the app serves one load level: CPU seconds and seconds
spent waiting for a core, per process and per thread (Linux schedstat, benchmarks/schedstat.py),
between two snapshots around one run of serving.py's client (after a warm-up run).

    python benchmarks/served_cpu.py --server specserve:adaptive_speculation=false --concurrency 1 --dataset grounded

On 2 cores a speculating step waits for the draft replica, and both share the cores with the
streaming of the previous step's tokens (target replica, ingress, proxy, client); this shows
how much, which the per-stage timers alone cannot.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import schedstat, serving  # noqa: E402
from benchmarks.servers import ServerSpec, running  # noqa: E402

PATTERNS = ["ray::", "engine_process", "raylet", "gcs_server", "python"]


def by_process(before: dict, after: dict) -> dict[str, list[float]]:
    """command line -> [CPU s, waiting s], summed over its threads."""
    rows: dict[str, list[float]] = {}
    for cpu, wait, _key, cmd, _name in schedstat.deltas(before, after):
        row = rows.setdefault(cmd, [0.0, 0.0])
        row[0] += cpu
        row[1] += wait
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", default="specserve", help="as serving_compare.py's --servers")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--dataset", choices=["random", "grounded"], default="random")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    model = str(ROOT / "checkpoints" / "tiny-target")
    with running(ServerSpec.parse(args.server), args.port, model, "tiny-target", out / "served_cpu_server.log") as url:
        client = ["--base-url", url, "--model", model, "--served-model-name", "tiny-target", "--output-len",
                  str(args.output_len), "--concurrency", str(args.concurrency), "--dataset", args.dataset,
                  "--disable-tqdm"]
        serving.main(client + ["--num-prompts", "8"])  # warm-up: kernels, caches, the draft channel
        before = schedstat.snapshot(PATTERNS)
        started = time.perf_counter()
        serving.main(client + ["--num-prompts", str(args.num_prompts)])
        wall = time.perf_counter() - started
        after = schedstat.snapshot(PATTERNS)
    print(f"\n{args.server}, concurrency {args.concurrency}, {args.dataset}: {wall:.2f} s of wall time "
          f"({2 * wall:.2f} core-seconds on 2 cores)")
    print("per process:")
    for cmd, (cpu, wait) in sorted(by_process(before, after).items(), key=lambda item: -item[1][0])[:args.top]:
        print(f"  cpu {cpu:6.2f} s  waiting for a core {wait:6.2f} s  {cmd}")
    print("per thread:")
    print("\n".join("  " + line for line in schedstat.diff(before, after, args.top)))


if __name__ == "__main__":
    main()
