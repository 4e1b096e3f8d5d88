"""The engine in its own process (EngineProcess, as served, 1 torch thread), no Serve: sampled
copying prompts one at a time, ngram3 against off, alternated, 3 rounds. Is the served sampled
loss in the process boundary or in Serve?"""
import asyncio, os, sys, time
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["OMP_NUM_THREADS"] = "1"
sys.path.insert(0, ".")
from transformers import AutoTokenizer
from app.config import EngineConfig
from app.engine.engine_process import EngineProcess
from app.sampling_params import SamplingParams
from benchmarks.grounded_prompts import input_grounded_texts
tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
prompts = [tok.encode(t) for t in input_grounded_texts(24, 0)]
common = dict(model="checkpoints/tiny-target", kv_cache_memory_gib=0.5, max_num_batched_tokens=1024)
mode = sys.argv[1] if len(sys.argv) > 1 else "sampled"
settings = dict(temperature=0.8, top_p=0.95) if mode == "sampled" else dict(temperature=0.0)
params = SamplingParams(max_tokens=64, ignore_eos=True, **settings)

async def run(engine, tag):
    t = time.perf_counter()
    for i, p in enumerate(prompts):
        async for _ in engine.generate(f"{tag}-{i}", p, params):
            pass
    return time.perf_counter() - t

async def main():
    engines = {"off": EngineProcess(EngineConfig(**common)),
               "ngram3": EngineProcess(EngineConfig(**common, speculative_method="ngram", prompt_lookup_min=3))}
    for name, e in engines.items():
        await run(e, f"warm-{name}")
    res = {k: [] for k in engines}
    for r in range(3):
        for name in (["off", "ngram3"] if r % 2 == 0 else ["ngram3", "off"]):
            res[name].append(await run(engines[name], f"{name}-{r}"))
    print(mode, {k: [round(x, 2) for x in v] for k, v in res.items()},
          "ngram3/off", round(sum(res["ngram3"]) / sum(res["off"]), 3))
    for e in engines.values():
        e.shutdown()

asyncio.run(main())
