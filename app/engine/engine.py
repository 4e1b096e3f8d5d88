"""The synchronous engine: add a request, abort it, step. One engine per target replica."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from app.config import EngineConfig
from app.engine.block_manager import BlockManager
from app.engine.model_runner import ModelRunner
from app.engine.request import Request
from app.engine.sampler import Sampler
from app.engine.scheduler import Scheduler
from app.models.config import ModelConfig
from app.outputs import RequestOutput, RequestRejected
from app.sampling_params import SamplingParams


@dataclass
class EngineStats:
    num_requests_running: int
    num_requests_waiting: int
    num_blocks_total: int
    num_blocks_used: int
    kv_cache_usage: float  # fraction of blocks referenced by a request
    prefix_cache_queries: int  # tokens, cumulative
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens: int  # prompt tokens computed (cache hits excluded), cumulative
    generation_tokens: int
    num_steps: int


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model)
        self.max_model_len = self._max_model_len()
        self.runner = ModelRunner(config, self.model_config, self.max_model_len)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        self.sampler = Sampler(config.seed)
        self.requests: dict[str, Request] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_steps = 0
        self._offline_ids = itertools.count()

    def _max_model_len(self) -> int:
        limit = self.model_config.max_position_embeddings
        if self.model_config.sliding_window:  # no sliding-window attention: stay inside the window
            limit = min(limit, self.model_config.sliding_window)
        if self.config.max_model_len is None:
            return limit
        if self.config.max_model_len > limit:
            raise ValueError(f"max_model_len {self.config.max_model_len} is over the model's limit {limit}")
        return self.config.max_model_len

    # -- requests --------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Refuse, before anything is queued, a request that could never be served."""
        n = len(prompt_token_ids)
        if n == 0:
            raise RequestRejected("the prompt is empty; send at least one token")
        if n + params.max_tokens > self.max_model_len:
            raise RequestRejected(
                f"this model's maximum context length is {self.max_model_len} tokens, but "
                f"{n} prompt tokens + {params.max_tokens} max_tokens were requested; "
                "shorten the prompt or lower max_tokens")
        needed = self.block_manager.blocks_needed(n + params.max_tokens)
        if needed > self.block_manager.num_blocks:
            raise RequestRejected(
                f"the request needs {needed} KV blocks but the whole pool has "
                f"{self.block_manager.num_blocks}; lower max_tokens or the prompt length")
        vocab = self.model_config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_token_ids):
            raise RequestRejected(f"prompt token ids must be in [0, {vocab})")

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        if request_id in self.requests:
            raise RequestRejected(f"request id {request_id!r} is already in use")
        self.validate(prompt_token_ids, params)
        req = Request(request_id, prompt_token_ids, params, self.model_config.eos_token_ids)
        self.requests[request_id] = req
        self.scheduler.add(req)

    def abort_request(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None:
            req.finish("abort")
            self.scheduler.finish(req)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        scheduled = self.scheduler.schedule()
        if not scheduled:
            return []
        self.num_steps += 1
        batch = scheduled.num_scheduled_tokens
        block_ids = {r.request_id: self.block_manager.block_ids(r.request_id) for r in batch}
        logits = self.runner.execute(batch, block_ids)
        to_sample = []
        for req, num_new in batch.items():
            self.prompt_tokens += max(0, min(req.num_computed_tokens + num_new, req.num_prompt_tokens)
                                      - req.num_computed_tokens)
            req.num_computed_tokens += num_new
            self.block_manager.cache_full_blocks(req)
            if req.num_computed_tokens == req.num_tokens:
                to_sample.append(req)
        token_ids, logprobs = self.sampler(logits, to_sample)
        outputs = []
        for req, token_id, logprob in zip(to_sample, token_ids, logprobs):
            req.append_token(token_id)
            self.generation_tokens += 1
            outputs.append(self._output(req, [logprob] if logprob else None))
            if req.is_finished:
                self.scheduler.finish(req)
                del self.requests[req.request_id]
        return outputs

    def _output(self, req: Request, logprobs) -> RequestOutput:
        new = req.output_token_ids[req.num_emitted_tokens:]
        req.num_emitted_tokens += len(new)
        return RequestOutput(
            request_id=req.request_id, new_token_ids=new, finished=req.is_finished,
            finish_reason=req.finish_reason, num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens, num_cached_tokens=req.num_cached_tokens,
            new_logprobs=logprobs)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_requests_running=len(self.scheduler.running),
            num_requests_waiting=len(self.scheduler.waiting),
            num_blocks_total=bm.num_blocks, num_blocks_used=bm.num_used_blocks,
            kv_cache_usage=bm.usage, prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits, num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens=self.prompt_tokens, generation_tokens=self.generation_tokens,
            num_steps=self.num_steps)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
                 ) -> list[list[int]]:
        """Offline convenience: run prompts to completion, return their output token ids."""
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"offline-{next(self._offline_ids)}" for _ in prompts]
        for rid, prompt, p in zip(ids, prompts, params_list):
            self.add_request(rid, prompt, p)
        results: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_unfinished_requests():
            for out in self.step():
                results[out.request_id] += out.new_token_ids
        return [results[rid] for rid in ids]
