"""Block manager: reference counts, prefix reuse, LRU eviction, nothing leaked."""

from app.engine.block_manager import BlockManager
from app.engine.request import Request
from app.sampling_params import SamplingParams


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4))


def admit(bm: BlockManager, req: Request) -> int:
    prefix = bm.find_cached_prefix(req)
    assert bm.allocate(req, req.num_tokens, prefix)
    req.num_computed_tokens = req.num_tokens
    bm.cache_full_blocks(req)
    return len(prefix)


def test_allocate_and_free_counts():
    bm = BlockManager(num_blocks=8, block_size=4)
    req = make_request("a", list(range(10)))
    assert admit(bm, req) == 0
    assert bm.num_used_blocks == 3 and bm.usage == 3 / 8
    bm.free(req)
    assert bm.num_used_blocks == 0
    assert all(b.ref_count == 0 for b in bm.blocks)


def test_allocation_fails_without_side_effects():
    bm = BlockManager(num_blocks=2, block_size=4)
    req = make_request("a", list(range(9)))  # needs 3 blocks
    assert not bm.allocate(req, 9)
    assert bm.num_free_blocks == 2 and bm.block_ids("a") == []


def test_prefix_reuse_shares_blocks_and_counts_hits():
    bm = BlockManager(num_blocks=16, block_size=4)
    first = make_request("a", list(range(12)))
    admit(bm, first)
    second = make_request("b", list(range(8)) + [99, 98, 97])
    assert admit(bm, second) == 2
    assert bm.block_ids("a")[:2] == bm.block_ids("b")[:2]
    assert bm.blocks[bm.block_ids("a")[0]].ref_count == 2
    bm.record_prefix_lookup(second.num_tokens, 8)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (11, 8)
    bm.free(first)
    bm.free(second)
    assert bm.num_used_blocks == 0  # cached blocks stay cached but count as free


def test_last_token_is_never_served_from_cache():
    bm = BlockManager(num_blocks=16, block_size=4)
    admit(bm, make_request("a", list(range(8))))
    again = make_request("b", list(range(8)))
    assert len(bm.find_cached_prefix(again)) == 1  # 7 of 8 tokens may hit: one full block


def test_cached_free_blocks_are_reused_after_eviction_and_uncached_go_first():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_request("a", list(range(8)))
    admit(bm, a)
    bm.free(a)  # two cached blocks at the back of the free queue
    b = make_request("b", [50, 51])  # takes an uncached block, not a cached one
    admit(bm, b)
    assert len(bm.cached_blocks) == 2
    c = make_request("c", list(range(100, 112)))  # needs 3: one uncached + two evicted
    admit(bm, c)
    assert bm.find_cached_prefix(make_request("d", list(range(8)) + [1])) == []
    bm.free(b)
    bm.free(c)
    assert bm.num_used_blocks == 0


def test_chain_hash_depends_on_parent():
    bm = BlockManager(num_blocks=16, block_size=4)
    admit(bm, make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 0]))
    # Same second block, different first block: no hit at all.
    assert bm.find_cached_prefix(make_request("b", [9, 9, 9, 9, 5, 6, 7, 8, 0])) == []


def test_step_tables_hold_each_requests_blocks_through_growth_forks_and_frees():
    """The rows a step gathers its block table from follow the pool: more requests than the
    first rows, longer ones than the first columns, a fork copied on its first write, frees."""
    bm = BlockManager(num_blocks=10000, block_size=2)
    reqs = [make_request(f"r{i}", list(range(i * 1000, i * 1000 + 3 + (i % 40) * 4))) for i in range(120)]
    for req in reqs:
        admit(bm, req)
    child = make_request("child", reqs[79].all_token_ids)
    bm.fork(reqs[79], child)
    child.num_computed_tokens = reqs[79].num_computed_tokens - 1  # its next write lands in a shared block
    assert bm.allocate(child, child.num_tokens + 1)
    assert bm.take_pending_copies()
    for req in reqs[::4]:
        bm.free(req)
    live = [r for r in reqs if r.request_id in bm.request_blocks] + [child]
    ids = [[b.block_id for b in bm.request_blocks[r.request_id]] for r in live]
    width = max(map(len, ids))
    assert width > 64 and len(live) > 64
    expected = [row + [0] * (width - len(row)) for row in ids]
    assert bm.tables.gather([r.request_id for r in live]).tolist() == expected
    assert [bm.block_ids(r.request_id) for r in live] == ids
    assert bm.block_ids(reqs[0].request_id) == []


def test_a_cache_salt_shares_blocks_only_within_the_salt():
    """vLLM's `cache_salt`: a tenant's requests reuse each other's blocks, never another's (nor
    unsalted ones), so a cache hit (a faster first token) tells nothing about what others sent."""
    bm = BlockManager(num_blocks=32, block_size=4)

    def salted(rid: str, salt: str | None) -> Request:
        return Request(rid, list(range(13)), SamplingParams(max_tokens=4, cache_salt=salt))

    assert admit(bm, salted("plain", None)) == 0
    assert admit(bm, salted("a1", "tenant-a")) == 0  # the unsalted blocks are not its
    assert admit(bm, salted("b1", "tenant-b")) == 0
    assert admit(bm, salted("a2", "tenant-a")) == 3
    assert bm.block_ids("a2")[:3] == bm.block_ids("a1")[:3] != bm.block_ids("b1")[:3]
    assert admit(bm, salted("plain2", None)) == 3 and bm.block_ids("plain2")[:3] == bm.block_ids("plain")[:3]


def test_the_router_hashes_a_salted_prompt_as_the_pool_does():
    from app.engine.block_manager import block_hashes, root_hash

    bm = BlockManager(num_blocks=8, block_size=4)
    req = Request("a", list(range(9)), SamplingParams(max_tokens=4, cache_salt="s"))
    admit(bm, req)
    assert list(bm.cached_blocks) == block_hashes(list(range(9)), 4, root_hash("s"))
    assert root_hash("s") != root_hash("t") and root_hash(None) == 0
