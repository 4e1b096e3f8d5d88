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
method = sys.argv[1] if len(sys.argv) > 1 else "ngram"
eng = LLMEngine(EngineConfig(model="checkpoints/tiny-target", kv_cache_memory_gib=0.5, max_num_batched_tokens=1024,
                             speculative_method=None if method == "off" else method, prompt_lookup_min=3))
texts = input_grounded_texts(48, seed=0)
dec_t, dec_tok, steps, pre = 0.0, 0, 0, 0.0
for i, t in enumerate(texts):
    eng.add_request(f"r{i}", tok.encode(t), SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
    a = time.perf_counter(); eng.step(); pre += time.perf_counter() - a
    while eng.has_unfinished_requests():
        a = time.perf_counter(); outs = eng.step(); dec_t += time.perf_counter() - a
        dec_tok += sum(len(o.new_token_ids) for o in outs); steps += 1
print(f"{method}: prefill {1e3*pre/48:.1f} ms, decode {1e3*dec_t/dec_tok:.2f} ms/token, {dec_tok/steps:.2f} tokens/step, {1e3*dec_t/steps:.2f} ms/step")
print(eng.stats().spec)
