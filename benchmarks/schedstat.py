"""Per-thread CPU time and time spent waiting for a core (Linux /proc/<pid>/task/<tid>/schedstat),
for the processes whose command line contains one of the given patterns.

    python benchmarks/schedstat.py snapshot before.json "ray::" engine_process
    ... run the load ...
    python benchmarks/schedstat.py snapshot after.json "ray::" engine_process
    python benchmarks/schedstat.py diff before.json after.json

A thread that has work but neither runs nor waits for a core is blocked: for an engine step
thread that never sleeps while it has requests, that is the GIL (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def snapshot(patterns: list[str]) -> dict[str, list]:
    """"pid/tid" -> [command line, thread name, CPU ns, runnable-but-waiting ns]."""
    out = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not any(p in cmd for p in patterns):
                continue
            for task in (proc / "task").iterdir():
                cpu_ns, wait_ns = (task / "schedstat").read_text().split()[:2]
                out[f"{proc.name}/{task.name}"] = [cmd[:60], (task / "comm").read_text().strip(),
                                                   int(cpu_ns), int(wait_ns)]
        except OSError:  # ended while we looked
            continue
    return out


def deltas(before: dict, after: dict) -> list[tuple[float, float, str, str, str]]:
    """(CPU s, waiting s, "pid/tid", command line, thread name) of each thread between two snapshots."""
    rows = []
    for key, (cmd, name, cpu, wait) in after.items():
        cpu0, wait0 = before[key][2:] if key in before else (0, 0)
        rows.append(((cpu - cpu0) / 1e9, (wait - wait0) / 1e9, key, cmd, name))
    return rows


def diff(before: dict, after: dict, top: int) -> list[str]:
    rows = sorted(deltas(before, after), reverse=True)
    return [f"cpu {c:7.2f} s  waiting for a core {w:6.2f} s  {k} {cmd} [{name}]"
            for c, w, k, cmd, name in rows[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot")
    snap.add_argument("out")
    snap.add_argument("patterns", nargs="+")
    d = sub.add_parser("diff")
    d.add_argument("before")
    d.add_argument("after")
    d.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    if args.command == "snapshot":
        Path(args.out).write_text(json.dumps(snapshot(args.patterns)))
    else:
        load = lambda p: json.loads(Path(p).read_text())  # noqa: E731
        print("\n".join(diff(load(args.before), load(args.after), args.top)))


if __name__ == "__main__":
    main()
