"""Engine alone, draft in-process, sampled (0.8 / 0.95), fixed k=4 (adaptive off): tok/s."""
import sys, time
sys.path.insert(0, sys.argv[1])
import torch
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained("/work/main/checkpoints/tiny-target")
code = open("/work/main/app/engine/scheduler.py").read()[:1500]
eng = LLMEngine(EngineConfig(model="/work/main/checkpoints/tiny-target", draft_model="/work/main/checkpoints/tiny-draft",
                             speculative_method="draft", speculation_schedule={1: 4}, adaptive_speculation=False,
                             num_kv_blocks=1024))
out = []
for batch in (1, 8):
    prompts = [tok.encode(f"# file {i}\n" + code + "\n# the same file again:\n" + code[:200]) for i in range(batch)]
    params = [SamplingParams(max_tokens=64, temperature=0.8, top_p=0.95, seed=i, ignore_eos=True) for i in range(batch)]
    eng.generate(prompts[:1], params[:1])
    t = time.perf_counter(); res = eng.generate(prompts, params); dt = time.perf_counter() - t
    out.append(f"b{batch}:{sum(map(len, res)) / dt:.1f}")
print(" ".join(out), eng.stats().spec)
