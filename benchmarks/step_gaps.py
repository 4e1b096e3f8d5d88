#!/usr/bin/env python
"""Where the GPU waits between decode steps: the idle gaps in a torch.profiler chrome trace,
each put down to what the host was doing; then where its busy time goes, by kernel.

`benchmarks/decode.py --trace-dir DIR` writes one trace per batch size (8 overlapped greedy
decode steps, the engine's phases marked with `record_function`). For every stretch in which
no kernel, copy or memset runs on the GPU, this finds the CUDA runtime call that launched the
work ending it. Launched after the gap began: the host was late, and the gap is charged to the
innermost engine phase around that launch. Launched before: the GPU waited on something else
(a copy from pageable memory, an event), charged to "launched in time". Issue 17 wants host
work under 10% of a step; decode.py's idle share says how much there is, this says where.

    python benchmarks/step_gaps.py DIR/decode_b1.json.gz [--min-gap-us 5] [--top 12]
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCHED_IN_TIME = "launched in time (the GPU waited on a dependency)"
LAUNCH_NOT_TRACED = "(its launch is not in the trace)"


@dataclass
class Gap:
    start_us: float
    end_us: float
    before: str  # the GPU work that ended as the gap began
    after: str  # the GPU work that ended the gap
    launch_late_us: float | None  # when its launch call began, after the gap began (<= 0: in time)
    host_phase: str  # the innermost marked host phase around that launch

    @property
    def us(self) -> float:
        return self.end_us - self.start_us


ENGINE_PHASES = {  # object path on an LLMEngine -> the phase name its calls are marked with
    "_schedule": "schedule", "_advance_ahead": "advance the step in flight",
    "_finish_ahead": "finish the step in flight (wait, then outputs)", "_update": "update",
    "runner.prepare": "prepare inputs", "runner.execute": "execute",
    "selector.on_device": "select (launch)", "_to_host": "wait for the chosen tokens",
}


@contextmanager
def marked_engine_phases(engine):
    """Wrap the engine's step phases in `torch.profiler.record_function` while a trace is taken
    (the engine itself carries no markers: they would cost on every step)."""
    from torch.profiler import record_function

    restore = []
    for dotted, name in ENGINE_PHASES.items():
        *path, attr = dotted.split(".")
        owner = engine
        for part in path:
            owner = getattr(owner, part)
        original, own = getattr(owner, attr), attr in vars(owner)

        def marked(*args, _original=original, _name=name, **kwargs):
            with record_function(_name):
                return _original(*args, **kwargs)

        setattr(owner, attr, marked)
        restore.append((owner, attr, original, own))
    try:
        yield
    finally:
        for owner, attr, original, own in reversed(restore):
            if own:
                setattr(owner, attr, original)
            else:  # a method of the class: drop the instance's wrapper
                delattr(owner, attr)


def load_trace(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def gpu_events(events: list[dict]) -> list[dict]:
    """The kernels, copies and memsets, by start time."""
    return sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES),
                  key=lambda e: e["ts"])


def find_gaps(events: list[dict], min_gap_us: float = 5.0) -> list[Gap]:
    gpu = gpu_events(events)
    launches = {e["args"]["correlation"]: e for e in events  # Triton launches through the driver API
                if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                and "correlation" in e.get("args", {})}
    phases = [e for e in events if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    gaps, reach, last = [], None, None
    for e in gpu:
        end = e["ts"] + e["dur"]
        if reach is not None and e["ts"] - reach >= min_gap_us:
            launch = launches.get(e.get("args", {}).get("correlation"))
            if launch is None:
                late, phase = None, LAUNCH_NOT_TRACED
            else:
                late = launch["ts"] - reach
                phase = innermost_phase(phases, launch["ts"]) if late > 0 else LAUNCHED_IN_TIME
            gaps.append(Gap(reach, e["ts"], last["name"], e["name"], late, phase))
        if reach is None or end > reach:
            reach, last = end, e
    return gaps


def innermost_phase(phases: list[dict], ts: float) -> str:
    around = [p for p in phases if p["ts"] <= ts <= p["ts"] + p["dur"]]
    return min(around, key=lambda p: p["dur"])["name"] if around else "(no marked phase)"


def summarize(gaps: list[Gap]) -> dict[str, tuple[int, float]]:
    """Idle time by host phase: {phase: (gaps, microseconds)}, the largest first."""
    by_phase: dict[str, list[float]] = defaultdict(list)
    for g in gaps:
        by_phase[g.host_phase].append(g.us)
    return dict(sorted(((k, (len(v), sum(v))) for k, v in by_phase.items()), key=lambda kv: -kv[1][1]))


def busy_by_kernel(events: list[dict]) -> list[tuple[str, float, int]]:
    """The GPU's busy time by kernel (or copy), its template and arguments cut off:
    [(name, microseconds, count)], the largest first."""
    busy: dict[str, list[float]] = defaultdict(list)
    for e in gpu_events(events):
        busy[re.split(r"[<(]", e["name"], maxsplit=1)[0].strip()].append(e["dur"])
    return sorted(((name, sum(d), len(d)) for name, d in busy.items()), key=lambda row: -row[1])


def gpu_window_us(events: list[dict]) -> float:
    gpu = gpu_events(events)
    return max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu) if gpu else 0.0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path, nargs="+")
    parser.add_argument("--min-gap-us", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=12, help="the longest gaps listed one by one")
    args = parser.parse_args(argv)
    for path in args.traces:
        events = load_trace(path)
        gaps, window = find_gaps(events, args.min_gap_us), gpu_window_us(events)
        idle = sum(g.us for g in gaps)
        print(f"== {path}: {len(gaps)} gaps of {args.min_gap_us:g} us or more, {idle:.0f} us idle in "
              f"{window:.0f} us of GPU time span ({100 * idle / window if window else 0:.1f}%)")
        for phase, (count, us) in summarize(gaps).items():
            print(f"  {us:9.0f} us in {count:4d} gaps  {phase}")
        print(f"  the {args.top} longest:")
        for g in sorted(gaps, key=lambda g: -g.us)[:args.top]:
            late = "?" if g.launch_late_us is None else f"{g.launch_late_us:+.0f} us"
            print(f"  {g.us:8.0f} us  after {g.before[:40]!r} before {g.after[:40]!r}  launch {late}  "
                  f"{g.host_phase}")
        busy = busy_by_kernel(events)
        total = sum(us for _, us, _ in busy)
        print(f"  where the GPU's {total:.0f} busy us go, the {args.top} largest:")
        for name, us, count in busy[:args.top]:
            print(f"  {us:9.0f} us {100 * us / total:5.1f}%  {count:5d} x {us / count:7.1f} us  {name[:70]}")


if __name__ == "__main__":
    main()
