#!/usr/bin/env python
"""The decode A/B's lines (`benchmarks/ab_decode.py`, alternated over rounds by
`scripts/gpu_owed.sh`) as one table: per side and cell, tok/s in every round, the ratio to the
baseline side's run in the same round (their median), and the MBU, against issue 17's goals
(batch 1 at 85% of copy, batch 256 at 25,000 tok/s). So the log that comes back from a GPU
already says which side won where.

    python benchmarks/ab_table.py gpu_out/decode_ab.log --baseline new
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass

LINE = re.compile(r"^(?P<side>\S+?)-(?P<round>\d+) max_model_len \d+ prompt (?P<prompt>\d+) batch +(?P<batch>\d+) "
                  r"(?P<mode>greedy|sampled) *: decode +(?P<tok_s>[\d.]+) tok/s(?: +MBU +(?P<mbu>[\d.]+)%)?")
GOALS = {(1, "greedy"): "MBU >= 85%", (256, "greedy"): ">= 25,000 tok/s"}


@dataclass(frozen=True)
class Run:
    side: str
    round: int
    cell: tuple[int, int, str]  # prompt, batch, mode
    tok_s: float
    mbu: float | None


def parse(lines) -> list[Run]:
    runs = []
    for line in lines:
        m = LINE.match(line.strip())
        if m:
            runs.append(Run(m["side"], int(m["round"]), (int(m["prompt"]), int(m["batch"]), m["mode"]),
                            float(m["tok_s"]), float(m["mbu"]) if m["mbu"] else None))
    return runs


def meets_goal(run: Run) -> bool | None:
    _, batch, mode = run.cell
    if (batch, mode) == (1, "greedy") and run.mbu is not None:
        return run.mbu >= 85.0
    if (batch, mode) == (256, "greedy"):
        return run.tok_s >= 25000
    return None


def table(runs: list[Run], baseline: str) -> list[str]:
    by_side_cell: dict[tuple[str, tuple], dict[int, Run]] = defaultdict(dict)
    for run in runs:
        by_side_cell[run.side, run.cell][run.round] = run
    out = [f"{'side':32} {'prompt':>6} {'batch':>5} {'mode':7} {'tok/s by round':>24} {'vs ' + baseline + ' (by round)':>24} "
           f"{'MBU':>6}  goal"]
    for (side, cell), rounds in sorted(by_side_cell.items(), key=lambda item: (item[0][1], item[0][0] != baseline,
                                                                               item[0][0])):
        base = by_side_cell.get((baseline, cell), {})
        ratios = [run.tok_s / base[r].tok_s for r, run in rounds.items() if r in base]
        ratio = ""
        if ratios and side != baseline:
            ratio = f"{statistics.median(ratios):.3f}x" + (f" ({min(ratios):.3f}-{max(ratios):.3f})" if len(ratios) > 1 else "")
        best = max(rounds.values(), key=lambda run: run.tok_s)
        goal, met = GOALS.get(cell[1:]), meets_goal(best)
        verdict = "" if goal is None else f"{goal}: {({True: 'met', False: 'not met', None: '?'})[met]} (best round)"
        mbu = f"{best.mbu:5.1f}%" if best.mbu is not None else "     -"
        out.append(f"{side:32} {cell[0]:6d} {cell[1]:5d} {cell[2]:7} "
                   f"{', '.join(f'{rounds[r].tok_s:.1f}' for r in sorted(rounds)):>24} {ratio:>24} "
                   f"{mbu}  {verdict}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("logs", nargs="*", help="ab_decode.py output (default: standard input)")
    parser.add_argument("--baseline", default="new", help="the side the others are divided by (its label)")
    args = parser.parse_args(argv)
    lines = [line for path in args.logs for line in open(path)] if args.logs else sys.stdin
    print("\n".join(table(parse(lines), args.baseline)))


if __name__ == "__main__":
    main()
