"""Adaptive speculation: k per batch size follows what speculation saves on this machine, this
model pair and this workload, up to the configured schedule's k (so where the schedule says 0,
from 4 running requests on a CPU, nothing is tried: no exploration costs a busy engine).

Whether drafts pay depends on things no static schedule knows: the step's cost at this batch
size on this device, what a proposal costs (in the served app, a DraftModel round trip) and how
often the target accepts the drafts of this workload. So the engine measures them:
- the wall time of its decode-only steps, proposal included, per request, per batch-size bucket
  (powers of two) and per k;
- the acceptance per draft position (the chance that position j is accepted once the ones
  before it were), from every verified draft, shared across k and batch sizes.
A request with k drafts expects 1 + a1 + a1·a2 + ... + a1···ak tokens. Not every request of a
step gets drafts (n-gram lookup finds no match for most rows of a workload that does not
copy), yet the whole step pays for verifying, so a step with k drafts expects per request
1 + c·(that - 1), c the share of its rows that got drafts (the bucket's recent drafting
steps). The k with the most expected tokens per second of step wins (by a margin, so noise
does not flip it). A k's step time is the fastest of its recent steps: on a shared host,
steps are slowed by everything else, and a try of a rarely run k also meets cold kernels.
Other ks are still tried now and then, a few steps in a row (with a draft model the first is
not timed: it catches up there on every token since its last call, which steady speculation
never pays), and more rarely the longer the best one holds, so the choice follows a change of
workload. k=0 is always a candidate, so speculation that does not pay turns itself off.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from app.engine.spec.schedule import SpeculationSchedule

logger = logging.getLogger(__name__)

ACCEPTANCE_DECAY = 0.995  # per verified draft: the workload's recent drafts weigh most
PRIOR_ACCEPTANCE = 0.5  # before any draft at a position is verified, worth one draft
RECENT_STEPS = 8  # step times kept per k; the fastest of them is the estimate
SWITCH_MARGIN = 0.05  # another k takes over only when it is this much better: noise does not flip k
MIN_SAMPLES = 2  # timings of every candidate k before the best is trusted
FIRST_EXPLORE_EVERY = 8  # steps of a bucket between tries of another k, after the best changed
MAX_EXPLORE_EVERY = 128  # ... doubling each time a try confirms the best
TRY_STEPS = 3  # a k other than the best runs this many steps in a row when tried
DRAFTED_SHARE_DECAY = 0.95  # per drafting step: the share of rows with drafts follows the workload


class AcceptanceEstimate:
    """Decayed counts of drafts that reached each position and of those accepted there."""

    def __init__(self, max_k: int):
        self.reached = [0.0] * max_k
        self.accepted = [0.0] * max_k

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        for j in range(len(self.reached)):
            self.reached[j] *= ACCEPTANCE_DECAY
            self.accepted[j] *= ACCEPTANCE_DECAY
        for j in range(min(num_accepted + 1, num_draft_tokens, len(self.reached))):
            self.reached[j] += 1.0
            self.accepted[j] += 1.0 if j < num_accepted else 0.0

    def rate(self, position: int) -> float:
        return (self.accepted[position] + PRIOR_ACCEPTANCE) / (self.reached[position] + 1.0)

    def expected_tokens(self, k: int) -> float:
        """Tokens a request emits from a step with k drafts: the target's own plus the accepted."""
        total, reach = 1.0, 1.0
        for j in range(min(k, len(self.reached))):
            reach *= self.rate(j)
            total += reach
        return total


@dataclass
class BucketTimes:
    """Step times of one batch-size bucket by k, and which k it runs."""
    recent: dict[int, deque[float]] = field(default_factory=dict)  # decode-only steps, per request
    last_tried: dict[int, int] = field(default_factory=dict)  # k -> the bucket's step it last ran
    best: int = 0
    steps: int = 0
    explore_every: int = FIRST_EXPLORE_EVERY
    exploring: bool = False
    trying: int = 0  # the k being tried, for `steps_left` more steps
    steps_left: int = 0
    drafted_rows: float = 1.0  # decayed, over steps with drafts: rows that got drafts ...
    rows: float = 1.0  # ... of the rows decoding (a prior of one row that got them)

    def record(self, k: int, seconds: float) -> None:
        self.recent.setdefault(k, deque(maxlen=RECENT_STEPS)).append(seconds)

    def record_drafted_share(self, share: float) -> None:
        self.drafted_rows = DRAFTED_SHARE_DECAY * self.drafted_rows + share
        self.rows = DRAFTED_SHARE_DECAY * self.rows + 1.0

    def drafted_share(self) -> float:
        """The share of a drafting step's rows that get drafts."""
        return self.drafted_rows / self.rows

    def num_timed(self, k: int) -> int:
        """Recent timed steps with k drafts (at most RECENT_STEPS)."""
        return len(self.recent.get(k, ()))

    def seconds(self, k: int) -> float:
        """What a step with k drafts costs when nothing else gets in its way: the fastest of the
        recent ones. Slower steps were slowed by something else (the host, a kernel compiled
        for a new shape, the draft model catching up) that a mean would carry for long."""
        return min(self.recent[k])


class AdaptiveSpeculation:
    """`k_for(batch_size)` like a schedule, learning from `record_step` and `record_draft`."""

    def __init__(self, bounds: SpeculationSchedule, catches_up: bool = True):
        """catches_up: the proposer reads what it missed on its first call after steps without
        drafts (a draft model does; n-gram lookup has nothing to read), so that step is not timed."""
        self.bounds = bounds
        self.catches_up = catches_up
        self.acceptance = AcceptanceEstimate(bounds.max_k)
        self.buckets: dict[int, BucketTimes] = {}
        self.previous_k = 0  # of the last step timed

    def k_for(self, batch_size: int) -> int:
        bound = self.bounds.k_for(batch_size)
        if bound == 0:
            return 0
        bucket = self.buckets.setdefault(_bucket(batch_size), BucketTimes())
        bucket.steps += 1
        if bucket.steps_left > 0 and bucket.trying <= bound:  # a try goes on
            bucket.steps_left -= 1
            return bucket.trying
        candidates = range(bound + 1)
        untried = [k for k in candidates if bucket.num_timed(k) < MIN_SAMPLES]
        bucket.exploring = bool(untried) or bucket.steps % bucket.explore_every == 0
        if untried:
            k = min(untried, key=bucket.num_timed)
        elif bucket.exploring:  # the candidate tried longest ago, other than the best
            k = min((k for k in candidates if k != bucket.best), key=lambda k: bucket.last_tried.get(k, -1))
        else:
            return min(bucket.best, bound)
        bucket.last_tried[k] = bucket.steps
        bucket.trying, bucket.steps_left = k, TRY_STEPS - 1
        return k

    def likely_k(self, batch_size: int) -> int:
        """The k a step of this size runs when it tries nothing (the bound before any step
        was timed), without counting a step."""
        bound = self.bounds.k_for(batch_size)
        bucket = self.buckets.get(_bucket(batch_size))
        return bound if bucket is None else min(bucket.best, bound)

    def record_draft(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.acceptance.record(num_draft_tokens, num_accepted)

    def record_step(self, batch_size: int, k: int, seconds: float, drafted_share: float = 1.0) -> None:
        """A decode-only step of `batch_size` requests that ran with k drafts took `seconds`
        (not counted when it is the first with drafts after one without and the proposer
        catches up there). A step whose rows got no drafts is a k=0 step, whatever k was asked.
        `drafted_share`: of a step with drafts, the share of its decoding rows that got them."""
        catching_up = self.catches_up and k > 0 and self.previous_k == 0
        self.previous_k = k
        bound = self.bounds.k_for(batch_size)
        bucket = self.buckets.get(_bucket(batch_size))
        if bucket is None or k > bound:
            return
        if k > 0:
            bucket.record_drafted_share(drafted_share)
        if catching_up:
            return
        bucket.record(k, seconds / max(batch_size, 1))  # per request: the bucket holds several sizes
        measured = [c for c in range(bound + 1) if bucket.num_timed(c) >= MIN_SAMPLES]
        if not measured:
            return

        share = bucket.drafted_share()
        rate = {c: (1 + share * (self.acceptance.expected_tokens(c) - 1)) / bucket.seconds(c)
                for c in measured}  # tokens per request per second of step
        best = max(measured, key=rate.__getitem__)
        if bucket.best in rate and rate[best] < (1 + SWITCH_MARGIN) * rate[bucket.best]:
            best = bucket.best
        if bucket.exploring and bucket.steps_left == 0 and len(measured) == bound + 1:  # a try ended
            changed = best != bucket.best
            bucket.explore_every = FIRST_EXPLORE_EVERY if changed else min(2 * bucket.explore_every,
                                                                            MAX_EXPLORE_EVERY)
            bucket.exploring = False
        if best != bucket.best:
            logger.info("adaptive speculation: batch %d-%d now runs k=%d (expected tokens per ms of step "
                        "by k: %s)", 1 << (_bucket(batch_size) - 1), (1 << _bucket(batch_size)) - 1, best,
                        {c: round(r / 1000, 3) for c, r in rate.items()})
        bucket.best = best

    def chosen(self) -> dict[int, int]:
        """The k each bucket (by its smallest batch size) runs now, for logs and tests."""
        return {1 << (b - 1): bucket.best for b, bucket in sorted(self.buckets.items())}


def _bucket(batch_size: int) -> int:
    """1 -> 1, 2-3 -> 2, 4-7 -> 3, ...: powers of two."""
    return max(batch_size, 1).bit_length()
