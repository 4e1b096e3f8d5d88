import os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(int(os.environ.get("T", "1")))
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts
from torch.profiler import profile, ProfilerActivity
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
eng = LLMEngine(EngineConfig(model="checkpoints/tiny-target", kv_cache_memory_gib=0.5, max_num_batched_tokens=1024,
                             enable_prefix_caching=False))
texts = input_grounded_texts(12, seed=3)
x_seen = []
orig = torch.ops.specserve_cpu.silu_and_mul
for i, t in enumerate(texts):
    ids = tok.encode(t)
    eng.add_request(f"r{i}", ids, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    if i == len(texts) - 1:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            eng.step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6))
    else:
        t0 = time.perf_counter(); eng.step(); print(len(ids), f"{1e3*(time.perf_counter()-t0):.1f} ms")
