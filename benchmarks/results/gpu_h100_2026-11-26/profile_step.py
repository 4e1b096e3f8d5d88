"""Where a decode step's GPU time goes: kernels by total device time over 4 steps, per step,
at batch 1 and 256 (8B shape, bf16, greedy, overlapped scheduling on), context ~190."""
import sys, torch
from pathlib import Path
sys.path.insert(0, ".")
from torch.profiler import ProfilerActivity, profile
from benchmarks.decode import build_model
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams

hf, d = build_model(32, Path(sys.argv[1])); del hf; torch.cuda.empty_cache()
eng = LLMEngine(EngineConfig(model=str(d), dtype="bfloat16", device="cuda", kv_cache_memory_gib=12,
                             max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=272))
for batch in (1, 256):
    params = SamplingParams(max_tokens=80, ignore_eos=True, temperature=0.0)
    for i in range(batch):
        eng.add_request(f"p{batch}-{i}", torch.randint(10, 120000, (128,)).tolist(), params)
    for _ in range(70):
        eng.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(4):
            eng.step()
        torch.cuda.synchronize()
    rows = sorted(((e.self_device_time_total, e.count, e.key) for e in prof.key_averages()), reverse=True)
    total = sum(r[0] for r in rows)
    print(f"\nbatch {batch}: device time per step {total / 4 / 1e3:.3f} ms (sum of kernels and copies)")
    for t, n, k in rows[:22]:
        print(f"  {t / 4 / 1e3:7.3f} ms  {100 * t / total:5.1f}%  x{n / 4:6.1f}/step  {k[:90]}")
    while eng.has_unfinished_requests():
        eng.step()
