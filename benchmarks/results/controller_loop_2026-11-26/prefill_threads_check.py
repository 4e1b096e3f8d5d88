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
pt = int(sys.argv[1]) if len(sys.argv) > 1 else None
eng = LLMEngine(EngineConfig(model="checkpoints/tiny-target", kv_cache_memory_gib=0.5, enable_prefix_caching=False, prefill_threads=pt))
texts = input_grounded_texts(12, seed=3)
pre, dec = [], []
for i, t in enumerate(texts):
    eng.add_request(f"r{i}", tok.encode(t), SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
    a = time.perf_counter(); eng.step(); pre.append(time.perf_counter() - a)
    while eng.has_unfinished_requests():
        a = time.perf_counter(); eng.step(); dec.append(time.perf_counter() - a); 
print(f"prefill_threads={pt}: prefill {1e3*sum(pre[1:])/len(pre[1:]):.1f} ms, decode {1e3*sum(dec)/len(dec):.2f} ms, threads now {torch.get_num_threads()}")
