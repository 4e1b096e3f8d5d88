"""The Responses API's stream events, cost per text delta: 4,000 deltas in a fresh process per tree,
eight runs alternated. It drives both the API before a418cdd (open_message / text_delta) and after
(ResponseEvents.text), so either tree can be either side.

    git worktree add /tmp/ref16 16d6f9b
    python benchmarks/results/responses_events_2026-12-07/resp_events_ab.py /tmp/ref16 .
"""
import json
import statistics
import subprocess
import sys

CODE = r'''
import sys, time
sys.path.insert(0, sys.argv[1])
from deployments.responses_api_output import ResponseEvents, ResponseOutput
N = 4000
out, ev = ResponseOutput(False), ResponseEvents()
t = time.perf_counter()
if hasattr(ev, "text"):
    for _ in range(N):
        ev.text(out, "tok ", [])
    ev.finish(out, "completed", [])
else:
    ev.open_message(out)
    for _ in range(N):
        out.add("tok ", [])
        ev.text_delta(out, "tok ", [])
    ev.close_message(out, "completed")
print((time.perf_counter() - t) / N * 1e6)
'''

if __name__ == "__main__":
    trees = {"new": sys.argv[2], "old": sys.argv[1]}
    times = {k: [] for k in trees}
    for r in range(8):
        for k in (("new", "old") if r % 2 else ("old", "new")):
            times[k].append(float(subprocess.run([sys.executable, "-c", CODE, trees[k]], capture_output=True,
                                                 text=True, check=True).stdout))
    print(json.dumps(times), statistics.median(times["new"]) / statistics.median(times["old"]))
