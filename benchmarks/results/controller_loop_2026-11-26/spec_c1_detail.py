import os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, "/work/main")
import torch
torch.set_num_threads(1)
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
adaptive = sys.argv[1] == "adaptive"
eng = LLMEngine(EngineConfig(model="checkpoints/tiny-target", kv_cache_memory_gib=0.5, max_num_batched_tokens=1024,
                             speculative_method="ngram", prompt_lookup_min=int(os.environ.get("PLM", "3")), adaptive_speculation=adaptive))
texts = input_grounded_texts(16, seed=0)
tot = 0.0
for i, t in enumerate(texts):
    before = dict(eng.stats().spec.steps_by_k)
    eng.add_request(f"r{i}", tok.encode(t), SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    eng.step(); steps = 0; a = time.perf_counter()
    while eng.has_unfinished_requests():
        eng.step(); steps += 1
    dt = time.perf_counter() - a; tot += dt
    after = eng.stats().spec.steps_by_k
    print(i, steps, "steps", f"{1e3*dt:.0f} ms", {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)})
print(f"total decode {1e3*tot:.0f} ms")
