"""One engine's decode step split into schedule / execute (prepare + forward + logits) / select /
update, each bracketed by a sync, at batch 1 and 256, greedy and sampled (8B shape, bf16)."""
import statistics, sys, time, torch
from pathlib import Path
sys.path.insert(0, ".")
from benchmarks.decode import build_model, kv_bytes_per_token, SAMPLED
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams

import os
if os.environ.get("PIVOTS") and os.path.exists("kernels/filtered_sampling.py"):
    import kernels.filtered_sampling as fs
    fs.NUM_PIVOTS = int(os.environ["PIVOTS"])
    print("pivots", fs.NUM_PIVOTS)
hf, d = build_model(32, Path(sys.argv[1]))
del hf; torch.cuda.empty_cache()
eng = LLMEngine(EngineConfig(model=str(d), dtype="bfloat16", device="cuda", kv_cache_memory_gib=12,
                             max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=400))
parts = {}
def timed(obj, name, label):
    orig = getattr(obj, name)
    def f(*a, **k):
        torch.cuda.synchronize(); t = time.perf_counter(); r = orig(*a, **k); torch.cuda.synchronize()
        parts[label] = parts.get(label, 0) + time.perf_counter() - t; return r
    setattr(obj, name, f)
timed(eng, "_schedule", "schedule"); timed(eng.runner, "prepare", "prepare")
timed(eng.runner, "execute_with_layout", "execute"); timed(eng, "_select", "select"); timed(eng, "_update", "update")
for batch in (1, 64, 256):
    for mode in ("greedy", "sampled"):
        params = SamplingParams(max_tokens=48, ignore_eos=True, **(SAMPLED if mode == "sampled" else dict(temperature=0.0)))
        for i in range(batch):
            eng.add_request(f"{mode}{batch}-{i}", torch.randint(10, 120000, (128,)).tolist(), params)
        rows = []
        while eng.has_unfinished_requests():
            parts.clear(); torch.cuda.synchronize(); t = time.perf_counter()
            outs = eng.step(); torch.cuda.synchronize()
            rows.append((time.perf_counter() - t, dict(parts), len(outs)))
        dec = [r for r in rows[3:] if r[2] == batch]
        med = lambda k: statistics.median(r[1].get(k, 0) for r in dec) * 1e3
        wall = statistics.median(r[0] for r in dec) * 1e3
        print(f"batch {batch:3d} {mode:7s}: step {wall:6.2f} ms = schedule {med('schedule'):5.2f} + execute {med('execute'):6.2f} "
              f"(prepare {med('prepare'):5.2f}) + select {med('select'):5.2f} + update {med('update'):5.2f}; "
              f"{batch / wall * 1e3:8.0f} tok/s", flush=True)
