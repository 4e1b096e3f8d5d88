import os, sys
os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, ".")
import numpy as np
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.serving_workload import shared_prefix_sessions
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
sessions = shared_prefix_sessions(tok, 12, 8, 768, 3, 64, 32, 0)
engine = LLMEngine(EngineConfig(model="checkpoints/tiny-target", dtype="float32", device="cpu", num_kv_blocks=2048))
params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
tot_ideal = tot_real = 0
for s in sessions:
    history = s.system
    prev_ids = None
    for turn, q in enumerate(s.questions):
        prompt = history + q
        ids = tok(prompt)["input_ids"]
        if prev_ids is not None:
            n = 0
            while n < min(len(ids), len(prev_ids)) and ids[n] == prev_ids[n]:
                n += 1
            ideal = len(prev_ids)
            tot_ideal += ideal // 16; tot_real += n // 16
            print(f"turn {turn}: prev prompt+out {len(prev_ids)} tokens ({len(prev_ids) - 32} prompt), common prefix {n}  blocks {n//16}/{ideal//16}")
        out = engine.generate([ids], params)[0]
        text = tok.decode(out)
        prev_ids = ids + list(out)
        history = prompt + text
print("blocks reusable", tot_real, "of", tot_ideal)
