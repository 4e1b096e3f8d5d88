"""The paged KV pool: a fixed set of blocks, a block table per request, reference counts,
prefix caching (full blocks hashed by parent hash + token ids, LRU eviction), and forks that
share a request's blocks (beam search), copied on the first write into a shared block."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Callable

from app.engine.block_tables import BlockTables
from app.engine.request import Request


class KVBlock:
    __slots__ = ("block_id", "ref_count", "block_hash")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_count = 0
        self.block_hash: int | None = None


ROOT_BLOCK_HASH = 0  # the parent of a request's first block


def chain_hash(parent_hash: int, token_ids: list[int]) -> int:
    """A block's hash: its parent's and its tokens'. Tuples of ints hash the same in every
    process (unlike `None`, whose hash is its address before Python 3.12), so a router can
    compute a prompt's hashes and find them in a replica's report (deployments/prefix_routing.py)."""
    return hash((parent_hash, tuple(token_ids)))


def root_hash(cache_salt: str | None) -> int:
    """The parent of a request's first block: one for all unsalted requests, one per salt
    (vLLM's `cache_salt`). The salt enters as the ints of its digest, which hash the same in
    every process (a `str`'s hash does not)."""
    if cache_salt is None:
        return ROOT_BLOCK_HASH
    return chain_hash(ROOT_BLOCK_HASH, list(hashlib.blake2b(cache_salt.encode(), digest_size=16).digest()))


def block_hashes(token_ids: list[int], block_size: int, parent: int = ROOT_BLOCK_HASH) -> list[int]:
    """The chain hashes of the full blocks of `token_ids` (following the block hashed `parent`),
    as the pool computes them."""
    hashes = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = chain_hash(parent, token_ids[start:start + block_size])
        hashes.append(parent)
    return hashes


class BlockManager:
    """Free blocks wait in `free_blocks`, front first out. Blocks that hold nothing reusable
    go to the front; cached blocks go to the back, so the least recently freed cached block
    is the first one evicted."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_blocks: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached_blocks: dict[int, KVBlock] = {}
        self.request_blocks: dict[str, list[KVBlock]] = {}
        self.tables = BlockTables()  # the same ids, as rows a step gathers its table from
        self.request_hashes: dict[str, list[int]] = {}
        self.num_published: dict[str, int] = {}  # of a request's leading blocks, those already offered to the cache
        self.prefix_cache_queries = 0  # tokens looked up at admission
        self.prefix_cache_hits = 0  # of those, tokens found cached
        self.pending_copies: list[tuple[int, int]] = []  # (source, destination) blocks to copy before the next forward

    # -- figures ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_ids(self, request_id: str) -> list[int]:
        return self.tables.ids(request_id)

    # -- prefix cache ----------------------------------------------------------------------
    def _hashes(self, req: Request, num_full_blocks: int) -> list[int]:
        """The request's block hashes, at least its first `num_full_blocks` (maybe more)."""
        hashes = self.request_hashes.setdefault(req.request_id, [])
        if len(hashes) < num_full_blocks:
            bs = self.block_size
            hashes += block_hashes(req.all_token_ids[len(hashes) * bs:num_full_blocks * bs], bs,
                                   hashes[-1] if hashes else root_hash(req.params.cache_salt))
        return hashes

    def find_cached_prefix(self, req: Request) -> list[KVBlock]:
        """Cached blocks that hold the request's leading tokens. The last token is always left
        to compute, since its logits are needed."""
        if not self.enable_prefix_caching:
            return []
        hits = []
        num_full = (req.num_tokens - 1) // self.block_size
        for h in self._hashes(req, num_full)[:num_full]:
            block = self.cached_blocks.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def cached_block_hashes(self, limit: int) -> list[int]:
        """The hashes of the cached blocks, at most `limit`, the most recently published last."""
        hashes = list(self.cached_blocks)
        return hashes[-limit:] if len(hashes) > limit else hashes

    def record_prefix_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_cache_queries += num_tokens
        self.prefix_cache_hits += num_hit_tokens

    def cache_full_blocks(self, req: Request) -> None:
        """Publish the blocks that computed tokens have filled since the last call, so later
        requests can reuse them. A block whose hash another block already holds is not
        offered again."""
        if not self.enable_prefix_caching:
            return
        num_full = req.num_computed_tokens // self.block_size
        done = self.num_published.get(req.request_id, 0)
        if num_full <= done:
            return
        blocks = self.request_blocks[req.request_id]
        hashes = self._hashes(req, num_full)
        for i in range(done, num_full):
            block, h = blocks[i], hashes[i]
            if block.block_hash is None and h not in self.cached_blocks:
                block.block_hash = h
                self.cached_blocks[h] = block
        self.num_published[req.request_id] = num_full

    # -- allocation ------------------------------------------------------------------------
    def allocate(self, req: Request, num_tokens: int, cached_prefix: list[KVBlock] = ()) -> bool:
        """Make the request hold blocks for its first `num_tokens` tokens. `cached_prefix` is
        given only at admission. Returns False, changing nothing, when the pool is too short."""
        blocks = self.request_blocks.get(req.request_id, [])
        write = req.num_computed_tokens // self.block_size  # where this step's first new token goes
        copy_on_write = write < len(blocks) and blocks[write].ref_count > 1
        num_new = self.blocks_needed(num_tokens) - len(blocks) - len(cached_prefix)
        if num_new <= 0 and blocks and not copy_on_write and not cached_prefix:
            return True  # what it holds covers the tokens: most decode steps
        reclaimed = sum(1 for b in cached_prefix if b.ref_count == 0)
        if num_new + copy_on_write > self.num_free_blocks - reclaimed:
            return False
        if copy_on_write:
            shared = blocks[write]
            blocks[write] = self._take_free_block()
            shared.ref_count -= 1
            self.pending_copies.append((shared.block_id, blocks[write].block_id))
            self.tables.replace(req.request_id, write, blocks[write].block_id)
            self.num_published[req.request_id] = min(self.num_published.get(req.request_id, 0), write)
        for block in cached_prefix:
            if block.ref_count == 0:
                del self.free_blocks[block.block_id]
            block.ref_count += 1
        added = list(cached_prefix) + [self._take_free_block() for _ in range(max(num_new, 0))]
        self.request_blocks.setdefault(req.request_id, []).extend(added)
        self.tables.extend(req.request_id, [b.block_id for b in added])
        return True

    def admit(self, req: Request, num_tokens: Callable[[int], int], use_cache: bool = True) -> int | None:
        """Give a new request its blocks, reusing the cached blocks of its leading tokens:
        `num_tokens(num_cached)` is how many of its tokens to hold. Its cached tokens count as
        computed. Returns how many there are, or None (nothing changed) when the pool is short."""
        prefix = self.find_cached_prefix(req) if use_cache else []
        num_cached = len(prefix) * self.block_size
        if not self.allocate(req, num_tokens(num_cached), prefix):
            return None
        self.record_prefix_lookup(req.num_tokens, num_cached)
        req.num_computed_tokens = num_cached
        return num_cached

    def _take_free_block(self) -> KVBlock:
        _, block = self.free_blocks.popitem(last=False)
        if block.block_hash is not None:
            del self.cached_blocks[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block

    def fork(self, parent: Request, child: Request) -> None:
        """Let `child` (same leading tokens) hold the blocks of `parent`'s computed tokens; the
        block its next token is written into is copied first (`allocate`)."""
        blocks = self.request_blocks.get(parent.request_id, [])[:self.blocks_needed(parent.num_computed_tokens)]
        for block in blocks:
            block.ref_count += 1
        self.request_blocks[child.request_id] = list(blocks)
        self.tables.extend(child.request_id, [b.block_id for b in blocks])
        self.request_hashes[child.request_id] = list(self.request_hashes.get(parent.request_id, []))

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def free(self, req: Request) -> None:
        """Release the request's blocks; its own tail blocks are freed first so they are
        evicted before the shared prefix."""
        for block in reversed(self.request_blocks.pop(req.request_id, [])):
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_blocks[block.block_id] = block
                if block.block_hash is None:
                    self.free_blocks.move_to_end(block.block_id, last=False)
        self.request_hashes.pop(req.request_id, None)
        self.num_published.pop(req.request_id, None)
        self.tables.release(req.request_id)
