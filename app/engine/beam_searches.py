"""The engine's beam searches in progress. Each live beam runs as a greedy request of its own
that reports its likeliest next tokens (its logprobs) instead of choosing one. `BeamSearch`
(beam_search.py) decides which beams live on; this carries the decision out on the engine's
requests: a beam's first continuation goes on in its request, each further one forks it
(sharing its KV blocks), and a beam with none is released."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Callable, Iterator

from app.engine.beam_search import BeamSearch
from app.engine.block_manager import BlockManager
from app.engine.request import Request, RequestStatus, ending_eos_token_ids, stop_token_ids
from app.engine.scheduler import Scheduler
from app.engine.selection.selector import Chosen
from app.models.config import ModelConfig
from app.outputs import RequestOutput, RequestRejected
from app.sampling_params import SamplingParams


class BeamSearches:
    def __init__(self, model_config: ModelConfig, scheduler: Scheduler, block_manager: BlockManager,
                 release: Callable[[Request], None]):
        """`release`: the engine's way to drop a finished or aborted request."""
        self.model_config = model_config
        self.scheduler = scheduler
        self.block_manager = block_manager
        self._release = release
        self._by_id: dict[str, BeamSearch] = {}  # by the caller's request id
        self._reported: dict[str, BeamSearch] = {}  # in `_update`: the searches a beam reported to
        self._beam_ids = itertools.count()
        self.num_generated_tokens = 0

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_id

    def __getitem__(self, request_id: str) -> BeamSearch:
        return self._by_id[request_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_id)

    def __len__(self) -> int:
        return len(self._by_id)

    def start(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        eos = self.model_config.eos_token_ids
        search = BeamSearch(request_id, params, stop_token_ids(params, eos), ending_eos_token_ids(params, eos))
        if search.num_candidates > self.model_config.vocab_size:
            raise RequestRejected(f"{params.beam_width} beams need {search.num_candidates} candidates per step, "
                                  f"more than the vocabulary's {self.model_config.vocab_size} tokens")
        beam_params = dataclasses.replace(params, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, logprobs=None,
                                          prompt_logprobs=None, speculative_decoding=False, beam_width=1)
        beam_params.logprobs = search.num_candidates  # may exceed the API's 20: set past the check
        root = self._beam_request(search, prompt_token_ids, beam_params)
        search.start(root)
        self._by_id[request_id] = search
        self.scheduler.add(root)

    def abort(self, request_id: str) -> None:
        search = self._by_id.pop(request_id, None)
        for beam in search.live if search is not None else ():
            beam.handle.finish("abort")
            self._release(beam.handle)

    def report(self, beam: Request, chosen: Chosen) -> None:
        """A beam's step: its candidates go to its search; the blocks it filled to the cache."""
        beam.beam_search.report(beam, chosen.logprobs[0].top)
        self.block_manager.cache_full_blocks(beam)
        self._reported[beam.beam_search.request_id] = beam.beam_search

    def advance_ready(self) -> list[RequestOutput]:
        """Advance each search this step reported to whose every live beam has reported; the
        outputs of the searches that ended."""
        ready = [search for search in self._reported.values() if search.ready]
        self._reported.clear()
        outputs = []
        for search in ready:
            output = self._advance(search)
            if output is not None:
                outputs.append(output)
        return outputs

    def _beam_request(self, search: BeamSearch, prompt_token_ids: list[int], params: SamplingParams) -> Request:
        req = Request(f"{search.request_id}#beam-{next(self._beam_ids)}", prompt_token_ids, params)
        req.beam_search = search
        return req

    def _advance(self, search: BeamSearch) -> RequestOutput | None:
        parents = [beam.handle for beam in search.live]
        continuations = search.advance()
        handles, kept = [], set()
        for c in continuations:
            if c.parent in kept:
                handles.append(self._fork(c.parent))
            else:
                kept.add(c.parent)
                handles.append(c.parent)
        for parent in parents:
            if parent not in kept:
                parent.finish("stop")
                self._release(parent)
        for beam, c in zip(handles, continuations):
            beam.all_token_ids.append(c.token_id)
        self.num_generated_tokens += len(continuations)
        search.bind(handles)
        if not search.done:
            return None
        del self._by_id[search.request_id]
        best = search.best(search.width)
        return RequestOutput(
            request_id=search.request_id, new_token_ids=[], finished=True, finish_reason=best[0].finish_reason,
            num_prompt_tokens=len(parents[0].prompt_token_ids), num_output_tokens=len(best[0].token_ids),
            num_cached_tokens=parents[0].num_cached_tokens, beams=best)

    def _fork(self, parent: Request) -> Request:
        child = self._beam_request(parent.beam_search, parent.prompt_token_ids, parent.params)
        child.all_token_ids = list(parent.all_token_ids)
        child.num_cached_tokens = parent.num_cached_tokens
        if parent.status == RequestStatus.RUNNING:
            self.block_manager.fork(parent, child)
            child.num_computed_tokens = parent.num_computed_tokens
        self.scheduler.add_fork(parent, child)
        return child
