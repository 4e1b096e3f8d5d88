import sys, hashlib
sys.path.insert(0, sys.argv[1])
from pathlib import Path  # noqa: E402
CHECKPOINT = Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-target"  # this repository's
import torch
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts, open_ended_texts
model = str(CHECKPOINT)
tok = AutoTokenizer.from_pretrained(model)
engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=4096, max_num_seqs=16, speculative_method="ngram",
                                prompt_lookup_min=3, adaptive_speculation=False, speculation_schedule={1: 4, 32: 0}))
texts = input_grounded_texts(6, 7) + open_ended_texts(6, 8)
kinds = [SamplingParams(max_tokens=48, temperature=0.8, top_p=0.95, ignore_eos=True),
         SamplingParams(max_tokens=48, temperature=0, ignore_eos=True),
         SamplingParams(max_tokens=48, temperature=1.0, top_k=20, seed=3, ignore_eos=True)]
for i, t in enumerate(texts):
    engine.add_request(f"r{i}", tok.encode(t), kinds[i % 3])
outs = {}
while engine.has_unfinished_requests():
    for o in engine.step():
        outs.setdefault(o.request_id, []).extend(o.new_token_ids)
print(hashlib.sha1(str(sorted(outs.items())).encode()).hexdigest(), dict(engine.speculator.stats.steps_by_k))
