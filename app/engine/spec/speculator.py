"""Speculation inside one engine step: propose before scheduling, verify after the forward.

`propose` gives each decoding request up to k draft tokens (k from the batch-size schedule, or
chosen within it by what speculation measurably saves; cut so a request never passes
max_tokens or the context limit). A draft model first reads whatever of the sequence it was
not given before. Reading the prompt is what speculation always costs once; reading the output
decoded while k was 0 (a busy engine) is extra, and at the tail of a burst, with a few tokens
left, it costs more than the drafts save, while every other row of the step waits (on 2 CPU
cores, 12 ms a proposal at the tail of a concurrency-8 burst, benchmarks/RESULTS.md). So a
request drafts only while fewer of its output tokens are unread by the draft model than are
left to generate; n-gram lookup reads nothing and always drafts. The scheduler then runs the
last known token and the drafts as one 1 + k query, and selection (app/engine/selection/)
verifies them: the accepted drafts plus one token sampled by the target (corrected or bonus),
so every step emits at least one token and greedy output equals plain decoding.

When the proposer can answer while the step runs (a draft channel), `send_ahead` asks for the
next step's drafts of greedy rows during the forward, and `propose` takes those whose guess
held (app/engine/spec/drafts_ahead.py).

With a draft model and `prompt_lookup_first`, a request whose last LOOKUP_FIRST_MIN_MATCH tokens
occurred earlier in its own tokens (or, failing that, in the recent outputs of other requests,
app/engine/spec/recent_outputs.py) takes what followed them as its drafts, and the draft model
is not asked for it (nor sent ahead for it). The lookup costs microseconds; a draft call costs a round
trip to the draft replica. On copying work (summaries, code edits, document QA) most steps then
make no call at all. Matches of 3+ tokens are accepted about as often as the draft model's
drafts on the default pair; shorter ones much less (benchmarks/RESULTS.md).

A request with a predicted output (OpenAI's `prediction`) takes its drafts from the prediction
wherever the output follows it (app/engine/spec/prediction_lookup.py), before any other proposer,
and up to the schedule's k whatever k adaptive speculation chose: the client's own guess is kept
far more often than a proposer's, and adaptive speculation weighs the other rows (their drafts'
acceptance, and the steps no prediction drafted beyond its k).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field

import torch

from app.config import MAX_PROMPT_LOOKUP
from app.engine.request import Request
from app.engine.spec.adaptive import AdaptiveSpeculation
from app.engine.spec.drafts_ahead import DraftsAhead
from app.engine.spec.ngram_proposer import NgramProposer
from app.engine.spec.prediction_lookup import PredictionLookup
from app.engine.spec.proposal import DraftInput, Proposer
from app.engine.spec.recent_outputs import RecentOutputs
from app.engine.spec.schedule import SpeculationSchedule

logger = logging.getLogger(__name__)

LOOKUP_FIRST_MIN_MATCH = 3  # the shortest match of the last tokens that proposes instead of the draft model


@dataclass
class SpecStats:
    """Cumulative counters, with vLLM's meanings: a draft is one request's proposal in one step."""
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    num_proposer_failures: int = 0  # steps whose proposer call failed (decoded without drafts)
    steps_by_k: dict[int, int] = field(default_factory=dict)  # steps with decoding requests, by k (0: no row drafted)
    num_proposals: int = 0  # calls of the proposer
    proposal_seconds: float = 0.0  # spent waiting for them (in the served app: the DraftModel round trip)
    num_drafts_sent_ahead: int = 0  # requests whose next step's drafts were asked for during a step
    num_drafts_ahead_used: int = 0  # of those, the ones whose next step took them (no proposal wait)
    num_drafts_looked_up: int = 0  # drafts found in the request's own tokens instead of asking the draft model
    num_drafts_from_recent_outputs: int = 0  # n-gram drafts found in other requests' recent outputs
    num_drafts_from_prediction: int = 0  # drafts taken from the request's predicted output

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_position) < num_draft_tokens:
            self.accepted_per_position += [0] * (num_draft_tokens - len(self.accepted_per_position))
        for pos in range(num_accepted):
            self.accepted_per_position[pos] += 1

    def snapshot(self) -> "SpecStats":
        """A copy another thread may read while the engine goes on counting."""
        return dataclasses.replace(self, accepted_per_position=list(self.accepted_per_position),
                                   steps_by_k=dict(self.steps_by_k))

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per speculative step: accepted drafts plus the target's own token."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


def _draft_seed(req: Request, generator: torch.Generator) -> int:
    """A seeded request's draft stream depends only on its seed and length (batch-independent)."""
    if req.params.seed is not None:
        return hash((req.params.seed, req.num_tokens)) & (2**62 - 1)
    return int(torch.randint(2**62, (1,), generator=generator))


class Speculator:
    """`schedule`: k by batch size, or, when `adaptive`, the bounds within which an
    `AdaptiveSpeculation` picks k from what steps cost and drafts earn (app/engine/spec/adaptive.py)."""

    def __init__(self, proposer: Proposer, schedule: SpeculationSchedule, max_model_len: int,
                 vocab_width: int, seed: int = 0, adaptive: bool = False, prompt_lookup_first: bool = False,
                 lookup_recent_output_tokens: int = 0):
        self.proposer = proposer
        self.schedule = schedule
        self.max_model_len = max_model_len
        self.vocab_width = vocab_width
        self.generator = torch.Generator().manual_seed(seed + 1)
        self.stats = SpecStats()
        self._step: tuple[int, int, float] | None = None  # (batch size, k, share of rows drafted) of this step
        send_ahead = getattr(proposer, "send_ahead", None)
        self.ahead = DraftsAhead(send_ahead, max_model_len) if send_ahead is not None else None
        self.reads_sequences = getattr(proposer, "reads_sequences", True)  # n-gram lookup does not
        self.adaptive = AdaptiveSpeculation(schedule, catches_up=self.reads_sequences) if adaptive else None
        self.lookup = (NgramProposer(schedule.max_k, LOOKUP_FIRST_MIN_MATCH, MAX_PROMPT_LOOKUP,
                                     lookup_recent_output_tokens)
                       if prompt_lookup_first and self.reads_sequences else None)
        # The n-gram lookup's table of recent outputs, whichever lookup runs (the proposer's or the
        # lookup before the draft model); `forget` feeds it.
        self.recent_outputs: RecentOutputs | None = getattr(self.lookup or proposer, "recent_outputs", None)
        self.predictions = PredictionLookup()
        self._looked_up: set[Request] = set()  # this step's rows whose drafts a lookup found

    def stats_snapshot(self) -> SpecStats:
        """The counters, as another thread may read them while the engine goes on counting."""
        stats = self.stats.snapshot()
        if self.recent_outputs is not None:
            stats.num_drafts_from_recent_outputs = self.recent_outputs.num_found
        return stats

    def choose_k(self, running: list[Request], num_waiting: int = 0) -> int:
        """This step's k. It follows the load: the running requests and those waiting to start,
        so a burst of arrivals turns speculation down before its prompts are read, instead of
        holding each of their prefill steps on a draft call for the few requests already
        decoding. With adaptive speculation, each call is one of its steps."""
        if not any(r.is_decoding for r in running):
            return 0
        batch_size = len(running) + num_waiting
        return self.adaptive.k_for(batch_size) if self.adaptive is not None else self.schedule.k_for(batch_size)

    def propose(self, running: list[Request], num_waiting: int = 0, k: int | None = None) -> None:
        """Drafts for this step's decoding requests, up to `k` each (None: `choose_k`'s)."""
        batch_size = len(running) + num_waiting
        num_decoding = sum(1 for r in running if r.is_decoding)
        decoding = num_decoding > 0
        if k is None:
            k = self.choose_k(running, num_waiting)
        if not decoding:  # nothing to draft for, and not one of adaptive speculation's steps
            k, self._step = 0, None
        # A seeded sampled request drafts the same k in every step, alone or in any batch, so its
        # tokens depend on its seed alone, never on the timings the adaptive k follows.
        seeded_k = self.schedule.k_for(1) if self.adaptive is not None else k
        prediction_k = self.schedule.k_for(batch_size) if decoding else 0
        ready = self._take_ahead() if decoding else {}
        candidates, inputs, from_prediction, predicted_beyond_k = [], [], 0, False
        self._looked_up.clear()
        for req in running:
            req.set_spec([])
            seeded = req.params.seed is not None and not req.params.greedy
            k_wanted = seeded_k if seeded else k
            k_predicted = (k_wanted if seeded else prediction_k) if req.params.prediction_token_ids else 0
            if (k_wanted == 0 and k_predicted == 0) or not req.is_decoding or not req.params.speculative_decoding:
                continue
            if k_predicted:
                k_predicted = self._room(req, k_predicted)
                found = k_predicted > 0 and self.predictions.propose_for(
                    req.request_id, req.params.prediction_token_ids, req.all_token_ids, req.num_prompt_tokens,
                    k_predicted)
                if found:
                    req.set_spec(found, from_prediction=True)
                    self._looked_up.add(req)
                    from_prediction += 1
                    predicted_beyond_k |= len(found) > k
                    continue
            k_req = self._room(req, k_wanted)
            if k_req <= 0:
                continue
            if self.lookup is not None:
                found = self.lookup.propose_for(req.request_id, req.all_token_ids, k_req)
                if found:
                    req.set_spec(found)
                    self._looked_up.add(req)
                    continue
            if req in ready:
                req.set_spec(ready[req][:k_req])
                self.stats.num_drafts_ahead_used += 1
                continue
            p = req.params
            seeded = p.seed is not None and not p.greedy  # its drafts may not depend on timing
            if self.reads_sequences and not seeded and self._catch_up_outweighs_drafting(req):
                continue
            candidates.append(req)
            seed = 0 if p.greedy else _draft_seed(req, self.generator)  # greedy drafts draw nothing
            inputs.append(DraftInput(req.request_id, req.all_token_ids, k_req, p.greedy, p.temperature,
                                     p.top_p, p.top_k, p.min_p, seed, p.cache_salt))
        self.stats.num_drafts_looked_up += len(self._looked_up) - from_prediction
        self.stats.num_drafts_from_prediction += from_prediction
        if inputs:
            self._ask_proposer(candidates, inputs)
        if decoding:  # a step no row got drafts in (none asked, or none found) is the plain step it is
            drafted = sum(1 for req in running if req.spec_token_ids)
            ran_k = prediction_k if predicted_beyond_k else k if drafted else 0
            # A step that drafted a prediction beyond k says nothing of what k costs.
            self._step = None if predicted_beyond_k else (batch_size, ran_k, drafted / num_decoding)
            self.stats.steps_by_k[ran_k] = self.stats.steps_by_k.get(ran_k, 0) + 1

    def drafts_predictions(self, running: list[Request], num_waiting: int = 0) -> bool:
        """Whether this step may draft from a prediction whatever its k (a decoding request has
        one, and the schedule drafts at this load)."""
        return self.schedule.k_for(len(running) + num_waiting) > 0 and any(
            r.params.prediction_token_ids and r.is_decoding and r.params.speculative_decoding for r in running)

    def _room(self, req: Request, k: int) -> int:
        """k, cut so the request never passes max_tokens or the context."""
        return min(k, req.params.max_tokens - req.num_output_tokens - 1, self.max_model_len - req.num_tokens)

    def _ask_proposer(self, candidates: list[Request], inputs: list[DraftInput]) -> None:
        started = time.perf_counter()
        try:
            proposals = self.proposer.propose_batch(inputs)
        except Exception:  # noqa: BLE001 - a failed proposer means no speculation this step
            self.stats.num_proposer_failures += 1
            logger.exception("proposer failed; decoding this step without speculation")
            return
        finally:
            self.stats.num_proposals += 1
            self.stats.proposal_seconds += time.perf_counter() - started
        for req, inp, prop in zip(candidates, inputs, proposals):
            req.num_tokens_sent_to_draft = len(inp.token_ids)
            token_ids = prop.token_ids[:inp.k]
            probs = None
            if prop.probs is not None and not inp.greedy and token_ids:
                probs = prop.probs.decode(self.vocab_width)[:len(token_ids)]
            req.set_spec(token_ids, probs)

    @staticmethod
    def _catch_up_outweighs_drafting(req: Request) -> bool:
        """The draft model would read more output it missed than there are tokens left to draft."""
        unread_output = req.num_tokens - max(req.num_tokens_sent_to_draft, req.num_prompt_tokens)
        return unread_output > req.params.max_tokens - req.num_output_tokens

    def send_ahead(self, batch: dict[Request, int], num_waiting: int = 0) -> None:
        """The step is scheduled (`batch`: requests and their token counts; `num_waiting` still
        wait to start): ask for the next step's drafts now, so the draft replica works while
        the target verifies. k is this step's, or in a step that only reads prompts, the one
        the next step would most likely get."""
        if self.ahead is None:
            return
        if self._step is not None:
            k = self._step[1]
        else:
            load = len(batch) + num_waiting
            k = self.adaptive.likely_k(load) if self.adaptive is not None else self.schedule.k_for(load)
        if k > 0:
            batch = {req: n for req, n in batch.items() if req not in self._looked_up}
            self.stats.num_drafts_sent_ahead += self.ahead.send(batch, k)

    def _take_ahead(self) -> dict[Request, list[int]]:
        """The drafts sent ahead that hold now; the wait for them counts as proposal time."""
        if self.ahead is None:
            return {}
        started = time.perf_counter()
        ready = self.ahead.take()
        self.stats.proposal_seconds += time.perf_counter() - started
        return ready

    def record_verified(self, num_draft_tokens: int, num_accepted: int, from_prediction: bool = False) -> None:
        """One request's drafts of this step were verified: `num_accepted` of them kept."""
        self.stats.record(num_draft_tokens, num_accepted)
        if self.adaptive is not None and not from_prediction:
            self.adaptive.record_draft(num_draft_tokens, num_accepted)

    def record_step(self, seconds: float) -> None:
        """The step `propose` began took `seconds`, proposal included, and computed no prompt."""
        if self.adaptive is not None and self._step is not None:
            batch_size, k, drafted_share = self._step
            self.adaptive.record_step(batch_size, k, seconds, drafted_share)
        self._step = None

    def forget(self, req: Request) -> None:
        """The request left the engine: what was kept for it goes, and its output joins the
        recent outputs n-gram lookup searches (when the proposer keeps them)."""
        if self.recent_outputs is not None and req.num_output_tokens:
            self.recent_outputs.add(req.all_token_ids, req.num_prompt_tokens)
        if self.lookup is not None:
            self.lookup.forget(req.request_id)
        self.predictions.forget(req.request_id)
        forget = getattr(self.proposer, "forget", None)
        if forget is not None:
            forget(req.request_id)
