"""parse_calls of one ~20 KB pythonic call, best of 60, in a fresh process per side, sides alternated:
the character readers' shared base (a711d68) against the tree before it.

    python benchmarks/results/gemma4_2026-12-07/pythonic_reader_ab.py BASE_TREE [ROUNDS]
"""
import subprocess
import sys
from pathlib import Path

ONE_SIDE = r'''
import sys, time
sys.path.insert(0, sys.argv[1])
from deployments.tool_call_stream import parse_calls
from deployments.tool_calls import PYTHONIC
text = '[set(note="' + "a, b) c " * 2500 + '", on=True, level=None, tags=[1, 2.5, {"k": False}])]'
best = min((lambda t0: (parse_calls(text, PYTHONIC), time.perf_counter() - t0)[1])(time.perf_counter())
           for _ in range(60))
print(best * 1e3)
'''


def side(tree: str) -> float:
    return float(subprocess.run([sys.executable, "-c", ONE_SIDE, tree], capture_output=True, text=True,
                                check=True).stdout)


if __name__ == "__main__":
    base, rounds = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6
    tree = str(Path(__file__).resolve().parents[3])
    ratios = []
    for r in range(rounds):
        first, second = (base, tree) if r % 2 == 0 else (tree, base)
        times = {first: side(first), second: side(second)}
        ratios.append(times[tree] / times[base])
        print(f"round {r + 1}: tree {times[tree]:.2f} ms, base {times[base]:.2f} ms, tree/base {ratios[-1]:.3f}")
    print(f"median tree/base {sorted(ratios)[len(ratios) // 2]:.3f}")
