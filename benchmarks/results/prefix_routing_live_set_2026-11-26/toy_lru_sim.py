"""Toy simulation (issue 20, 2026-11-26), not the benchmark: two LRU block pools fed the
sessions workload of benchmarks/prefix_routing.py (token counts only, a turn taking `lat` s),
routed blind (random, as Serve's default is for this workload) or by longest cached prefix
("affinity"; "balanced" places a prefix no replica holds on the replica that was sent fewer
new blocks in the last WINDOW s). TAIL_FIRST = True evicts a request's tail before its head,
as app/engine/block_manager.py does. Used to see how far the hit-rate ratio can go when the
live prefix set is between one pool and two. Run: python toy_lru_sim.py '{"Ps": [208, 256]}'

Toy simulation: two LRU block pools, blind (random / shorter queue ~ random) vs affinity routing,
on the sessions workload. Tokens in blocks of 16. Estimates hit rates and live-set size."""
import heapq, random, sys
from collections import OrderedDict
import itertools
WINDOW = 10.0
TAIL_FIRST = True

def run(P=256, sessions=48, rate=2.0, nsys=8, syslen=768, turns=3, q=64, a=32, think=2.0, lat=0.4,
        router="blind", seed=0, reps=1):
    rng = random.Random(seed)
    sys_ids = [[("s", i, b) for b in range(syslen // 16)] for i in range(nsys)]
    events = []  # (time, seq, session, turn)
    t = 0.0
    sess = []
    for s in range(sessions):
        sys_i = rng.randrange(nsys)
        sess.append(sys_i)
        heapq.heappush(events, (t, s, 0))
        t += rng.expovariate(rate)
    pools = [OrderedDict() for _ in range(2)]
    owner = {}  # session -> replica (affinity's knowledge)
    hits = queries = 0
    refs = {}
    cnt = itertools.count()
    sent = []
    while events:
        now, s, turn = heapq.heappop(events)
        # prompt tokens: sys + turn*(q+a) + q
        ntok = syslen + turn * (q + a) + q
        nblocks = ntok // 16
        blocks = []
        for b in range(nblocks):
            pos = b * 16
            if pos < syslen:
                blocks.append(("s", sess[s], b))
            else:
                blocks.append(("c", s, b))
        def held(r):
            n = 0
            for blk in blocks:
                if blk in pools[r]: n += 1
                else: break
            return n
        if router == "blind":
            r = rng.randrange(2)
        else:
            h = [held(0), held(1)]
            if h[0] == h[1]:
                if router == "balanced":
                    recent = [sum(1 for (tt, rr, nb) in sent if rr == x and tt > now - WINDOW) for x in range(2)]
                    recent = [sum(nb for (tt, rr, nb) in sent if rr == x and tt > now - WINDOW) for x in range(2)]
                    r = 0 if recent[0] < recent[1] else 1 if recent[1] < recent[0] else rng.randrange(2)
                else:
                    r = rng.randrange(2)
            else:
                r = 0 if h[0] > h[1] else 1
        hn = held(r)
        sent.append((now, r, nblocks - hn))
        for blk in blocks: refs.setdefault(blk, []).append(now)
        for blk in blocks[:0]: pass
        hits += hn * 16; queries += ntok
        pool = pools[r]
        # add whole prompt+answer blocks
        total_blocks = (ntok + a) // 16
        allb = blocks + [("c", s, b) for b in range(nblocks, total_blocks)]
        for blk in (reversed(allb) if TAIL_FIRST else allb):
            pool[blk] = 1; pool.move_to_end(blk)
        while len(pool) > P:
            pool.popitem(last=False)
        if turn + 1 < turns:
            heapq.heappush(events, (now + lat + rng.expovariate(1 / think) if think else now + lat, s, turn + 1))
    if router == 'live':
        pass
    # live set: blocks referenced before and again after t, averaged over arrival times
    spans = [(min(v), max(v)) for v in refs.values() if len(v) > 1]
    times = sorted({x for v in refs.values() for x in v})
    ts = times[len(times)//5: 4*len(times)//5]
    live = max(sum(1 for a, b in spans if a <= t < b) for t in ts) if ts else 0
    meanlive = sum(sum(1 for a, b in spans if a <= t < b) for t in ts) / max(1, len(ts))
    run.live = (meanlive, live)
    return hits / queries

if __name__ == "__main__":
    import json
    kw = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    seeds = range(8)
    for P in kw.pop("Ps", [208, 256]):
        rate = {r: sum(run(P=P, router=r, seed=s, **kw) for s in seeds) / len(seeds)
                for r in ("blind", "affinity", "balanced")}
        ceiling = sum(run(P=10**6, router="affinity", seed=s, **kw) for s in seeds) / len(seeds)
        print(f"live prefixes mean {run.live[0]:.0f} blocks ({run.live[0] / P:.2f} pools of {P}); hit rate "
              f"blind {rate['blind']:.3f} affinity {rate['affinity']:.3f} balanced {rate['balanced']:.3f} "
              f"(ratios {rate['affinity'] / rate['blind']:.2f}, {rate['balanced'] / rate['blind']:.2f}); "
              f"ceiling {ceiling:.3f} ({ceiling / rate['blind']:.2f}x blind)")
