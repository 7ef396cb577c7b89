"""The paged KV cache's bookkeeping (async_runtime/kv_blocks.py): blocks are allocated as positions
are prepared and come back on close; a failed allocation changes nothing; reservations hold;
prompts share cached whole blocks, at most len(prompt) - 1 positions, with copy-on-write before a
shared block is written; closed prefixes stay cached until evicted least recently used first; and,
over random operations, no table ever points a sequence at a block holding other tokens."""

import random

import pytest

from async_runtime.errors import MemoryBudgetError
from async_runtime.kv_blocks import BlockPool, OutOfBlocks


def write(pool, seq, tokens):
    """Prepare and record `tokens` at the next positions of `seq`, as a pass writing them would."""
    start = pool.length(seq)
    copies = pool.prepare(seq, start, start + len(tokens))
    pool.extend(seq, tokens)
    pool._check()
    return copies


def start(pool, seq, prompt, need=None):
    """Open `seq` and write the part of its prompt the cache does not hold; returns the cached count."""
    cached = pool.open(seq, prompt, need)
    write(pool, seq, prompt[cached:])
    return cached


def test_blocks_follow_prepared_positions_and_close_frees_them():
    pool = BlockPool(blocks=8, block_size=4, context=32)
    assert pool.max_blocks == 8
    pool.open("a")
    assert pool.prepare("a", 0, 5) == []
    assert len(pool.table("a")) == 2
    pool.prepare("a", 5, 8)
    assert len(pool.table("a")) == 2
    pool.prepare("a", 8, 9)
    assert len(set(pool.table("a"))) == 3
    assert pool.stats()["used"] == 3 and pool.stats()["free"] == 5
    pool.extend("a", range(9))
    assert pool.length("a") == 9
    pool._check()
    pool.close("a")
    pool._check()
    # the two full blocks stay cached, the partial one is free again
    assert pool.stats()["used"] == 0 and pool.stats()["cached"] == 2 and pool.stats()["free"] == 6
    assert pool.free_blocks() == 8
    with pytest.raises(KeyError):
        pool.close("a")


def test_bad_arguments():
    with pytest.raises(ValueError):
        BlockPool(0, 4, 32)
    with pytest.raises(ValueError):
        BlockPool(4, 0, 32)
    with pytest.raises(ValueError):
        BlockPool(4, 4, 0)
    pool = BlockPool(8, 4, 32)
    pool.open("a")
    with pytest.raises(ValueError):
        pool.open("a")
    with pytest.raises(ValueError):
        pool.open("b", [1, 2, 3], need=2)
    with pytest.raises(ValueError, match="33"):
        pool.prepare("a", 0, 33)
    with pytest.raises(ValueError):
        pool.prepare("a", 8, 9)  # entries grow contiguously
    pool.prepare("a", 0, 2)
    with pytest.raises(ValueError):
        pool.extend("a", range(5))  # only 4 positions prepared
    assert pool.length("a") == 0
    pool._check()


def test_out_of_blocks_changes_nothing_and_names_the_counts():
    pool = BlockPool(blocks=4, block_size=4, context=64)
    start(pool, "a", list(range(8)))
    pool.open("b")
    before = pool.stats()
    with pytest.raises(OutOfBlocks, match=r"needed 3 .* 2 free") as failure:
        pool.prepare("b", 0, 12)
    assert isinstance(failure.value, MemoryBudgetError)
    assert (failure.value.needed, failure.value.free) == (3, 2)
    assert pool.stats() == before and pool.table("b") == [] and pool.free_blocks() == 2
    pool._check()
    # a copy-on-write and a new block, one short: neither happens
    pool.open("c", list(range(8)) + [9])  # shares a's 2 blocks
    pool.prepare("b", 0, 8)  # takes the 2 left
    before, table = pool.stats(), pool.table("c")
    with pytest.raises(OutOfBlocks):
        pool.prepare("c", 7, 9)
    assert pool.stats() == before and pool.table("c") == table
    pool._check()


def test_reservations():
    pool = BlockPool(blocks=8, block_size=4, context=32)
    pool.open("a", need=20)
    assert pool.stats()["reserved"] == 5 and pool.free_blocks() == 3
    with pytest.raises(OutOfBlocks, match="needed 4 .* 3 free"):
        pool.open("b", need=16)
    assert pool.stats()["reserved"] == 5
    pool.open("b", need=12)
    assert pool.free_blocks() == 0
    pool.open("c")
    with pytest.raises(OutOfBlocks):
        pool.prepare("c", 0, 1)  # nothing left that is not reserved
    pool.prepare("a", 0, 20)  # from its reservation
    assert pool.stats()["reserved"] == 3 and pool.free_blocks() == 0
    pool._check()
    pool.close("b")
    assert pool.stats()["reserved"] == 0 and pool.free_blocks() == 3
    with pytest.raises(ValueError, match="40.*32"):
        pool.open("d", need=40)
    pool._check()


def test_a_reservation_that_fails_sets_nothing_aside():
    pool = BlockPool(blocks=4, block_size=4, context=32)
    pool.open("a")
    pool.reserve("a", 8)
    assert pool.need("a") == 8 and pool.free_blocks() == 2
    pool.open("b")
    with pytest.raises(OutOfBlocks, match="needed 4 .* 2 free"):
        pool.reserve("b", 16)
    assert pool.need("b") is None and pool.stats()["reserved"] == 2
    write(pool, "b", range(4))  # a block of its own, then back: no reservation comes with it
    pool.truncate("b", 0)
    assert pool.stats()["reserved"] == 2 and pool.free_blocks() == 2
    pool._check()


def test_prefix_sharing():
    pool = BlockPool(blocks=16, block_size=4, context=64)
    prompt = list(range(12)) + [50, 51]
    assert start(pool, "a", prompt) == 0
    assert start(pool, "b", list(range(12)) + [60]) == 12
    assert pool.table("b")[:3] == pool.table("a")[:3]
    assert all(pool._count[block] == 2 for block in pool.table("a")[:3])
    assert pool.stats()["prefix_queries"] == 14 + 13 and pool.stats()["prefix_hits"] == 12
    other = list(range(12))
    other[9] = 99  # in block 2
    assert start(pool, "c", other + [70]) == 8
    assert pool.table("c")[:2] == pool.table("a")[:2] and pool.table("c")[2] != pool.table("a")[2]
    assert [pool._count[block] for block in pool.table("a")[:3]] == [3, 3, 2]
    assert pool.stats()["prefix_hits"] == 20


def test_a_whole_cached_prompt_leaves_its_last_token_and_copies_on_write():
    bs = 4
    pool = BlockPool(blocks=8, block_size=bs, context=32)
    prompt = list(range(2 * bs))
    start(pool, "a", prompt)
    assert pool.open("b", prompt, need=3 * bs) == 2 * bs - 1
    assert pool.table("b") == pool.table("a") and pool.length("b") == 2 * bs - 1
    # 1 block to grow to need, 1 for the copy
    assert pool.stats()["reserved"] == 2
    src = pool.table("a")[1]
    copies = pool.prepare("b", 2 * bs - 1, 2 * bs)
    assert len(copies) == 1 and copies[0][0] == src
    dst = copies[0][1]
    assert pool.table("b") == [pool.table("a")[0], dst] and pool._count[src] == 1 and pool._count[dst] == 1
    assert pool._contents[dst] == pool._contents[src]  # what the GPU copy makes
    pool.extend("b", prompt[-1:])
    assert pool.length("b") == 2 * bs
    pool._check()
    # the hash already names a's block: it still does
    assert pool._block_of[pool._hash_of[src]] == src and dst not in pool._hash_of


def test_a_cached_block_held_alone_is_unregistered_instead_of_copied():
    pool = BlockPool(blocks=8, block_size=4, context=32)
    prompt = list(range(8))
    start(pool, "a", prompt)
    pool.close("a")
    assert pool.open("b", prompt) == 7
    last = pool.table("b")[1]
    assert pool.prepare("b", 7, 8) == [] and last not in pool._hash_of
    pool._check()
    pool.extend("b", [7])  # full again: registered again
    assert last in pool._hash_of
    pool._check()


def test_closed_prefixes_stay_cached_and_the_least_recently_used_goes_first():
    pool = BlockPool(blocks=4, block_size=2, context=8)
    start(pool, "a", [1, 2, 3, 4])
    a0, a1 = pool.table("a")
    pool.close("a")
    start(pool, "b", [5, 6, 7, 8])
    pool.close("b")
    assert pool.stats()["cached"] == 4 and pool.stats()["free"] == 0
    assert pool.open("c", [1, 2, 9]) == 2 and pool.table("c") == [a0]
    pool._check()
    pool.prepare("c", 2, 4)  # no free block: evicts a1, the oldest
    assert pool.table("c")[1] == a1 and a1 not in pool._hash_of
    pool.extend("c", [9, 10])
    pool.close("c")
    pool._check()
    assert pool.open("d", [1, 2, 3, 4, 5]) == 2  # a's second block is gone
    assert pool.open("e", [5, 6, 7, 8, 1]) == 4  # b's blocks are not
    pool._check()


def test_a_closed_prefix_loses_its_tail_before_its_head():
    pool = BlockPool(blocks=4, block_size=2, context=8)
    start(pool, "a", [1, 2, 3, 4])
    head, tail = pool.table("a")
    pool.close("a")
    pool.open("x")
    pool.prepare("x", 0, 6)  # the 2 free blocks and one evicted
    assert tail in pool.table("x") and head not in pool.table("x")
    assert pool.open("y", [1, 2, 3]) == 2
    pool._check()


def test_truncate():
    pool = BlockPool(blocks=8, block_size=4, context=32)
    start(pool, "a", list(range(10)))
    table = pool.table("a")
    pool.truncate("a", 5)
    assert pool.length("a") == 5 and pool.table("a") == table[:2]
    assert pool.stats()["free"] == 6 and pool.stats()["cached"] == 0  # the partial block is free
    # block 1 (registered, held alone) is rewritten from position 5: it is unregistered first
    write(pool, "a", [40, 41, 42])
    assert pool.length("a") == 8
    assert pool.open("b", list(range(8)) + [0]) == 4
    assert pool.open("c", list(range(5)) + [40, 41, 42, 0]) == 8
    pool.truncate("a", 4)  # its block 1 is c's too
    assert pool.table("a") == table[:1] and pool._count[table[1]] == 1
    pool.close("c")
    assert pool.stats()["cached"] == 1  # c's copy of a's old block 1
    pool._check()


def test_truncate_gives_a_reservation_back():
    pool = BlockPool(blocks=8, block_size=4, context=32)
    pool.open("a", need=12)
    write(pool, "a", range(12))
    assert pool.stats()["reserved"] == 0
    pool.truncate("a", 4)
    assert pool.stats()["reserved"] == 2 and pool.free_blocks() == 8 - 1 - 2
    pool._check()


def test_random_operations_never_map_a_sequence_to_other_tokens():
    rng = random.Random(1234)
    bs, context = 4, 32
    pool = BlockPool(blocks=20, block_size=bs, context=context)
    bases = [[rng.randrange(3) for _ in range(20)] for _ in range(3)]
    tokens = {}  # what each open sequence should hold at each position
    guaranteed = set()  # opened with need, not truncated or recomputed since: its prepares up to need never fail
    needs, copies, failures, next_id = {}, 0, 0, 0
    for _ in range(600):
        op = rng.random()
        if op < 0.2 and len(tokens) < 6:
            prompt = rng.choice(bases)[: rng.randrange(21)] + [rng.randrange(3) for _ in range(rng.randrange(4))]
            need = rng.choice([None, rng.randint(len(prompt), context)])
            before = pool.stats()
            try:
                pool.open(next_id, prompt, need)
            except OutOfBlocks:
                failures += 1
                assert pool.stats() == before
            else:
                tokens[next_id], needs[next_id] = prompt, need
                if need is not None:
                    guaranteed.add(next_id)
            next_id += 1
        elif op < 0.3 and tokens:
            seq = rng.choice(list(tokens))
            pool.close(seq)
            del tokens[seq]
            guaranteed.discard(seq)
        elif op < 0.37 and tokens:
            seq = rng.choice(list(tokens))
            length = rng.randint(0, pool.length(seq))
            pool.truncate(seq, length)
            del tokens[seq][length:]
            guaranteed.discard(seq)
        elif tokens:
            seq = rng.choice(list(tokens))
            at = pool.length(seq)
            end = min(context, at + rng.randint(1, 6))
            limit = needs[seq] if seq in guaranteed else context
            end = min(end, limit)
            if end == at:
                continue
            while len(tokens[seq]) < end:
                tokens[seq].append(rng.randrange(3))
            begin = at
            if rng.random() < 0.15:  # recompute some positions already written
                begin = max(0, at - rng.randint(1, 6))
                guaranteed.discard(seq)
            before = pool.stats()
            try:
                pairs = pool.prepare(seq, begin, end)
            except OutOfBlocks:
                assert seq not in guaranteed
                failures += 1
                assert pool.stats() == before
            else:
                copies += len(pairs)
                pool.extend(seq, tokens[seq][at:end])
        pool._check()
        for seq, expected in tokens.items():
            table = pool.table(seq)
            held = [pool._contents[table[p // bs]][p % bs] for p in range(pool.length(seq))]
            assert held == expected[: pool.length(seq)]
    for seq in list(tokens):
        pool.close(seq)
    pool._check()
    stats = pool.stats()
    assert stats["used"] == 0 and stats["reserved"] == 0 and stats["cached"] + stats["free"] == 20
    # the run went through sharing, copies and shortages
    assert stats["prefix_hits"] > 0 and copies > 0 and failures > 0
