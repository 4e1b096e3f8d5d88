#!/usr/bin/env python
"""What one draft proposal costs in-process: `DraftWorker.propose_batch` for one sequence of the
input-grounded prompts, growing by the accepted tokens as a served request does, timed per call
(the warm calls only). The served figure for the same call is the draft replica's; the difference
is what sharing the cores with the rest of the app costs (benchmarks/served_cpu.py).

    python benchmarks/draft_call.py --threads 1 --k 4
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from app.config import EngineConfig  # noqa: E402
from app.engine.spec.draft_worker import DraftWorker  # noqa: E402
from app.engine.spec.proposal import DraftInput  # noqa: E402
from benchmarks.grounded_prompts import input_grounded_texts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a DraftModel replica has 1)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--accepted", type=int, default=3, help="tokens a sequence grows by per call")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20, help="per prompt")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(ROOT / "checkpoints" / "tiny-target")
    worker = DraftWorker(EngineConfig(model=str(ROOT / "checkpoints" / "tiny-draft")))
    times = []
    for text in input_grounded_texts(args.prompts, seed=0):
        token_ids = tokenizer(text).input_ids
        for _ in range(args.calls):
            started = time.perf_counter()
            proposal = worker.propose_batch([DraftInput("r", token_ids, args.k)])[0]
            times.append(time.perf_counter() - started)
            token_ids = token_ids + proposal.token_ids[:args.accepted]
    warm = times[args.calls:]  # the first prompt's calls warm the kernels up
    print(f"k={args.k}, {args.threads} thread(s): {1e3 * statistics.mean(warm):.2f} ms per call "
          f"(median {1e3 * statistics.median(warm):.2f}, {len(warm)} calls)")


if __name__ == "__main__":
    main()
