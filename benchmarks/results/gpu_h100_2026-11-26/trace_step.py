"""Chrome traces (host and device) of 4 overlapped decode steps at batch 1 and 256, to find
where the GPU waits for the host (8B shape, bf16, greedy)."""
import gzip, os, shutil, sys, torch
from pathlib import Path
sys.path.insert(0, ".")
from torch.profiler import ProfilerActivity, profile
from benchmarks.decode import build_model
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams

out = Path(os.environ.get("OUT", "."))
hf, d = build_model(32, Path(sys.argv[1])); del hf; torch.cuda.empty_cache()
eng = LLMEngine(EngineConfig(model=str(d), dtype="bfloat16", device="cuda", kv_cache_memory_gib=12,
                             max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=272))
for batch in (1, 256):
    params = SamplingParams(max_tokens=60, ignore_eos=True, temperature=0.0)
    for i in range(batch):
        eng.add_request(f"t{batch}-{i}", torch.randint(10, 120000, (128,)).tolist(), params)
    for _ in range(30):
        eng.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        for _ in range(4):
            with torch.profiler.record_function("engine.step"):
                eng.step()
        torch.cuda.synchronize()
    path = out / f"trace_b{batch}.json"
    prof.export_chrome_trace(str(path))
    with open(path, "rb") as f, gzip.open(str(path) + ".gz", "wb") as g:
        shutil.copyfileobj(f, g)
    path.unlink()
    print(batch, os.path.getsize(str(path) + ".gz"))
    while eng.has_unfinished_requests():
        eng.step()
