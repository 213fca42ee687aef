"""``PassOrder.shard_order``: shards in order of first need, from one pass over the pass's
shards (``first_uses``), the same as the stable sort it replaced on every kind of pass."""

from __future__ import annotations

import numpy as np
import pytest

from loader.passorder import first_uses, make_pass_order


def _by_sort(shards: np.ndarray) -> tuple[list[int], list[int]]:
    uniq, first = np.unique(shards, return_index=True)
    order = np.argsort(first, kind="stable")
    return uniq[order].tolist(), first[order].tolist()


@pytest.mark.parametrize(
    ("n", "top", "seed"),
    [(1, 1, 0), (64, 3, 1), (4096, 25, 2), (5000, 40_000, 3), (300, 10**7, 4)],
)
def test_first_uses_match_the_sort_on_random_passes(n: int, top: int, seed: int) -> None:
    # 40,000 and 10**7 shard numbers over a short pass take the sort's branch
    shards = np.random.default_rng(seed).integers(0, top, n)
    got_shards, got_first = first_uses(shards)
    assert (got_shards.tolist(), got_first.tolist()) == _by_sort(shards)


def test_first_uses_of_an_interleaved_mixture_like_pass() -> None:
    # three sources' windows dealt slot by slot, as a mixture's pass reads them
    rng = np.random.default_rng(7)
    parts = [rng.permutation(np.repeat(np.arange(s * 8, s * 8 + 4), 50)) for s in range(3)]
    shards = np.stack(parts, axis=1).reshape(-1)
    got = first_uses(shards)
    assert (got[0].tolist(), got[1].tolist()) == _by_sort(shards)
    assert sorted(got[0].tolist()) == [s * 8 + k for s in range(3) for k in range(4)]
    assert shards[got[1]].tolist() == got[0].tolist()  # each is where its shard first appears


def test_first_uses_of_an_empty_pass() -> None:
    shards, first = first_uses(np.zeros(0, np.int64))
    assert len(shards) == len(first) == 0


def test_shard_order_names_the_batch_of_each_first_need() -> None:
    sizes = np.array([5, 7, 3, 9], np.int64)
    ids = np.random.default_rng(3).permutation(int(sizes.sum()))
    order = make_pass_order(ids, sizes, batch_size=4, drop_last=False)
    shards, batches = order.shard_order()
    uniq, first = _by_sort(order.shards)
    assert shards == uniq
    assert batches == [f // 4 for f in first]
