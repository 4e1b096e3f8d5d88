"""Toy (issue 20, 2026-11-26), not the benchmark: the sessions workload of toy_lru_sim.py
(events from belady.py), two pools of P blocks, routed blind (random) or by longest cached
prefix with new prefixes placed where the fewest new blocks went ("balanced"), under several
eviction policies: LRU (tail first, as the engine), Belady's oracle (evict the block used
furthest in the future), LFU by prefix hits (ties LRU), hit counts capped, blocks never hit
first. Run: python policies.py 208 (208 blocks: the size that reproduces the measured rates)."""
import random, sys, bisect
from collections import OrderedDict, defaultdict
from belady import events_of

def run(P, router, policy, seed, window=10.0, **kw):
    rng = random.Random(seed + 100)
    evs = events_of(seed, **kw)
    uses = defaultdict(list)
    for i, e in enumerate(evs):
        for b in e[2]: uses[b].append(i)
    pools = [OrderedDict() for _ in range(2)]
    counts = [defaultdict(int) for _ in range(2)]
    sent = []
    hits = queries = 0
    for i, (now, part, blocks, allb) in enumerate(evs):
        def held(r):
            n = 0
            for b in blocks:
                if b in pools[r]: n += 1
                else: break
            return n
        if router == "blind": r = rng.randrange(2)
        elif router == "partition": r = part
        else:
            h = [held(0), held(1)]
            if h[0] != h[1]: r = 0 if h[0] > h[1] else 1
            else:
                rec = [sum(nb for (tt, rr, nb) in sent if rr == x and tt > now - window) for x in range(2)]
                r = 0 if rec[0] < rec[1] else 1 if rec[1] < rec[0] else rng.randrange(2)
        pool, cnt = pools[r], counts[r]
        n = held(r)
        sent.append((now, r, len(blocks) - n))
        hits += n; queries += len(blocks)
        for b in blocks[:n]: cnt[b] += 1
        for b in reversed(allb):
            pool[b] = 1; pool.move_to_end(b)
        pinned = set(allb)
        while len(pool) > P:
            if policy == "lru":
                pool.popitem(last=False)
                continue
            cands = [b for b in pool if b not in pinned]
            if policy == "belady":
                def nxt(b):
                    u = uses[b]; j = bisect.bisect_right(u, i)
                    return u[j] if j < len(u) else 10**9
                victim = max(cands, key=nxt)
            elif policy == "lfu":
                victim = min(enumerate(cands), key=lambda jb: (cnt[jb[1]], jb[0]))[1]
            elif policy.startswith("lfu_cap"):  # counts capped, so a hot block that went cold is evicted after the cold ones it ties with
                cap = int(policy[7:])
                victim = min(enumerate(cands), key=lambda jb: (min(cnt[jb[1]], cap), jb[0]))[1]
            elif policy == "hit_first":  # evict blocks never hit first, LRU within
                victim = min(enumerate(cands), key=lambda jb: (cnt[jb[1]] > 0, jb[0]))[1]
            del pool[victim]; cnt.pop(victim, None)
    return hits / queries

P = int(sys.argv[1]) if len(sys.argv) > 1 else 208
for pol in sys.argv[2:] or ["lru", "belady", "lfu", "hit_first", "lfu_cap2", "lfu_cap4"]:
    rates = {rt: sum(run(P, rt, pol, s) for s in range(8)) / 8 for rt in ("blind", "balanced")}
    print(P, f"{pol:>10}", {k: round(v, 3) for k, v in rates.items()}, "ratio", round(rates["balanced"] / rates["blind"], 3), flush=True)
