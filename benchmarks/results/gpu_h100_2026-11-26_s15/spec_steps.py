"""Per-step wall times of speculating engines against the target alone on the GPU (spec.py's
engines and grounded prompts): which steps make a k = 0 engine slower, and whether Triton
compiles new kernels mid-run (steps far above the median)."""
import sys, time, statistics
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from benchmarks.spec import EngineConfig, LLMEngine, SamplingParams, workloads, run
from transformers import AutoTokenizer

tok = AutoTokenizer.from_pretrained("checkpoints/tiny-target")
work = workloads(tok, 16, 0)["input-grounded"]
common = dict(model="checkpoints/tiny-target", num_kv_blocks=4096, max_num_seqs=64, num_speculative_tokens=4)
engines = {"alone": LLMEngine(EngineConfig(**common)),
           "ngram3": LLMEngine(EngineConfig(**common, speculative_method="ngram", prompt_lookup_min=3)),
           "draft": LLMEngine(EngineConfig(**common, speculative_method="draft", draft_model="checkpoints/tiny-draft"))}
for e in engines.values():
    run(e, workloads(tok, 2, 1)["open-ended"][:2], 8)

def steps(engine, prompts):
    params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
    for i, p in enumerate(prompts):
        engine.add_request(f"x{i}-{time.monotonic_ns()}", p, params)
    rec = []
    while engine.has_unfinished_requests():
        before = dict(engine.stats().spec.steps_by_k)
        t = time.perf_counter(); engine.step(); dt = time.perf_counter() - t
        after = engine.stats().spec.steps_by_k
        ks = [k for k, n in after.items() if n > before.get(k, 0)]
        rec.append((ks[0] if ks else None, dt))
    return rec

for batch in (1, 16):
    for rep in range(2):
        for name, e in engines.items():
            rec = []
            for i in range(0, 16, batch):
                rec += steps(e, work[i:i + batch])
            total = sum(dt for _, dt in rec)
            med = statistics.median(dt for _, dt in rec)
            slow = [(k, round(dt * 1e3, 1)) for k, dt in rec if dt > 4 * med]
            byk = {}
            for k, dt in rec:
                byk.setdefault(k, []).append(dt)
            print(f"b{batch} rep{rep} {name:6s} total {total*1e3:7.1f} ms  steps {len(rec)}  median {med*1e3:.3f} ms  "
                  f"by k " + " ".join(f"{k}:{len(v)}x{statistics.median(v)*1e3:.3f}" for k, v in sorted(byk.items(), key=lambda kv: str(kv[0])))
                  + f"  slow(>4x median) {len(slow)} sum {sum(d for _, d in slow):.0f} ms {slow[:8]}", flush=True)
