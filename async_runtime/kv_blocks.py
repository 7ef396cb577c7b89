"""Which physical block of a paged KV cache holds which positions of which sequence.

Every sequence's KV cache lives in one pool of `blocks` blocks of `block_size` positions; a
sequence's block table maps its i-th run of `block_size` positions to a physical block, and the GPU
kernels read the table. `BlockPool` only keeps the books: which blocks are free, which are held
(and by how many tables), and which keep a finished prefix for later prompts.

Prefix caching: a full block is registered under a hash chained over the blocks before it,
h_i = hash((h_{i-1}, tokens of block i)) with h_{-1} = SEED, so a prompt starting with the same
whole blocks shares them instead of computing them again. A registered block never changes: a
sequence about to write into a block another table holds gets a copy (`prepare` returns the pairs
to copy on the GPU), and one about to write into a registered block it holds alone unregisters it.
Blocks no table holds stay registered, in least recently used order, until an allocation finds no
free block and evicts the oldest.

Reservations: a sequence opened with `need` (the most positions it will hold) has the blocks it
will still need set aside, so that it cannot run out later; `free_blocks` counts what is left.
"""

from collections import OrderedDict
from dataclasses import dataclass, field

from .errors import MemoryBudgetError

SEED = 0x5EED  # h_{-1}: the hash chained into a sequence's first block


class OutOfBlocks(MemoryBudgetError):
    """The pool has too few free blocks for what was asked; the message says how many were needed and how many are free."""

    def __init__(self, needed, free, why=""):
        self.needed, self.free = needed, free
        super().__init__(why or f"needed {needed} KV cache blocks, {free} free")


def _blocks_for(positions, block_size):
    return -(-positions // block_size)


@dataclass
class _Sequence:
    table: list = field(default_factory=list)  # the physical block of each run of block_size positions
    length: int = 0  # positions whose tokens are known
    hashes: list = field(default_factory=list)  # chain hash of each full block: length // block_size of them
    reserved: int = 0  # blocks set aside for it and not taken yet
    need_blocks: int | None = None  # blocks its `need` covers, None without one


class BlockPool:
    """The block tables of the open sequences over `blocks` blocks of `block_size` positions."""

    def __init__(self, blocks: int, block_size: int, context: int):
        if blocks < 1 or block_size < 1 or context < 1:
            raise ValueError(f"blocks, block_size and context must be >= 1, not {blocks}, {block_size}, {context}")
        self.blocks, self.block_size, self.context = blocks, block_size, context
        self.max_blocks = _blocks_for(context, block_size)
        self._count = [0] * blocks  # table entries pointing at each block
        self._contents = [[None] * block_size for _ in range(blocks)]  # the token at each offset, None: not written
        self._free = list(range(blocks - 1, -1, -1))  # taken from the end: block 0 first
        self._lru = OrderedDict()  # cached blocks (count 0, registered), least recently used first
        self._block_of = {}  # hash -> registered block
        self._hash_of = {}  # registered block -> hash
        self._seqs = {}
        self._reserved = 0
        self._queries = self._hits = 0

    def open(self, seq, prompt=(), need=None) -> int:
        """Start `seq`, sharing the cached whole blocks its prompt starts with; returns how many prompt positions
        are cached (at most len(prompt) - 1: the caller computes the last one for its logits)."""
        if seq in self._seqs:
            raise ValueError(f"sequence {seq!r} is already open")
        prompt = [int(t) for t in prompt]
        if need is not None and need < len(prompt):
            raise ValueError(f"need {need} is less than the prompt's {len(prompt)} tokens")
        most = len(prompt) if need is None else need
        if most > self.context:
            raise ValueError(f"{most} positions pass the context of {self.context}")
        bs = self.block_size
        table, hashes, h = [], [], SEED
        for i in range(len(prompt) // bs):
            tokens = prompt[i * bs : (i + 1) * bs]
            h = hash((h, tuple(tokens)))
            block = self._block_of.get(h)
            if block is None or self._contents[block] != tokens:  # a hash collision only misses
                break
            table.append(block)
            hashes.append(h)
        cached = min(len(table) * bs, max(len(prompt) - 1, 0))
        table = table[: _blocks_for(cached, bs)]
        # a partly cached last block is copied before the sequence writes into it: one more block
        reserve = 0 if need is None else _blocks_for(need, bs) - len(table) + (cached % bs != 0)
        revived = {b for b in table if self._count[b] == 0}
        if len(revived) + reserve > self.free_blocks():
            raise OutOfBlocks(len(revived) + reserve, self.free_blocks())
        for b in revived:
            del self._lru[b]
        for b in table:
            self._count[b] += 1
        need_blocks = None if need is None else _blocks_for(need, bs)
        self._seqs[seq] = _Sequence(table, cached, hashes[: cached // bs], reserve, need_blocks)
        self._reserved += reserve
        self._queries += len(prompt)
        self._hits += cached
        return cached

    def reserve(self, seq, positions: int) -> None:
        """Set aside the blocks `seq` still needs to hold `positions` positions, past those it holds
        and has set aside; OutOfBlocks (and nothing set aside) unless they are there."""
        s = self._seqs[seq]
        if positions > self.context:
            raise ValueError(f"{positions} positions pass the context of {self.context}")
        need = max(s.need_blocks or 0, _blocks_for(positions, self.block_size))
        more = need - len(s.table) - s.reserved
        if more > self.free_blocks():
            raise OutOfBlocks(more, self.free_blocks())
        s.need_blocks = need
        if more > 0:
            s.reserved += more
            self._reserved += more

    def need(self, seq):
        """The positions `seq` has set blocks aside for (whole blocks, within the context), or None."""
        blocks = self._seqs[seq].need_blocks
        return None if blocks is None else min(blocks * self.block_size, self.context)

    def prepare(self, seq, start: int, end: int) -> list[tuple[int, int]]:
        """Make positions [start, end) of `seq` writable; returns the (src, dst) blocks to copy on the GPU first."""
        s = self._seqs[seq]
        bs = self.block_size
        if end > self.context:
            raise ValueError(f"position {end} passes the context of {self.context}")
        if not 0 <= start <= end or start // bs > len(s.table):
            raise ValueError(f"cannot prepare positions [{start}, {end}) of a sequence of {len(s.table)} blocks")
        if start == end:
            return []
        held = range(start // bs, min(_blocks_for(end, bs), len(s.table)))
        copies = [i for i in held if self._count[s.table[i]] > 1]
        grow = max(0, _blocks_for(end, bs) - len(s.table))
        short = grow + len(copies) - s.reserved
        if short > self.free_blocks():
            raise OutOfBlocks(short, self.free_blocks())
        for i in held:
            b = s.table[i]
            if self._count[b] == 1 and b in self._hash_of:
                del self._block_of[self._hash_of.pop(b)]
        pairs = []
        for i in copies:
            src, dst = s.table[i], self._take(s)
            self._contents[dst] = list(self._contents[src])
            self._count[src] -= 1
            s.table[i] = dst
            pairs.append((src, dst))
        for _ in range(grow):
            s.table.append(self._take(s))
        return pairs

    def extend(self, seq, tokens) -> None:
        """Record the tokens just written at the next positions of `seq`; blocks they fill are registered."""
        s = self._seqs[seq]
        tokens = [int(t) for t in tokens]
        if not tokens:
            return
        bs = self.block_size
        end = s.length + len(tokens)
        if end > len(s.table) * bs:
            raise ValueError(f"positions up to {end} of {seq!r} are not prepared (its blocks hold {len(s.table) * bs})")
        for i in range(s.length // bs, _blocks_for(end, bs)):
            if self._count[s.table[i]] > 1 or s.table[i] in self._hash_of:
                raise ValueError(f"block {i} of {seq!r} is shared or registered: prepare its positions before writing them")
        for token in tokens:
            block = s.table[s.length // bs]
            self._contents[block][s.length % bs] = token
            s.length += 1
            if s.length % bs == 0:
                h = hash((s.hashes[-1] if s.hashes else SEED, tuple(self._contents[block])))
                s.hashes.append(h)
                if h not in self._block_of:
                    self._block_of[h] = block
                    self._hash_of[block] = h

    def truncate(self, seq, length: int) -> None:
        """Forget positions >= length of `seq` and release its whole blocks past it. A sequence opened with `need`
        gets back, as far as the pool has them, reserved blocks to grow to it again."""
        s = self._seqs[seq]
        if length < 0:
            raise ValueError(f"cannot truncate to {length}")
        s.length = min(s.length, length)
        del s.hashes[s.length // self.block_size :]
        keep = _blocks_for(length, self.block_size)
        released = s.table[keep:]
        del s.table[keep:]
        self._release(released)
        if s.need_blocks is not None:
            more = max(0, min(s.need_blocks - len(s.table) - s.reserved, self.free_blocks()))
            s.reserved += more
            self._reserved += more

    def close(self, seq) -> None:
        """Drop `seq`: its blocks no other table holds become cached (registered) or free, its reservation returns."""
        s = self._seqs.pop(seq)
        self._reserved -= s.reserved
        self._release(s.table)

    def table(self, seq) -> list[int]:
        return list(self._seqs[seq].table)

    def length(self, seq) -> int:
        return self._seqs[seq].length

    def free_blocks(self) -> int:
        """Blocks an allocation may still take: free and cached ones, less those reserved."""
        return len(self._free) + len(self._lru) - self._reserved

    def stats(self) -> dict:
        return {
            "blocks": self.blocks,
            "used": sum(1 for c in self._count if c > 0),
            "cached": len(self._lru),
            "free": len(self._free),
            "reserved": self._reserved,
            "prefix_queries": self._queries,
            "prefix_hits": self._hits,
        }

    def _take(self, s):
        """A block for `s` (its reservation first), counted once: a free one, else the least recently used cached one."""
        if s.reserved:
            s.reserved -= 1
            self._reserved -= 1
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._lru.popitem(last=False)
            del self._block_of[self._hash_of.pop(block)]
        self._count[block] = 1
        self._contents[block] = [None] * self.block_size
        return block

    def _release(self, blocks):
        # last blocks first, so that a prefix's tail is evicted before its head (useless without it)
        for block in reversed(blocks):
            self._count[block] -= 1
            if self._count[block] == 0:
                if block in self._hash_of:
                    self._lru[block] = None
                else:
                    self._free.append(block)

    def _check(self):
        """Assert the invariants (for tests: it walks every block and table)."""
        bs = self.block_size
        refs = [0] * self.blocks
        for s in self._seqs.values():
            assert len(s.table) <= self.max_blocks and s.length <= len(s.table) * bs
            assert len(s.hashes) == s.length // bs and s.reserved >= 0
            h = SEED
            for i, block in enumerate(s.table):
                refs[block] += 1
                assert None not in self._contents[block][: max(0, min(bs, s.length - i * bs))]
                if i < len(s.hashes):
                    h = hash((h, tuple(self._contents[block])))
                    assert s.hashes[i] == h and self._hash_of.get(block, h) == h
        assert refs == self._count
        free = set(self._free)
        assert len(free) == len(self._free)
        for block in range(self.blocks):
            assert (block in free) + (block in self._lru) + (refs[block] > 0) == 1
        assert all(block in self._hash_of for block in self._lru) and not free & self._hash_of.keys()
        assert {h: block for block, h in self._hash_of.items()} == self._block_of
        assert all(None not in self._contents[block] for block in self._hash_of)
        assert self._reserved == sum(s.reserved for s in self._seqs.values()) <= len(free) + len(self._lru)
