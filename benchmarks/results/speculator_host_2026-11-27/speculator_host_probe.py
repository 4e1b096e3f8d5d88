"""The speculator's host time per engine step (propose, choose_k, record_step, record_verified,
forget), timed inside the engine: default target, n-gram lookup from 3-token matches with
adaptive speculation (the served default), 8 random 64-token prompts one at a time, 96 greedy
tokens each, one torch thread. Run from a tree's root; alternate the trees."""
import sys
import time

sys.path.insert(0, ".")
import torch  # noqa: E402

torch.set_num_threads(1)
from app.config import EngineConfig  # noqa: E402
from app.engine.engine import LLMEngine  # noqa: E402
from app.sampling_params import SamplingParams  # noqa: E402
from tests.checkpoints import DEFAULT_TARGET  # noqa: E402

g = torch.Generator().manual_seed(0)
prompts = [torch.randint(5, 4000, (64,), generator=g).tolist() for _ in range(8)]
params = SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True)
engine = LLMEngine(EngineConfig(model=str(DEFAULT_TARGET), num_kv_blocks=256, speculative_method="ngram",
                                prompt_lookup_min=3))
speculator = engine.speculator
spent: dict[str, float] = {}


def timed(name: str) -> None:
    call = getattr(speculator, name)

    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started
    setattr(speculator, name, wrapper)


for name in ("propose", "choose_k", "record_step", "record_verified", "forget"):
    timed(name)
engine.generate(prompts[:1], params)
spent.clear()
first_step, cpu_started = engine.num_steps, time.process_time()
for prompt in prompts:
    engine.generate([prompt], params)
steps = engine.num_steps - first_step
cpu_ms = (time.process_time() - cpu_started) / steps * 1e3
per_step = {name: seconds / steps * 1e6 for name, seconds in spent.items()}
print(f"speculator host us per step {sum(per_step.values()):.1f}  "
      + "  ".join(f"{name} {us:.1f}" for name, us in per_step.items())
      + f"  | steps {steps}, process CPU ms per step {cpu_ms:.3f}")
