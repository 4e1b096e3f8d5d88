"""The direct CPU probe of 2026-11-27 (RESULTS.md, issue 17's section): one engine, one thread,
80 requests of the offline workload's shape, process CPU seconds; run from each tree's root,
alternating (e9e0f1c was a `git worktree` at /tmp/base):
    cd TREE && PYTHONPATH=TREE python direct_cpu_probe.py LABEL [profile]"""
import cProfile, pstats, sys, time, os, io
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
torch.set_num_threads(1)
sys.path.insert(0, os.getcwd())
from benchmarks.offline_runner import make_workload
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
wl = make_workload(80, 4096, 0)
eng = LLMEngine(EngineConfig(model="/work/main/checkpoints/tiny-target", num_kv_blocks=4096, max_num_seqs=64, max_num_batched_tokens=1024))
eng.generate([wl[0][0][:32]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
params = [SamplingParams(max_tokens=o, temperature=0.0, ignore_eos=True) for _, o in wl]
prof = len(sys.argv) > 2
pr = cProfile.Profile()
t = time.process_time()
if prof: pr.enable()
eng.generate([p for p, _ in wl], params)
if prof: pr.disable()
print(sys.argv[1], "cpu", round(time.process_time() - t, 3), "steps", eng.num_steps)
if prof:
    st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(30)
