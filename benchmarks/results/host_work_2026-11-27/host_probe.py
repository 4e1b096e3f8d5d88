"""Host time per decode step at batch 256 on the CPU: the default target, 256 random 32-token
prompts, 48 tokens each, one torch thread, no overlap (the CPU's default). Per step: the step's
wall time minus the model's forward and logits (on a GPU those run on the device), and the
host functions inside it. Run from a tree's root: python host_probe.py TEMPERATURE"""
import sys, time, collections
sys.path.insert(0, ".")
import torch
torch.set_num_threads(1)
from app.config import EngineConfig
from app.engine.engine import LLMEngine
from app.sampling_params import SamplingParams
from app.models.llama import LlamaForCausalLM
spent = collections.Counter()
def wrap(cls, name, key):
    f = getattr(cls, name)
    def w(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[key] += time.perf_counter() - t
    setattr(cls, name, w)
wrap(LlamaForCausalLM, "forward", "forward")
wrap(LlamaForCausalLM, "compute_logits", "logits")
from tests.checkpoints import DEFAULT_TARGET  # noqa: E402
model = str(DEFAULT_TARGET)
g = torch.Generator().manual_seed(0)
prompts = [torch.randint(5, 4000, (32,), generator=g).tolist() for _ in range(256)]
engine = LLMEngine(EngineConfig(model=model, num_kv_blocks=4096, max_num_seqs=256, max_num_batched_tokens=8192))
from app.engine.model_runner import ModelRunner
from app.engine.scheduler import Scheduler
from app.engine.selection.selector import Selector
wrap(ModelRunner, "prepare", "prepare")
wrap(Scheduler, "schedule", "schedule")
wrap(Selector, "on_device", "select_on_device")  # on the CPU: argmax or draws in torch
wrap(LLMEngine, "_update", "update")
temperature = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
engine.generate(prompts[:2], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
for req_round in range(2):
    spent.clear()
    for i, p in enumerate(prompts):
        engine.add_request(f"r{req_round}-{i}", p, SamplingParams(max_tokens=48, temperature=temperature, ignore_eos=True))
    engine.step()  # prefill
    spent.clear()
    steps, t0 = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step(); steps += 1
    wall = time.perf_counter() - t0
    us = {k: v / steps * 1e6 for k, v in spent.items()}
    host = wall / steps * 1e6 - us["forward"] - us["logits"]
    print(f"temp {temperature} steps {steps} step {wall/steps*1e3:.2f} ms  host (step - forward - logits) {host:.0f} us  "
          + "  ".join(f"{k} {v:.0f}" for k, v in sorted(us.items())))
