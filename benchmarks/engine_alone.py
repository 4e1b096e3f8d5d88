"""The requests of `benchmarks/serving.py` through the engine alone, in this process
(`--compare-engine`): the baseline its Serve-overhead ratio divides by."""

from __future__ import annotations

import time

from benchmarks.serving_report import Result
from benchmarks.serving_workload import Request


class EngineAlone:
    def __init__(self, checkpoint: str, tokenizer, engine_args: dict, threads: int | None):
        import torch

        from app.config import EngineConfig
        from app.engine.async_engine import AsyncLLMEngine

        if threads:
            torch.set_num_threads(threads)
        self.threads = torch.get_num_threads()
        self.engine = AsyncLLMEngine(EngineConfig(model=checkpoint, **engine_args))
        self.tokenizer = tokenizer
        self.ids = 0

    async def send(self, req: Request, args) -> Result:
        from app.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=req.output_len, temperature=args.temperature,
                                ignore_eos=args.ignore_eos)
        prompt = self.tokenizer.encode(req.prompt)
        res = Result(prompt_len=len(prompt))
        self.ids += 1
        start = last = time.perf_counter()
        try:
            async for out in self.engine.generate(f"bench-{self.ids}", prompt, params):
                now = time.perf_counter()
                if out.new_token_ids:
                    if res.output_len == 0:
                        res.ttft = now - start
                    else:
                        res.itl.append(now - last)
                    last = now
                    res.output_len += len(out.new_token_ids)
            res.latency = time.perf_counter() - start
            res.success = res.output_len > 0
        except Exception as exc:  # noqa: BLE001
            res.error = f"{type(exc).__name__}: {exc}"
        return res

    def shutdown(self) -> None:
        self.engine.shutdown()
