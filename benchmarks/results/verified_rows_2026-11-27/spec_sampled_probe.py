"""Sampled speculative decoding in the engine (n-gram from 3-token matches, k = 4 up to batch 31 as
on a GPU, adaptive off), batches of 8 and 16: half the prompts input-grounded (drafts match),
half open-ended; temperature 0.8, top_p 0.95. Output tok/s; the tree is argv[1]."""
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path  # noqa: E402
CHECKPOINT = Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-target"  # this repository's
import torch
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts, open_ended_texts
torch.set_num_threads(2)
model = str(CHECKPOINT)
tok = AutoTokenizer.from_pretrained(model)
engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=4096, max_num_seqs=16, speculative_method="ngram",
                                prompt_lookup_min=3, adaptive_speculation=False, speculation_schedule={1: 4, 32: 0}))
params = SamplingParams(max_tokens=64, temperature=0.8, top_p=0.95, ignore_eos=True, seed=None)
out = []
for batch in (8, 16):
    best = 0.0
    for rep in range(3):
        texts = input_grounded_texts(batch // 2, 100 + rep) + open_ended_texts(batch - batch // 2, 200 + rep)
        for i, t in enumerate(texts):
            engine.add_request(f"b{batch}-{rep}-{i}", tok.encode(t), params)
        tokens, t0 = 0, time.perf_counter()
        while engine.has_unfinished_requests():
            tokens += sum(len(o.new_token_ids) for o in engine.step())
        best = max(best, tokens / (time.perf_counter() - t0))
    out.append(f"batch {batch}: {best:.0f} tok/s")
import app; print(sys.argv[1], app.__file__, "; ".join(out), dict(engine.speculator.stats.steps_by_k))
