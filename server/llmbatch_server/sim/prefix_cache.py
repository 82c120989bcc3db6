"""The KV cache in blocks, with vLLM's automatic prefix caching.

vLLM stores KV in blocks of ``block_size`` tokens. With prefix caching (on by
default in vLLM V1) every full block of a prompt is named by a hash chained over
the prompt's blocks, so equal prefixes give equal hashes; a new request's
longest run of already-cached blocks is reused and only the rest is prefilled.
The last prompt token is always computed, so at most ``(prompt - 1) //
block_size`` blocks hit. Blocks that running sequences hold are pinned. Free
blocks form one queue, least recently freed first, as vLLM's free block queue
does: a sequence that ends frees its blocks tail first (its output blocks, then
its prompt's cached blocks from the last), cached ones keep their contents and
can still be hit, and a new block is taken from the head of the queue, evicting
what it cached.

A sequence either reserves the blocks for its whole prompt and output when admitted
(the simulator's default) or, as vLLM does, gets its prompt's and then one more as
its output fills each (``grow``; the engine preempts when none is free).
Simplification, documented in docs/simulator.md: only prompt blocks are hashed
(vLLM also caches full output blocks, which helps multi-turn chats).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

BLOCK_SIZE = 16


def block_hashes(
    token_ids: Sequence[int], block_size: int = BLOCK_SIZE, salt: str | None = None
) -> tuple[int, ...]:
    """The chained hashes of ``token_ids``' full blocks (a partial last block has none).

    ``salt`` (vLLM's ``cache_salt``) changes every hash, so requests with
    different salts never share blocks.
    """
    parent = hash(("salt", salt)) if salt else 0
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, *token_ids[start : start + block_size]))
        out.append(parent)
    return tuple(out)


@dataclass(eq=False, slots=True)
class BlockTable:
    """The blocks one admitted sequence holds."""

    hashes: tuple[int, ...]
    #: Hashes of the cached blocks it references, in prompt order.
    cached: list[int] = field(default_factory=list)
    #: Blocks it holds that are not (or not yet) in the cache.
    plain: int = 0
    #: Prompt blocks already looked up or offered to the cache.
    done: int = 0


class _Unhashed:
    """A run of free blocks that hold nothing to reuse (never used, output, or
    partial blocks): one queue entry for all of them keeps freeing cheap."""

    __slots__ = ("count",)

    def __init__(self, count: int) -> None:
        self.count = count


class KVCache:
    """Block accounting for the engine: admission, prefix hits, caching, eviction."""

    def __init__(self, num_blocks: int, block_size: int = BLOCK_SIZE, caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.caching = caching
        self.used = 0  # blocks referenced by at least one sequence
        self._refs: dict[int, int] = {}  # cached block hash -> sequences holding it
        #: Every unreferenced block, least recently freed first: a cached block by
        #: its hash, runs of others as one entry. Holds ``num_blocks - used`` blocks.
        self._free: OrderedDict[int | _Unhashed, None] = OrderedDict({_Unhashed(num_blocks): None})
        #: Prompt tokens looked up and found (vLLM's prefix_cache_queries/hits).
        self.queries = 0
        self.hits = 0
        self.evictions = 0

    @property
    def usage(self) -> float:
        """Fraction of blocks in use (free cached blocks count as free, as in vLLM)."""
        return self.used / self.num_blocks

    @property
    def cached_blocks(self) -> int:
        return len(self._refs)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def admit(
        self, hashes: tuple[int, ...] | None, prompt_tokens: int, kv_tokens: int
    ) -> BlockTable | None:
        """Reserve the blocks of a new sequence, reusing cached prefix blocks.

        ``hashes`` None: the sequence does not use the prefix cache (an
        embedding), so it is neither looked up nor counted in ``queries``.
        Returns its table (``len(table.cached) * block_size`` prompt tokens need
        no prefill), or None when the blocks do not fit now.
        """
        looked_up = self.caching and hashes is not None
        hashes = hashes or ()
        hits = self._hits(hashes, prompt_tokens) if looked_up else []
        revived = sum(1 for h in hits if self._refs[h] == 0)
        new = self.blocks_for(kv_tokens) - len(hits)
        if self.used + revived + new > self.num_blocks:
            return None
        if looked_up:
            self.queries += prompt_tokens
            self.hits += len(hits) * self.block_size
        for h in hits:
            if self._refs[h] == 0:
                del self._free[h]
                self.used += 1
            self._refs[h] += 1
        self._take(new)
        self.used += new
        return BlockTable(hashes=hashes, cached=list(hits), plain=new, done=len(hits))

    def held(self, table: BlockTable) -> int:
        """Tokens the blocks ``table`` holds have room for."""
        return (len(table.cached) + table.plain) * self.block_size

    def grow(self, table: BlockTable, blocks: int = 1) -> bool:
        """Give a running sequence ``blocks`` more (its output filled the last); False,
        changing nothing, when that many are not free."""
        if self.used + blocks > self.num_blocks:
            return False
        self._take(blocks)
        self.used += blocks
        table.plain += blocks
        return True

    def computed(self, table: BlockTable, tokens: int) -> None:
        """The first ``tokens`` prompt tokens are scheduled: cache their full blocks.

        As in vLLM V1, a block is cached once it is allocated for scheduled
        tokens, so a request admitted later in the same step can already hit it.
        """
        if not self.caching:
            return
        upto = min(tokens // self.block_size, len(table.hashes))
        for h in table.hashes[table.done : upto]:
            refs = self._refs.get(h)
            if refs:
                continue  # another sequence cached it first: ours stays a private copy
            if refs == 0:
                # A stale copy (its parent was evicted, so it was not hit): ours
                # replaces it, and its block holds nothing to reuse any more.
                del self._free[h]
                emptied = _Unhashed(1)
                self._free[emptied] = None
                self._free.move_to_end(emptied, last=False)
            self._refs[h] = 1
            table.cached.append(h)
            table.plain -= 1
        table.done = max(table.done, upto)

    def release(self, table: BlockTable) -> None:
        """A sequence ended: unpin its blocks, keeping cached ones until evicted.

        Freed tail first, as vLLM frees a sequence's blocks, so they are also
        reused in that order: its uncached (output) blocks, then its cached
        prompt blocks from the last, its first block going last of all.
        """
        if table.plain:
            self._free[_Unhashed(table.plain)] = None
        self.used -= table.plain
        table.plain = 0
        for h in reversed(table.cached):
            self._refs[h] -= 1
            if self._refs[h] == 0:
                self._free[h] = None
                self.used -= 1
        table.cached.clear()

    def reset(self) -> None:
        """Forget every free cached block (a restarted server has an empty cache)."""
        for entry in self._free:
            if not isinstance(entry, _Unhashed):
                del self._refs[entry]
        self._free.clear()
        if self.used < self.num_blocks:
            self._free[_Unhashed(self.num_blocks - self.used)] = None

    def _take(self, blocks: int) -> None:
        """Reuse ``blocks`` free blocks from the head of the queue, evicting the
        cached ones among them (the caller checked that enough are free)."""
        free = self._free
        while blocks:
            oldest = next(iter(free))
            if isinstance(oldest, _Unhashed):
                taken = min(oldest.count, blocks)
                oldest.count -= taken
                blocks -= taken
                if oldest.count == 0:
                    del free[oldest]
            else:
                del free[oldest]
                del self._refs[oldest]
                self.evictions += 1
                blocks -= 1

    def _hits(self, hashes: tuple[int, ...], prompt_tokens: int) -> list[int]:
        # The last prompt token is always recomputed (its logits are needed).
        limit = min(len(hashes), (prompt_tokens - 1) // self.block_size)
        hits = []
        for h in hashes[:limit]:
            if h not in self._refs:
                break
            hits.append(h)
        return hits
