"""One side of a decode A/B on the GPU: the tree in the working directory, Llama-3-8B shape
(/tmp/l3), bf16, prompt 128, 128 new tokens, overlapped scheduling; decode tok/s per batch."""
import sys, time
sys.path.insert(0, ".")
import torch
from pathlib import Path
from benchmarks.decode import run_engine
from app.config import EngineConfig
from app.engine.engine import LLMEngine

max_len = int(sys.argv[1])
label = sys.argv[2]
batches = [1, 64, 256]
kv_gib = 256 * 272 * 131072 / 2**30 * 1.2 + 1
engine = LLMEngine(EngineConfig(model="/tmp/l3", dtype="bfloat16", device="cuda", kv_cache_memory_gib=kv_gib,
                                max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=max_len))
run_engine(engine, 2, 16, 8, "warmup")
for batch in batches:
    for sampled in (False, True):
        if sampled and batch != 256:
            continue
        best = max(run_engine(engine, batch, 128, 128, f"{label}-{batch}-{sampled}-{r}", sampled)["decode_tok_s"]
                   for r in range(2))
        print(f"{label} max_model_len {max_len} batch {batch:3d} {'sampled' if sampled else 'greedy '}: "
              f"decode {best:9.1f} tok/s", flush=True)
