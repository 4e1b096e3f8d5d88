"""Regression guard: the offline workload, and with `--serving` a short served run, at other
commits against the working tree, alternated in rounds, printed as ratios.

Each REF is checked out (detached) into a temporary git worktree, and so is the working tree
(HEAD with its uncommitted changes and untracked files); a round runs every side
once, in a fresh process, rotating the order each round so neither side always goes first.
Every side uses the SAME checkpoint (this checkout's, by default), so only code differs.
Run it before a change on the engine's hot path lands, and put its table in the note. The
last column, `paired`, is the median of the per-round ratios: it reads truer than the
medians of the sides when the machine drifts during the run.

    python benchmarks/compare_refs.py HEAD~1 --rounds 3
    python benchmarks/compare_refs.py HEAD~1 --rounds 3 --temperature 0.8 --top-p 0.95   # sampled
    python benchmarks/compare_refs.py HEAD~1 --rounds 2 --serving      # + `serve run serve_config.yaml` of each side
    python benchmarks/compare_refs.py HEAD~1 --serving --no-offline --dataset grounded --concurrency 1   # where drafts are accepted
    python benchmarks/compare_refs.py HEAD~1 --serving --no-offline --endpoint /v1/chat/completions   # the chat path
    python benchmarks/compare_refs.py d974ebe HEAD~1 --rounds 2 --threads 1 --measure cpu   # bisecting on a busy machine
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
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
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.servers import ServerSpec, running  # noqa: E402


@contextlib.contextmanager
def checked_out(refs: list[str]):
    """{label: source dir}: one temporary worktree per ref, and one of HEAD with the working tree's
    changes and untracked files put in ("work tree"). Every side runs from a worktree of the same
    form: served, the checkout itself ran 0.78-0.94x as fast as a worktree of its own commit
    (RESULTS.md, 2026-12-07), which reads as a regression that is not there."""
    tmp = Path(tempfile.mkdtemp(prefix="specserve-refs-"))
    sides = {}
    try:
        sides["work tree"] = add_worktree(tmp / "work-tree", "HEAD")
        copy_working_changes(sides["work tree"])
        for ref in refs:
            sha = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "--short", ref], text=True).strip()
            sides[f"{ref} ({sha})"] = add_worktree(tmp / sha, sha)
            refuse_hidden_kernel_hub(sides[f"{ref} ({sha})"], f"{ref} ({sha})")
        yield sides
    finally:
        for path in sides.values():
            subprocess.call(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)])
        shutil.rmtree(tmp, ignore_errors=True)


def add_worktree(path: Path, ref: str, repo: Path = ROOT) -> Path:
    subprocess.check_call(["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(path), ref])
    return path


def copy_working_changes(worktree: Path, repo: Path = ROOT) -> None:
    """The checkout's uncommitted changes to tracked files, and its untracked files that git does not
    ignore, into a worktree of HEAD."""
    diff = subprocess.check_output(["git", "-C", str(repo), "diff", "HEAD", "--binary"])
    if diff:
        subprocess.run(["git", "-C", str(worktree), "apply", "--whitespace=nowarn"], input=diff, check=True)
    untracked = subprocess.check_output(["git", "-C", str(repo), "ls-files", "--others", "--exclude-standard",
                                         "-z"], text=True)
    for name in filter(None, untracked.split("\0")):
        (worktree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, worktree / name)


def refuse_hidden_kernel_hub(source: Path, label: str) -> None:
    """Trees before the rename to specserve_kernels hold a package `kernels`, which, first on the path, hides
    Hugging Face's kernel hub package from transformers (5.25 on), and every side of theirs fails to load."""
    if (source / "kernels" / "__init__.py").is_file() and "kernels" in importlib.metadata.packages_distributions():
        raise SystemExit(f"{label} has a package named `kernels`, which hides the installed `kernels` (Hugging "
                         "Face's, which transformers imports); measure it in a venv without that distribution "
                         "(transformers < 5.25, or `pip uninstall kernels`)")


def side_env(source: Path, threads: int | None = None) -> dict:
    """`app`, `deployments` and `specserve_kernels` import from `source`, ahead of the editable install."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(source)] + [p for p in [env.get("PYTHONPATH")] if p])
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_offline(source: Path, args) -> float:
    """Output tokens per second (wall, or CPU with --measure cpu) of the engine at `source`."""
    cmd = [sys.executable, str(RUNNER), "--system", "specserve", "--model", args.model,
           "--num-requests", str(args.num_requests), "--temperature", str(args.temperature),
           "--top-p", str(args.top_p)]
    out = subprocess.run(cmd, cwd=source, env=side_env(source, args.threads), check=True,
                         capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["output_tokens"] / result["cpu_seconds" if args.measure == "cpu" else "seconds"]


def run_serving(source: Path, args, log: Path) -> list[float]:
    """Mean e2e latency (ms) at each `--concurrency` level of `serve run serve_config.yaml` from
    `source` (its own config and code, this checkout's checkpoint), with serving.py's client."""
    spec = ServerSpec("specserve", str(source), source=source)
    with running(spec, args.port, args.model, "tiny-target", log) as url:
        report = serving.main(["--base-url", url, "--model", args.model, "--served-model-name", "tiny-target",
                               "--num-prompts", "24", "--input-len", "128", "--output-len", "64",
                               "--dataset", args.dataset, "--concurrency", *map(str, args.concurrency),
                               "--temperature", str(args.temperature), "--top-p", str(args.top_p),
                               "--endpoint", args.endpoint, "--disable-tqdm"])
    return [level["http"]["mean_e2el_ms"] for level in report["levels"]]


def paired_ratio(work_tree: list[float], side: list[float], higher_is_better: bool = True) -> float:
    """The median over rounds of the work tree's figure against the side's in the same round
    (above 1: the work tree better). A round runs every side back to back, so a machine that
    speeds up or slows down during the run moves both figures of a round together, where it
    skews the medians of the sides by the order they ran in."""
    return statistics.median(w / s if higher_is_better else s / w for w, s in zip(work_tree, side))


def print_table(title: str, unit: str, results: dict[str, list[float]], higher_is_better: bool = True) -> None:
    work_tree = results["work tree"]
    base = statistics.median(work_tree)
    print(f"\n{title}")
    print(f"{'side':<28} {'median ' + unit:>16} {'rounds':>30} {'work tree vs it':>16} {'paired':>8}")
    for label, values in results.items():
        med = statistics.median(values)
        ratio = base / med if higher_is_better else med / base
        rounds = ", ".join(f"{v:.0f}" for v in values)
        paired = paired_ratio(work_tree, values, higher_is_better)
        print(f"{label:<28} {med:16.1f} {rounds:>30} {ratio:15.3f}x {paired:7.3f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("refs", nargs="+", help="commits to compare the working tree against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default=str(ROOT / "checkpoints" / "tiny-target"))
    parser.add_argument("--num-requests", type=int, default=200)
    parser.add_argument("--temperature", type=float, default=0.0, help="above 0: sampled decoding")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--threads", type=int, help="torch threads per run (OMP_NUM_THREADS)")
    parser.add_argument("--measure", choices=["wall", "cpu"], default="wall",
                        help="cpu: tokens per process-CPU second; with --threads 1 it hardly moves "
                             "when something else loads the machine (for bisecting)")
    parser.add_argument("--serving", action="store_true",
                        help="also a short served run per side and round")
    parser.add_argument("--no-offline", dest="offline", action="store_false")
    parser.add_argument("--dataset", choices=["random", "grounded"], default="random",
                        help="the served run's prompts (grounded: drafts are mostly accepted)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32],
                        help="the served run's load levels")
    parser.add_argument("--warmup", type=int, default=1,
                        help="served: untimed runs of every side before the rounds (a side's first run reads "
                             "its tree's files and compiles its code cold; in 3 of 4 served A/Bs on 2026-12-07 "
                             "round 1's first side ran slowest at concurrency 8)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--endpoint", default="/v1/completions", help="served: or /v1/chat/completions")
    args = parser.parse_args()
    args.model = os.path.abspath(args.model)
    log_dir = Path(tempfile.mkdtemp(prefix="specserve-compare-logs-"))

    with checked_out(args.refs) as sides:
        offline = {label: [] for label in sides}
        served = {label: [] for label in sides}
        order = list(sides)
        for warmup in range(args.warmup if args.serving else 0):
            for label in order:
                run_serving(sides[label], args, log_dir / f"warmup_{label.split()[0]}_{warmup + 1}.log")
                print(f"warm-up {warmup + 1}: {label} (untimed)", flush=True)
        for round_index in range(args.rounds):
            shift = round_index % len(order)
            for label in order[shift:] + order[:shift]:
                if args.offline:
                    offline[label].append(run_offline(sides[label], args))
                    print(f"round {round_index + 1}: {label}: {offline[label][-1]:.1f} tok/{args.measure} s",
                          flush=True)
                if args.serving:
                    log = log_dir / f"serve_{label.split()[0]}_{round_index + 1}.log"
                    served[label].append(run_serving(sides[label], args, log))
                    print(f"round {round_index + 1}: {label}: served mean e2e ms at c={args.concurrency}: "
                          + ", ".join(f"{x:.0f}" for x in served[label][-1]), flush=True)
    if args.offline:
        print_table(f"offline: {args.num_requests} requests, output tokens per {args.measure} second "
                    f"(higher is better)", "tok/s", offline)
    for i, conc in enumerate(args.concurrency if args.serving else []):
        print_table(f"served, concurrency {conc}: mean e2e latency, ms (lower is better; ratio = side / "
                    "work tree, above 1: the work tree is faster)", "ms",
                    {label: [run[i] for run in runs] for label, runs in served.items()}, higher_is_better=False)
    if args.serving:
        print(f"\nserver logs in {log_dir}")


if __name__ == "__main__":
    main()
