"""KV block accounting shared by the runner's KV cache and the simulator: held and promised blocks."""
from __future__ import annotations

import threading

import pytest

from pdtop.engine.errors import KVCapacityError, PromptError
from pdtop.engine.runtime.block_pool import BlockPool, BlockTable


def test_admission_holds_the_prompt_and_promises_the_rest():
    pool = BlockPool(160, 16)  # 10 blocks
    a = BlockTable()
    pool.admit(a, 20, 50, "a")  # holds 2 blocks, promised 5
    assert (len(a.blocks), a.num_tokens, pool.used_tokens) == (2, 20, 20)
    assert (pool.used_blocks, pool.committed_blocks, pool.free_blocks) == (2, 5, 8)
    pool.reserve_many([(a, 70)])  # growth within the promise commits nothing new
    assert (len(a.blocks), pool.committed_blocks, pool.used_tokens) == (5, 5, 70)
    pool.reserve_many([(a, 81)])  # past the promise (80 slots): an unpromised block
    assert (len(a.blocks), pool.committed_blocks) == (6, 6)


def test_promised_blocks_are_not_given_to_others():
    pool = BlockPool(160, 16)
    a, b, c = BlockTable(), BlockTable(), BlockTable()
    pool.admit(a, 16, 80, "a")  # 1 held, 6 promised
    with pytest.raises(KVCapacityError, match=r"KV cache full: b \(16-token prompt \+ max_tokens 64\) needs 5 more"):
        pool.admit(b, 16, 64, "b")  # 5 more: only 4 are neither held nor promised
    assert (b.blocks, pool.committed_blocks, pool.free_blocks) == ([], 6, 9)
    pool.admit(b, 16, 48, "b")
    with pytest.raises(KVCapacityError):  # free blocks exist, but all of them are promised
        pool.reserve_many([(c, 16)], "c")
    assert pool.free_blocks == 8 and c.blocks == []
    pool.reserve_many([(a, 96), (b, 64)])  # both grow to their promises: always possible
    assert pool.free_blocks == 0 and pool.committed_blocks == 10
    pool.release(a)
    pool.release(a)  # idempotent
    assert (pool.committed_blocks, pool.used_tokens, a.promised_blocks) == (4, 64, 0)
    pool.release(b)
    assert pool.free_blocks == 10 and pool.committed_blocks == 0 and pool.used_tokens == 0


def test_a_batch_grows_all_or_nothing():
    pool = BlockPool(64, 16)
    a, b = BlockTable(), BlockTable()
    pool.reserve_many([(a, 16), (b, 16)])
    with pytest.raises(KVCapacityError):
        pool.reserve_many([(a, 32), (b, 48)])  # needs 3, 2 free
    assert (len(a.blocks), len(b.blocks), pool.used_tokens) == (1, 1, 32)


def test_more_than_the_whole_cache_is_never_admitted():
    pool = BlockPool(160, 16)
    with pytest.raises(PromptError, match=r"KV cache too small: r \(100-token prompt \+ max_tokens 61\) needs 161 "
                                          "tokens, the whole cache holds 160"):
        pool.admit(BlockTable(), 100, 61, "r")
    assert pool.committed_blocks == 0


def test_concurrent_growth_keeps_the_count():
    pool = BlockPool(16 * 400, 16)
    tables = [BlockTable() for _ in range(8)]

    def grow(t: BlockTable) -> None:
        for n in range(1, 801):
            pool.reserve_many([(t, n)])

    threads = [threading.Thread(target=grow, args=(t,)) for t in tables]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    blocks = [b for t in tables for b in t.blocks]
    assert len(blocks) == len(set(blocks)) == 400 and pool.used_tokens == 6400 and pool.free_blocks == 0
