"""An engine's build in a fresh process (the default checkpoint, CPU), the tree given as argv[1]."""
import sys, time
sys.path.insert(0, sys.argv[1])
from pathlib import Path  # noqa: E402
CHECKPOINT = Path(__file__).resolve().parents[3] / "checkpoints" / "tiny-target"  # this repository's
import torch  # noqa: F401
from app.config import EngineConfig
from app.engine.engine import LLMEngine
t0 = time.perf_counter()
LLMEngine(EngineConfig(model=str(CHECKPOINT)))
print(f"{sys.argv[1]}: engine built in {time.perf_counter() - t0:.2f} s, torch._dynamo imported: {'torch._dynamo' in sys.modules}")
