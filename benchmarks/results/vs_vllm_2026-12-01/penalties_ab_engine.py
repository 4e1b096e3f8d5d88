"""Offline decode with min_tokens and bad words on every request (penalised rows every step)."""
import sys, time
sys.path.insert(0, sys.argv[1])
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from transformers import AutoTokenizer
model = sys.argv[1] + "/checkpoints/tiny-target"
tok = AutoTokenizer.from_pretrained(model)
engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=1024))
prompts = [tok.encode(f"Story {i}: once upon a time there was a") for i in range(32)]
params = SamplingParams(max_tokens=64, temperature=0.8, min_tokens=60, bad_words_token_ids=[[13], [262, 262]], seed=1)
engine.generate(prompts[:4], params)
best = 0
for _ in range(3):
    t = time.perf_counter(); outs = engine.generate(prompts, params); dt = time.perf_counter() - t
    best = max(best, sum(map(len, outs)) / dt)
print(sys.argv[1], f"{best:.0f} tok/s")
