"""Which target replica should take a request: the one whose KV cache holds the longest prefix
of its prompt, unless that one is loaded and another is not.

Each TargetModel replica reports `RoutingStats` (Serve calls its `record_routing_stats` every
`request_routing_stats_period_s` and hands the result to every router): the chain hashes of
its cached full blocks, exactly as its block manager computes them
(app/engine/block_manager.py: `block_hashes`), bounded to the newest `MAX_REPORTED_BLOCKS`,
and the engine's own load. The router (deployments/prefix_router.py) keeps one `ReplicaView`
per replica and ranks them with `rank_replicas`. The reports are the truth; between two of
them the router also counts the requests it sent to each replica that have not ended, and
remembers the prefixes it sent (for a few report periods), so that a burst sharing a new
prefix is not spread before any report shows it.

The rule, per request:
1. Leave out the replicas that would queue it (requests their engine's last step could not
   admit, every sequence slot taken, or the KV pool full) while any replica is idle. Requests
   on their way into an engine count as its load but not as a queue: counted as one, they
   turned a conversation's turns away from the replica holding its history (up to 4 of 144
   requests a round on the issue-20 workload; benchmarks/RESULTS.md, 2026-11-27). Under load,
   when no replica is idle, the cache decides: spreading a prefix over replicas that are all
   busy recomputes it on each.
2. Of the rest, take the one with the longest cached prefix; ties go to the least loaded.
   A prompt no replica holds any of goes where the fewest blocks new to their replica were
   sent in the last `NEW_BLOCKS_WINDOW_S` (then the least loaded): new prefixes spread the
   replicas' cache contents evenly, rather than by the moment's queue lengths. On the
   issue-20 workload, 6 rounds alternated: hit rate 0.759 against 0.730, higher in 4 rounds
   of 6 (benchmarks/RESULTS.md, 2026-11-26).
3. Unless its load is more than `max_load_imbalance` requests above the least loaded one's:
   then take that one (the cache saves prefill, but not a queue that long).
The others follow, least loaded first, in case the first refuses.

No Ray imports: the rule is tested on its own (tests/test_prefix_routing.py).
"""

from __future__ import annotations

import dataclasses
import random
from array import array
from collections import deque
from dataclasses import dataclass, field

MAX_REPORTED_BLOCKS = 4096  # hashes per report: 32 KiB on the wire, 64 Ki tokens at block 16
KV_FULL = 0.95  # KV usage from which a replica would queue (or preempt) a new request
DEFAULT_MAX_LOAD_IMBALANCE = 8
NEW_BLOCKS_WINDOW_S = 10.0  # how far back the blocks sent to a replica that it did not hold count


@dataclass(frozen=True)
class RoutingStats:
    """What a TargetModel replica reports to routers, as of `reported_at` (its clock)."""
    block_size: int
    # The cached full blocks' hashes, newest last, at most MAX_REPORTED_BLOCKS, packed as 64-bit
    # ints: Serve's controller compares, hashes (as str) and broadcasts every report to every
    # router, and bytes cost a fraction of a list of ints there (`pack_hashes`).
    packed_block_hashes: bytes
    num_requests_running: int
    num_requests_waiting: int  # accepted and not running: those on their way into the engine too
    # Of those, the ones the engine's last step could not admit: a queue. A request still on
    # its way in is admitted by the next step if there is room, so it does not make one.
    num_requests_queued: int
    max_num_seqs: int
    kv_cache_usage: float
    reported_at: float

    @property
    def block_hashes(self) -> list[int]:
        return array("q", self.packed_block_hashes).tolist()

    def to_dict(self) -> dict:
        """Serve's routing stats are a dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, stats: dict) -> "RoutingStats | None":
        """None for an empty dict (no report yet) or one of another shape."""
        try:
            return cls(**stats)
        except TypeError:
            return None


def pack_hashes(hashes: list[int]) -> bytes:
    return array("q", hashes).tobytes()


@dataclass
class ReplicaView:
    """One router's picture of one replica: its last report, plus what the router sent it since."""
    replica_id: str
    stats: RoutingStats | None = None
    cached: frozenset[int] = frozenset()
    sent_prefixes: dict[int, float] = field(default_factory=dict)  # block hash -> when sent
    in_flight: dict[str, float] = field(default_factory=dict)  # request id -> when sent, until a report counts it
    in_report: set[str] = field(default_factory=set)  # sent before a report (so counted there), not ended
    ended_since_report: int = 0  # of `in_report`, those that ended after the last report
    # (when, blocks of the prompt it did not hold) of the requests sent lately, and their sum
    new_blocks_sent: deque[tuple[float, int]] = field(default_factory=deque)
    recent_new_blocks: int = 0

    def take_report(self, stats: RoutingStats) -> bool:
        """A newer report replaces the last (True), the requests it already counts leaving `in_flight`;
        an older or the same one changes nothing (False)."""
        if self.stats is not None and stats.reported_at <= self.stats.reported_at:
            return False
        self.stats = stats
        self.cached = frozenset(stats.block_hashes)
        counted = [r for r, t in self.in_flight.items() if t <= stats.reported_at]
        for r in counted:
            del self.in_flight[r]
        self.in_report.update(counted)
        self.ended_since_report = 0
        return True

    def record_sent(self, request_id: str, hashes: list[int], now: float, remember_s: float) -> None:
        new_blocks = len(hashes) - self.matched_blocks(hashes)
        self.new_blocks_sent.append((now, new_blocks))
        self.recent_new_blocks += new_blocks
        self.in_flight[request_id] = now
        for h in hashes:
            self.sent_prefixes[h] = now
        stale = [h for h, t in self.sent_prefixes.items() if now - t > remember_s]
        for h in stale:
            del self.sent_prefixes[h]

    def forget_sends_before(self, cutoff: float) -> None:
        while self.new_blocks_sent and self.new_blocks_sent[0][0] < cutoff:
            self.recent_new_blocks -= self.new_blocks_sent.popleft()[1]

    def record_ended(self, request_id: str) -> None:
        """A request the last report counted leaves the report's figures until the next one: a
        report taken while a turn of a conversation waited must not turn the next turn away."""
        if self.in_flight.pop(request_id, None) is None and request_id in self.in_report:
            self.in_report.remove(request_id)
            self.ended_since_report += 1

    def record_withdrawn(self, request_id: str) -> None:
        """A request counted as sent here went elsewhere (Serve retried it): it never ran here."""
        self.in_flight.pop(request_id, None)
        self.in_report.discard(request_id)

    def matched_blocks(self, hashes: list[int]) -> int:
        """How many leading blocks of a prompt with these hashes this replica holds (or was sent)."""
        n = 0
        for h in hashes:
            if h not in self.cached and h not in self.sent_prefixes:
                break
            n += 1
        return n

    @property
    def held(self) -> int:
        """Requests of the last report the engine still holds, as far as this router saw them end."""
        if self.stats is None:
            return 0
        return max(0, self.stats.num_requests_running + self.stats.num_requests_waiting - self.ended_since_report)

    @property
    def load(self) -> int:
        """Requests the engine held at its report and still holds, plus those sent to it since that are open."""
        return self.held + len(self.in_flight)

    @property
    def would_queue(self) -> bool:
        s = self.stats
        if s is None:
            return False
        still_queued = s.num_requests_queued - self.ended_since_report  # each end admits a queued one
        return still_queued > 0 or s.kv_cache_usage >= KV_FULL or self.load >= s.max_num_seqs


@dataclass(frozen=True)
class RoutingDecision:
    ranked: list[ReplicaView]  # the first is the choice; the rest, least loaded first, if it refuses
    reason: str  # "prefix": the longest cached prefix; "load": a longer one was passed over for load;
    # "no_prefix": no replica holds any of it (least loaded)
    matched_blocks: int  # of the chosen replica


def rank_replicas(hashes: list[int], views: list[ReplicaView],
                  max_load_imbalance: int = DEFAULT_MAX_LOAD_IMBALANCE) -> RoutingDecision:
    if not views:
        return RoutingDecision([], "no_prefix", 0)
    shuffled = random.sample(views, len(views))  # equal candidates are taken at random
    matched = {id(v): v.matched_blocks(hashes) for v in shuffled}
    # Passing over replicas that would queue only helps while another admits: an idle replica
    # can still report a full KV pool (its requests ended after the report), and then every
    # replica may be one that would queue.
    admitting = shuffled
    if any(v.load == 0 for v in shuffled):
        admitting = [v for v in shuffled if not v.would_queue] or shuffled
    by_load = sorted(shuffled, key=lambda v: (v.would_queue, v.load))
    least_loaded = min(admitting, key=lambda v: v.load)
    best = max(admitting, key=lambda v: (matched[id(v)], -v.load))
    longest = max(matched.values())
    if matched[id(best)] == 0:
        choice, reason = least_loaded, "no_prefix" if longest == 0 else "load"
        if longest == 0:  # a prefix new to every replica: where the least new content went lately
            roomiest = min(admitting, key=lambda v: (v.recent_new_blocks, v.load))
            if roomiest.load - least_loaded.load <= max_load_imbalance:
                choice = roomiest
    elif best.load - least_loaded.load > max_load_imbalance:
        choice, reason = least_loaded, "load"
    else:
        choice, reason = best, "prefix" if matched[id(best)] == longest else "load"
    return RoutingDecision([choice] + [v for v in by_load if v is not choice], reason, matched[id(choice)])
