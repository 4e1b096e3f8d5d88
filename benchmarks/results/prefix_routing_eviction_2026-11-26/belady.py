"""Toy: partition routing (sys % 2), pools of P blocks; eviction LRU-tail-first vs Belady (oracle)."""
import heapq, random, sys, bisect
from collections import OrderedDict, defaultdict

def events_of(seed, sessions=48, rate=2.0, nsys=8, syslen=768, turns=3, q=64, a=32, think=2.0, lat=0.4):
    rng = random.Random(seed)
    ev = []; t = 0.0; sess = []
    for s in range(sessions):
        sess.append(rng.randrange(nsys)); heapq.heappush(ev, (t, s, 0)); t += rng.expovariate(rate)
    out = []
    while ev:
        now, s, turn = heapq.heappop(ev)
        ntok = syslen + turn * (q + a) + q
        nblocks = ntok // 16
        blocks = [("s", sess[s], b) if b * 16 < syslen else ("c", s, b) for b in range(nblocks)]
        allb = blocks + [("c", s, b) for b in range(nblocks, (ntok + a) // 16)]
        out.append((now, sess[s] % 2, blocks, allb))
        if turn + 1 < turns:
            heapq.heappush(ev, (now + lat + rng.expovariate(1 / think), s, turn + 1))
    return out

def run(P, policy, seed, **kw):
    evs = events_of(seed, **kw)
    uses = defaultdict(list)
    for i, (now, r, blocks, allb) in enumerate(evs):
        for b in blocks: uses[b].append(i)
    pools = [OrderedDict() for _ in range(2)]
    hits = queries = 0
    for i, (now, r, blocks, allb) in enumerate(evs):
        pool = pools[r]
        n = 0
        for b in blocks:
            if b in pool: n += 1
            else: break
        hits += n; queries += len(blocks)
        for b in reversed(allb):
            pool[b] = 1; pool.move_to_end(b)
        while len(pool) > P:
            if policy == "lru":
                pool.popitem(last=False)
            else:
                def nxt(b):
                    u = uses[b]; j = bisect.bisect_right(u, i)
                    return u[j] if j < len(u) else 10**9
                victim = max((b for b in pool if b not in set(allb)), key=nxt)
                del pool[victim]
    return hits / queries

if __name__ == "__main__":
    for P in [int(x) for x in sys.argv[1:]] or [208, 256]:
        for pol in ("lru", "belady"):
            print(P, pol, round(sum(run(P, pol, s) for s in range(8)) / 8, 3))
        print("inf", round(sum(run(10**6, "lru", s) for s in range(8)) / 8, 3))
