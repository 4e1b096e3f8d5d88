"""Run from the repository root: python benchmarks/results/cpu_2026-11-26/host_parts.py CODE_ROOT PROMPT_LEN BATCHES
(CODE_ROOT: a checkout or `git archive` of the code to time; the checkpoint is this checkout's).
CPU: host parts of a decode step (schedule / prepare / select / update), each timed, at batch
64 and 256 with the default tiny target (forward time excluded by difference)."""
import statistics, sys, time, torch
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
PROMPT = int(sys.argv[2]) if len(sys.argv) > 2 else 64
BATCHES = [int(b) for b in sys.argv[3].split(",")] if len(sys.argv) > 3 else [64, 256]
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
eng = LLMEngine(EngineConfig(model="checkpoints/tiny-target", num_kv_blocks=256 * (PROMPT // 16 + 5) + 64, max_num_seqs=256,
                             max_num_batched_tokens=max(8192, PROMPT * 8)))
parts = {}
def timed(obj, name, label):
    orig = getattr(obj, name)
    def f(*a, **k):
        t = time.perf_counter(); r = orig(*a, **k)
        parts[label] = parts.get(label, 0) + time.perf_counter() - t; return r
    setattr(obj, name, f)
timed(eng, "_schedule", "schedule"); timed(eng.runner, "prepare", "prepare"); (hasattr(eng, "_block_ids") and timed(eng, "_block_ids", "block_ids"))
for name in ("_select", "_select_on_device", "_to_host"):  # before and after the selection split
    if hasattr(eng, name):
        timed(eng, name, "select")
timed(eng, "_update", "update")
from app.engine.selection.layout import RowLayout
orig_build = RowLayout.build
def build(*a, **k):
    t = time.perf_counter(); r = orig_build(*a, **k)
    parts["layout"] = parts.get("layout", 0) + time.perf_counter() - t; return r
RowLayout.build = staticmethod(build)
for batch in BATCHES:
    for mode in ("greedy",):
        params = SamplingParams(max_tokens=40, ignore_eos=True, temperature=0.0)
        for i in range(batch):
            eng.add_request(f"{mode}{batch}-{i}", torch.randint(10, 4000, (PROMPT,)).tolist(), params)
        rows = []
        while eng.has_unfinished_requests():
            parts.clear(); t = time.perf_counter()
            outs = eng.step()
            rows.append((time.perf_counter() - t, dict(parts), len(outs)))
        dec = [r for r in rows[3:] if r[2] == batch]
        med = lambda k: statistics.median(r[1].get(k, 0) for r in dec) * 1e3
        wall = statistics.median(r[0] for r in dec) * 1e3
        host = sum(med(k) for k in ("schedule", "prepare", "block_ids", "layout", "select", "update"))
        print(f"batch {batch:3d}: step {wall:6.2f} ms; schedule {med('schedule'):.3f} block_ids {med('block_ids'):.3f} "
              f"prepare {med('prepare'):.3f} layout {med('layout'):.3f} select {med('select'):.3f} update {med('update'):.3f} = host {host:.2f} ms", flush=True)
