"""The KV cache in blocks, with vLLM's automatic prefix caching.

vLLM stores KV in blocks of ``block_size`` tokens. With prefix caching (on by
default in vLLM V1) every full block of a prompt is named by a hash chained over
the prompt's blocks, so equal prefixes give equal hashes; a new request's
longest run of already-cached blocks is reused and only the rest is prefilled.
The last prompt token is always computed, so at most ``(prompt - 1) //
block_size`` blocks hit. Blocks that running sequences hold are pinned; when a
sequence finishes its blocks become free but keep their contents, and are
evicted least recently used first, when new blocks are needed (vLLM frees a
sequence's blocks tail first, so its last blocks go first).

Simplifications, documented in docs/simulator.md: a sequence reserves the blocks
for its whole prompt and output when admitted (vLLM grows them step by step and
may preempt); only prompt blocks are hashed (vLLM also caches full output
blocks, which helps multi-turn chats); free blocks that never held a cached
prompt block are reused before cached ones are evicted.
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
        self._free: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced: LRU first
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
        never_cached = self.num_blocks - self.used - len(self._free)
        for _ in range(max(0, new - never_cached)):
            evicted, _ = self._free.popitem(last=False)
            del self._refs[evicted]
            self.evictions += 1
        self.used += new
        return BlockTable(hashes=hashes, cached=list(hits), plain=new, done=len(hits))

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
                del self._free[h]  # a stale copy (its parent was evicted): replace it
            self._refs[h] = 1
            table.cached.append(h)
            table.plain -= 1
        table.done = max(table.done, upto)

    def release(self, table: BlockTable) -> None:
        """A sequence ended: unpin its blocks, keeping cached ones until evicted."""
        self.used -= table.plain
        table.plain = 0
        for h in reversed(table.cached):  # tail first, so it is evicted first
            self._refs[h] -= 1
            if self._refs[h] == 0:
                self._free[h] = None
                self.used -= 1
        table.cached.clear()

    def reset(self) -> None:
        """Forget every free cached block (a restarted server has an empty cache)."""
        for h in self._free:
            del self._refs[h]
        self._free.clear()

    def _hits(self, hashes: tuple[int, ...], prompt_tokens: int) -> list[int]:
        # The last prompt token is always recomputed (its logits are needed).
        limit = min(len(hashes), (prompt_tokens - 1) // self.block_size)
        hits = []
        for h in hashes[:limit]:
            if h not in self._refs:
                break
            hits.append(h)
        return hits
