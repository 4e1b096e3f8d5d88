"""Regression guard: the offline workload at other commits against the working tree,
alternated in rounds, printed as ratios. (A short serving run per side is still to come:
for now run benchmarks/serving.py against each side by hand.)

Each REF is checked out (detached) into a temporary git worktree; a round runs every side
once, in a fresh process, rotating the order each round so neither side always goes first.
Every side uses the SAME checkpoint (this checkout's, by default), so only code differs.
Run it before a change on the engine's hot path lands, and put its table in the note.

    python benchmarks/compare_refs.py HEAD~1 --rounds 3
    python benchmarks/compare_refs.py d974ebe HEAD~1 --rounds 2 --threads 1 --measure cpu   # bisecting on a busy machine
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "benchmarks" / "offline_runner.py"


@contextlib.contextmanager
def checked_out(refs: list[str]):
    """{label: source dir}: the working tree itself as "HEAD (work tree)", and one temporary
    worktree per ref."""
    tmp = Path(tempfile.mkdtemp(prefix="specserve-refs-"))
    sides = {"work tree": ROOT}
    try:
        for ref in refs:
            sha = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", ref], text=True).strip()
            path = tmp / sha
            subprocess.check_call(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(path), sha])
            sides[f"{ref} ({sha})"] = path
        yield sides
    finally:
        for path in sides.values():
            if path != ROOT:
                subprocess.call(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)])
        shutil.rmtree(tmp, ignore_errors=True)


def side_env(source: Path, threads: int | None = None) -> dict:
    """`app`, `deployments` and `kernels` import from `source`, ahead of the editable install."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(source)] + [p for p in [env.get("PYTHONPATH")] if p])
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_offline(source: Path, args) -> float:
    """Output tokens per second (wall, or CPU with --measure cpu) of the engine at `source`."""
    cmd = [sys.executable, str(RUNNER), "--system", "specserve", "--model", args.model,
           "--num-requests", str(args.num_requests)]
    out = subprocess.run(cmd, cwd=source, env=side_env(source, args.threads), check=True,
                         capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["output_tokens"] / result["cpu_seconds" if args.measure == "cpu" else "seconds"]


def print_table(title: str, unit: str, results: dict[str, list[float]]) -> None:
    base = statistics.median(results["work tree"])
    print(f"\n{title}")
    print(f"{'side':<28} {'median ' + unit:>16} {'rounds':>30} {'work tree vs it':>16}")
    for label, values in results.items():
        med = statistics.median(values)
        ratio = base / med
        rounds = ", ".join(f"{v:.0f}" for v in values)
        print(f"{label:<28} {med:16.1f} {rounds:>30} {ratio:15.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("refs", nargs="+", help="commits to compare the working tree against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=str(ROOT / "checkpoints" / "tiny-target"))
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--threads", type=int, help="torch threads per run (OMP_NUM_THREADS)")
    parser.add_argument("--measure", choices=["wall", "cpu"], default="wall",
                        help="cpu: tokens per process-CPU second; with --threads 1 it hardly moves "
                             "when something else loads the machine (for bisecting)")
    args = parser.parse_args()
    args.model = os.path.abspath(args.model)

    with checked_out(args.refs) as sides:
        offline = {label: [] for label in sides}
        order = list(sides)
        for round_index in range(args.rounds):
            shift = round_index % len(order)
            for label in order[shift:] + order[:shift]:
                offline[label].append(run_offline(sides[label], args))
                print(f"round {round_index + 1}: {label}: {offline[label][-1]:.1f} tok/{args.measure} s", flush=True)
    print_table(f"offline: {args.num_requests} requests, output tokens per {args.measure} second "
                f"(higher is better)", "tok/s", offline)


if __name__ == "__main__":
    main()
