"""The synchronous engine: add a request, abort it, step. One engine per target replica."""

from __future__ import annotations

import itertools
import time

import torch

from app.config import EngineConfig
from app.engine.beam_searches import BeamSearches
from app.engine.block_manager import BlockManager
from app.engine.engine_stats import EngineStats
from app.engine.guided_rows import plan_guided_drafts
from app.engine.model_runner import ModelRunner, StepLogits
from app.engine.request import Request
from app.engine.request_limits import RequestLimits
from app.engine.scheduler import Scheduler
from app.engine.selection.draw import compile_draws
from app.engine.selection.layout import RowLayout
from app.engine.selection.prompt_logprobs import score_prompt_rows
from app.engine.selection.selector import Chosen, Selection, Selector
from app.engine.spec.proposal import Proposer, build_proposer
from app.engine.spec.schedule import SpeculationSchedule
from app.engine.spec.speculator import SpecStats, Speculator
from app.engine.step_in_flight import StepInFlight
from app.guided.vocabulary import GuidedVocabulary, build_guided_vocabulary
from app.models.config import ModelConfig
from app.models.generation_config import GenerationDefaults
from app.outputs import RequestOutput, RequestRejected
from app.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, config: EngineConfig, proposer: Proposer | None = None):
        self.config = config
        self.model_config = ModelConfig.from_dir(config.model)
        self.max_model_len = self.model_config.max_model_len(config.max_model_len)
        schedule = SpeculationSchedule.of_engine(config) if config.speculative_method else None
        # A step verifying k drafts runs 1 + k tokens per sequence.
        verifying = schedule.multi_token_steps(1, config.max_num_seqs) if schedule else None
        self.runner = ModelRunner(config, self.model_config, self.max_model_len, verifying)
        self.block_manager = BlockManager(self.runner.num_blocks, config.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.scheduling_policy)
        self.limits = RequestLimits(self.max_model_len, config.block_size, self.block_manager.num_blocks,
                                    self.model_config.vocab_size, config.scheduling_policy == "priority")
        self.selector = Selector(config.seed)
        if self.runner.device.type == "cuda":
            compile_draws(self.model_config.vocab_size, self.runner.device)
        self.speculator: Speculator | None = None
        self._tokenizer = None
        self._guided_vocabulary: GuidedVocabulary | None = None
        proposer = proposer or build_proposer(config)
        if schedule is not None and proposer is not None:
            self.speculator = Speculator(proposer, schedule, self.max_model_len, self.model_config.vocab_size,
                                         config.seed, config.adaptive_speculation, config.prompt_lookup_first,
                                         config.lookup_recent_output_tokens)
        self.requests: dict[str, Request] = {}
        self.beam_searches = BeamSearches(self.model_config, self.scheduler, self.block_manager, self._release)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_steps = 0
        self.overlap_scheduling = (config.overlap_scheduling if config.overlap_scheduling is not None
                                   else self.runner.device.type == "cuda")
        self.in_flight: StepInFlight | None = None
        self._offline_ids = itertools.count()

    # -- requests --------------------------------------------------------------------------
    def validate(self, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Refuse, before anything is queued, a request that could never be served."""
        self.limits.check(prompt_token_ids, params)

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    guide=None) -> None:
        """`guide`: a GuidedDecoder (app/guided/guide.py) the output must follow, or None."""
        if request_id in self.requests or request_id in self.beam_searches:
            raise RequestRejected(f"request id {request_id!r} is already in use")
        self.validate(prompt_token_ids, params)
        if params.beam_search:
            if guide is not None:
                raise RequestRejected("beam search cannot follow an output format")
            self.beam_searches.start(request_id, prompt_token_ids, params)
            return
        req = Request(request_id, prompt_token_ids, params, self.model_config.eos_token_ids)
        req.guide = guide
        self.requests[request_id] = req
        self.scheduler.add(req)

    def abort_request(self, request_id: str) -> None:
        self.beam_searches.abort(request_id)
        req = self.requests.pop(request_id, None)
        if req is not None:
            req.finish("abort")
            self._release(req)

    @property
    def request_ids(self) -> list[str]:
        """The callers' ids of every unfinished request."""
        return list(self.requests) + list(self.beam_searches)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished() or self.in_flight is not None

    # -- the step --------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """schedule -> execute -> select -> update.

        With overlapped scheduling, a step whose requests are all plain (no drafts, grammar,
        beams or penalties) is left running on the device: the next call schedules and launches
        the step after it first, feeding it the tokens where they are, and only then waits for
        the step in flight and updates from it. The host's work then runs beside the device's.
        So a call returns the outputs of the step before the one it launches. With speculation,
        the steps whose k is 0 run so too; a step that drafts first waits for the tokens in
        flight, which its drafts continue."""
        started = time.perf_counter()
        ahead, self.in_flight = self.in_flight, None
        held = self._advance_ahead(ahead) if ahead is not None else set()
        outputs, k = [], None
        if ahead is not None and self.speculator is not None:
            k = self.speculator.choose_k(self.scheduler.running, len(self.scheduler.waiting))
            if k > 0 or self.speculator.drafts_predictions(self.scheduler.running, len(self.scheduler.waiting)):
                outputs, ahead, held = self._finish_ahead(ahead), None, set()
        scheduled = self._schedule(held, k)
        launched = self._launch(scheduled.num_scheduled_tokens, ahead) if scheduled else None
        outputs += self._finish_ahead(ahead) if ahead is not None else []
        if launched is None:
            return outputs
        decode_only = self.speculator is not None and all(req.is_decoding for req in launched.batch)
        if self.overlap_scheduling and launched.plain:
            self.in_flight = launched
            if decode_only and ahead is not None:  # a steady overlapped call lasts one step
                self.speculator.record_step(time.perf_counter() - started)
            return outputs
        outputs += self._update(launched.batch, launched.layout, self._to_host(launched))
        if decode_only:  # the steps adaptive speculation compares
            self.speculator.record_step(time.perf_counter() - started)
        return outputs

    def _launch(self, batch: dict[Request, int], ahead: StepInFlight | None) -> StepInFlight:
        """Execute and select; the choices stay on the device, their copy to the host started."""
        if copies := self.block_manager.take_pending_copies():
            self.runner.copy_blocks(copies)
        device_inputs = ahead.device_inputs(batch) if ahead is not None else None
        out, layout, prompt_rows = self.runner.execute_with_layout(
            batch, self.block_manager.tables, device_inputs, self.selector.unseeded_key(self.num_steps))
        logits = out.logits
        if prompt_rows is not None:
            num_sampled = logits.shape[0] - len(prompt_rows.rows)
            score_prompt_rows(logits[num_sampled:], prompt_rows)
            logits = logits[:num_sampled]
        return StepInFlight(batch, layout, self._select_on_device(logits, layout, out))

    def _advance_ahead(self, flight: StepInFlight) -> set[Request]:
        """Count the step in flight as computed, and reserve each sampled request's token, so
        the next step can be scheduled now. Returns the requests that token will finish (their
        max_tokens): the next step leaves them out."""
        for req, num_new in flight.batch.items():
            if not req.is_finished:
                self._count_computed(req, num_new)
        held = set()
        for req in flight.layout.requests if flight.layout is not None else ():
            if req.is_finished:  # aborted meanwhile
                continue
            if req.num_output_tokens + 1 >= req.params.max_tokens:
                held.add(req)
            else:
                req.reserve_token()
        return held

    def _finish_ahead(self, flight: StepInFlight) -> list[RequestOutput]:
        """Wait for the step in flight's tokens and put them where their places were kept."""
        if flight.layout is None:
            return []
        outputs = []
        for req, chosen in zip(flight.layout.requests, self._to_host(flight)):
            if req.is_finished:  # aborted while in flight: its rows are dropped
                continue
            token = chosen.token_ids[0]
            if req.has_pending_token:
                req.fill_pending_token(token)
                self.generation_tokens += 1
            else:
                self._append(req, [token])
            outputs.append(self._emit(req, chosen.logprobs))
        return outputs

    def _schedule(self, hold: set[Request] = frozenset(), k: int | None = None):
        """Drafts (proposed, up to k each when the caller chose it, then kept inside any
        grammar, or forced by it), then the batch."""
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running, len(self.scheduler.waiting), k)
        if any(r.guide is not None for r in self.scheduler.running):
            plan_guided_drafts(self.scheduler.running, self.tokenizer, self.max_model_len,
                               self.config.enable_jump_forward)
        scheduled = self.scheduler.schedule(hold)
        if scheduled:
            self.num_steps += 1
            if self.speculator is not None:
                self.speculator.send_ahead(scheduled.num_scheduled_tokens, len(self.scheduler.waiting))
        return scheduled

    def _select_on_device(self, logits: torch.Tensor, layout: RowLayout | None,
                          out: StepLogits) -> Selection | None:
        if layout is None:
            return None
        jump_forward = self.config.enable_jump_forward and bool(layout.guided)
        return self.selector.on_device(logits, layout, self.num_steps, self.tokenizer if jump_forward else None,
                                       out.argmax, out.chosen)

    def _to_host(self, flight: StepInFlight) -> list[Chosen]:
        return [] if flight.layout is None else self.selector.to_host(flight.selection, flight.layout)

    def _count_computed(self, req: Request, num_new: int) -> None:
        self.prompt_tokens += max(0, min(req.num_computed_tokens + num_new, req.num_prompt_tokens)
                                  - req.num_computed_tokens)
        req.num_computed_tokens += num_new
        if req.num_computed_tokens < req.num_tokens:  # a prompt chunk: nothing sampled
            self.block_manager.cache_full_blocks(req)

    def _update(self, batch: dict[Request, int], layout: RowLayout | None,
                chosen: list[Chosen]) -> list[RequestOutput]:
        """Move every request's computed count on; keep what each sampled request chose."""
        for req, num_new in batch.items():
            self._count_computed(req, num_new)
        if layout is None:
            return []
        outputs = []
        for req, c in zip(layout.requests, chosen):
            if req.beam_search is not None:
                self.beam_searches.report(req, c)
                continue
            if req.spec_token_ids and not req.spec_forced and self.speculator is not None:
                self.speculator.record_verified(len(req.spec_token_ids), c.num_accepted, req.spec_from_prediction)
            outputs.append(self._apply_verified(req, c))
        return outputs + self.beam_searches.advance_ready()

    @property
    def tokenizer(self):
        """The checkpoint's tokenizer, and transformers, loaded on first use (guided requests)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer
            self._tokenizer = AutoTokenizer.from_pretrained(self.config.model)
        return self._tokenizer

    @property
    def guided_vocabulary(self) -> GuidedVocabulary:
        """The vocabulary output formats are compiled over, built from `tokenizer` on first use
        (the core loop's first output format), so the process loads the tokenizer once."""
        if self._guided_vocabulary is None:
            self._guided_vocabulary = build_guided_vocabulary(self.tokenizer, markup_tokens=self.config.markup_tokens)
        return self._guided_vocabulary

    def _append(self, req: Request, token_ids: list[int]) -> int:
        """Append tokens up to the first that finishes the request; return how many."""
        count = 0
        for token_id in token_ids:
            req.append_token(token_id)
            count += 1
            if req.is_finished:
                break
        self.generation_tokens += count
        return count

    def _apply_verified(self, req: Request, chosen: Chosen) -> RequestOutput:
        """Keep the verified tokens. The KV of the known tokens and the accepted drafts is
        valid; rejected drafts' slots are overwritten by later steps (the blocks stay)."""
        num_known = req.num_tokens
        if req.spec_token_ids:
            req.set_spec([])
        count = self._append(req, chosen.token_ids)
        req.num_computed_tokens = min(num_known + chosen.num_accepted, req.num_tokens)
        return self._emit(req, chosen.logprobs[:count] if chosen.logprobs is not None else None)

    def _emit(self, req: Request, logprobs: list | None) -> RequestOutput:
        """After a request's new tokens: offer the blocks they filled to the prefix cache, give
        its output, and release it if they finished it. (A request preempted meanwhile has no
        computed tokens, so it offers nothing.)"""
        self.block_manager.cache_full_blocks(req)
        out = self._output(req, logprobs)
        if req.is_finished:
            self._release(req)
        return out

    def _release(self, req: Request) -> None:
        self.scheduler.finish(req)
        self.requests.pop(req.request_id, None)
        if self.speculator is not None:
            self.speculator.forget(req)

    def _output(self, req: Request, logprobs) -> RequestOutput:
        new = req.all_token_ids[req.num_prompt_tokens + req.num_emitted_tokens:]
        first = req.num_emitted_tokens == 0
        req.num_emitted_tokens += len(new)
        prediction, accepted, rejected = req.params.prediction_token_ids, 0, 0
        if prediction and self.speculator is not None:  # without speculation a prediction is not read
            accepted = self.speculator.predictions.num_matched(req.request_id, prediction, req.all_token_ids,
                                                               req.num_prompt_tokens)
            rejected = max(0, len(prediction) - accepted)
        return RequestOutput(
            request_id=req.request_id, new_token_ids=new, finished=req.is_finished,
            finish_reason=req.finish_reason, num_prompt_tokens=req.num_prompt_tokens,
            num_output_tokens=req.num_output_tokens, num_cached_tokens=req.num_cached_tokens,
            new_logprobs=logprobs, prompt_logprobs=req.prompt_logprobs if first else None,
            stop_token_id=req.stop_token_id, num_accepted_prediction_tokens=accepted,
            num_rejected_prediction_tokens=rejected)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_requests_running=len(self.scheduler.running),
            num_requests_waiting=len(self.scheduler.waiting),
            num_blocks_total=bm.num_blocks, num_blocks_used=bm.num_used_blocks,
            kv_cache_usage=bm.usage, prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits, num_preemptions=self.scheduler.num_preemptions,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens + self.beam_searches.num_generated_tokens,
            num_steps=self.num_steps,
            spec=self.speculator.stats_snapshot() if self.speculator else SpecStats())

    def default_sampling_params(self) -> SamplingParams:
        """vLLM's `LLM.get_default_sampling_params`: the checkpoint's generation_config.json
        settings (app/models/generation_config.py) where it has them, SamplingParams' otherwise."""
        defaults = GenerationDefaults.from_dir(self.config.model)
        length = {} if defaults.max_tokens is None else {"max_tokens": defaults.max_tokens}
        return SamplingParams(**defaults.sampling, **length)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[list[int]]:
        """Offline convenience: run prompts to completion, return their output token ids.
        No params: the model's defaults (`default_sampling_params`), as vLLM's `LLM.generate`."""
        params = self.default_sampling_params() if params is None else params
        params_list = params if isinstance(params, list) else [params] * len(prompts)
        ids = [f"offline-{next(self._offline_ids)}" for _ in prompts]
        for rid, prompt, p in zip(ids, prompts, params_list):
            self.add_request(rid, prompt, p)
        results: dict[str, list[int]] = {rid: [] for rid in ids}
        while self.has_unfinished_requests():
            for out in self.step():
                results[out.request_id] += out.new_token_ids
        return [results[rid] for rid in ids]
