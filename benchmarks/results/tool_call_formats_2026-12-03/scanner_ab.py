"""The JSON tool-call scanner's cost (parse_calls of one long Hermes call, 20 KB of text) at REF
against the work tree, each in its own process, alternated in rounds (who goes first swaps).

    python benchmarks/results/tool_call_formats_2026-12-03/scanner_ab.py 99539d5
"""

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TIMED = """
import sys, time
sys.path.insert(0, sys.argv[1])
from deployments.tool_call_stream import parse_calls
from deployments.tool_calls import HERMES
args = {"items": [{"name": f"item {i}", "tags": ["a", "b"], "n": i} for i in range(300)], "note": "x" * 2000}
text = HERMES.render([("f", args)])
best = float("inf")
for _ in range(80):
    start = time.perf_counter()
    parse_calls(text, HERMES)
    best = min(best, time.perf_counter() - start)
print(best * 1e3)
"""


def ms(tree: Path) -> float:
    return float(subprocess.run([sys.executable, "-c", TIMED, str(tree)], check=True, capture_output=True,
                                text=True).stdout)


def main(ref: str) -> None:
    old = Path(tempfile.mkdtemp()) / "ref"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(old), ref], check=True)
    try:
        ratios = []
        for r in range(6):
            a, b = (ms(old), ms(ROOT)) if r % 2 == 0 else reversed((ms(ROOT), ms(old)))
            ratios.append(a / b)
            print(f"round {r}: {ref} {a:.3f} ms, work tree {b:.3f} ms, {ref}/tree {a / b:.3f}")
        print(f"median {ref}/tree {statistics.median(ratios):.3f} (above 1: the tree is faster)")
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(old)], check=True)


if __name__ == "__main__":
    main(sys.argv[1])
