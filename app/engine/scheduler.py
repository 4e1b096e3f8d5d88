"""Iteration-level scheduler: each step hands out a token budget so that every request's
computed tokens catch up with its known tokens.

Decodes are served first, then prompt chunks, then waiting requests in arrival order; when the
pool runs out the newest running request is preempted and later recomputed. Under the
"priority" policy (vLLM's), waiting requests are taken by (priority, arrival), lower first, and
the running request preempted is the one last in that order. A decode's draft
tokens are scheduled like prompt tokens (their KV slots reserved in the same allocation) and
are the first thing cut when the budget runs short.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass, field

from app.engine.block_manager import BlockManager
from app.engine.request import Request, RequestStatus


@dataclass
class SchedulerOutput:
    # Request -> number of its tokens computed this step, in batch order.
    num_scheduled_tokens: dict[Request, int] = field(default_factory=dict)
    preempted: list[Request] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.num_scheduled_tokens)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "fcfs"):
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.by_priority = policy == "priority"
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self._arrivals = itertools.count()
        self._rank: dict[Request, tuple[int, int]] = {}  # under "priority": (priority, arrival)

    def add(self, req: Request) -> None:
        if not self.by_priority:
            self.waiting.append(req)
            return
        self._queue_by_rank(req)

    def add_fork(self, parent: Request, child: Request) -> None:
        """A beam forked from `parent`: it runs beside it, or, when the parent was preempted,
        waits where a preempted request does. It ranks as its parent."""
        if self.by_priority:
            self._rank[child] = self._rank_of(parent)
        if parent.status == RequestStatus.RUNNING:
            child.status = RequestStatus.RUNNING
            self.running.append(child)
        elif self.by_priority:
            self._queue_by_rank(child)
        else:
            self.waiting.appendleft(child)

    def _rank_of(self, req: Request) -> tuple[int, int]:
        """(priority, arrival), given when first asked."""
        rank = self._rank.get(req)
        if rank is None:
            rank = self._rank[req] = (req.params.priority, next(self._arrivals))
        return rank

    def _queue_by_rank(self, req: Request) -> None:
        self.waiting.insert(bisect.bisect_right(self.waiting, self._rank_of(req), key=self._rank_of), req)

    def _victim(self) -> Request:
        """The running request to preempt when the pool runs out."""
        return max(self.running, key=self._rank_of) if self.by_priority else self.running[-1]

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, req: Request) -> None:
        """Drop a finished or aborted request and release its blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._rank.pop(req, None)
        self.block_manager.free(req)

    def schedule(self, hold: frozenset[Request] | set[Request] = frozenset()) -> SchedulerOutput:
        """`hold`: running requests to leave out of this step (their next token ends them)."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        # Decodes (one token left to compute) before prompt chunks, so long prompts never
        # starve them; each group keeps arrival order.
        order = sorted(self.running, key=lambda r: r.num_tokens - r.num_computed_tokens > 1)
        for req in order:
            if budget == 0:
                break
            if req.status != RequestStatus.RUNNING or req in hold:  # preempted earlier in this loop
                continue
            wanted = req.num_tokens_with_spec - req.num_computed_tokens
            if wanted == 0:  # a beam waiting for the other beams of its search
                continue
            num_new = min(wanted, budget)
            if num_new < wanted:  # drafts go first when the budget runs short
                req.trim_spec(req.num_computed_tokens + num_new - req.num_tokens)
            while not self.block_manager.allocate(req, req.num_computed_tokens + num_new):
                victim = self._victim()
                budget += out.num_scheduled_tokens.pop(victim, 0)
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is req:
                    break
            else:
                out.num_scheduled_tokens[req] = num_new
                budget -= num_new
        if not out.preempted:
            self._admit_waiting(out, budget)
        if not out and self.waiting:
            self._make_room_for_waiting(out, budget)
        return out

    def _make_room_for_waiting(self, out: SchedulerOutput, budget: int) -> None:
        """Nothing could run: every running request is a beam waiting for the rest of its search,
        and what waits (the rest) does not fit beside them. Preempt them, newest first, to the
        back of the queue (what they reported stands) until the queue's head is admitted."""
        while not out and self.running:
            self._preempt(self._victim(), to_back=True)
            self._admit_waiting(out, budget)

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        bm = self.block_manager
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            num_cached = bm.admit(req, lambda cached: cached + min(req.num_tokens - cached, budget),
                                  use_cache=req.prompt_logprobs is None)  # cached blocks have no logits
            if num_cached is None:
                break
            num_new = min(req.num_tokens - num_cached, budget)
            self.waiting.popleft()
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_cached
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            out.num_scheduled_tokens[req] = num_new
            budget -= num_new

    def _preempt(self, req: Request, to_back: bool = False) -> None:
        """Recompute-style preemption: drop the KV, keep the tokens (and RNG state), requeue first."""
        self.running.remove(req)
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.set_spec([])
        req.status = RequestStatus.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        if to_back:
            self.waiting.append(req)
        elif self.by_priority:
            self._queue_by_rank(req)
        else:
            self.waiting.appendleft(req)
