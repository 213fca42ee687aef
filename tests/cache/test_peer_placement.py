"""The cluster warm's placement: one store read per shard, spread evenly, copies bounded.

Properties over random needs and holdings (hypothesis), and the plan's real shard orders
of a sweep and of a job.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashfeed.cache.peer.placement import Placement, place
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.plan.plan import node_shard_order


@st.composite
def cluster(draw: st.DrawFn) -> tuple[dict[int, list[int]], dict[int, list[int]], int, int]:
    nodes = draw(st.integers(1, 7))
    shards = draw(st.integers(1, 30))
    needs = {
        n: draw(st.lists(st.integers(0, shards - 1), max_size=2 * shards)) for n in range(nodes)
    }
    held = {n: draw(st.lists(st.integers(0, shards - 1), max_size=shards)) for n in range(nodes)}
    return needs, held, draw(st.integers(1, 4)), draw(st.integers(0, 3))


def check(needs: dict, held: dict, cap: int, p: Placement) -> None:
    holders = {(n, s) for n, ss in held.items() for s in ss}
    wanted = {(n, s) for n, ss in needs.items() for s in ss if (n, s) not in holders}
    # every node gets each shard it needs and lacks exactly once, by the store or a copy
    got = Counter([(n, s) for s, n in p.store.items()] + [(c.target, c.shard) for c in p.copies])
    assert set(got) == wanted
    assert max(got.values(), default=1) == 1
    # the store serves exactly the shards someone needs and nobody holds, to a node needing it
    nobody = {s for _, s in wanted} - {s for _, s in holders}
    assert set(p.store) == nobody
    # a copy's source holds the shard by then, and no node serves more than cap in a wave
    ready = {(n, s): 0 for n, s in holders} | {(n, s): 0 for s, n in p.store.items()}
    for c in p.copies:
        assert c.source != c.target
        assert ready.get((c.source, c.shard), 1 << 30) <= c.wave
        ready[(c.target, c.shard)] = c.wave + 1
    per_wave = Counter((c.source, c.wave) for c in p.copies)
    assert max(per_wave.values(), default=0) <= cap


@settings(max_examples=150, deadline=None)
@given(cluster())
def test_placement_covers_each_need_once_from_a_holder_within_the_cap(case) -> None:
    needs, held, cap, seed = case
    p = place(needs, held, max_serving=cap, seed=seed)
    check(needs, held, cap, p)
    assert p == place(needs, held, max_serving=cap, seed=seed)  # pure and seeded


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 9), st.integers(1, 60), st.integers(0, 5))
def test_a_sweep_spreads_store_reads_evenly(nodes: int, shards: int, seed: int) -> None:
    """Every node needs every shard (a sweep): each node's store reads differ by at most 1."""
    needs = {n: list(range(shards))[n:] + list(range(shards))[:n] for n in range(nodes)}
    p = place(needs, seed=seed)
    loads = [p.store_reads().get(n, 0) for n in range(nodes)]
    assert sum(loads) == shards
    assert max(loads) - min(loads) <= 1
    check(needs, {}, 4, p)


def test_placement_of_the_plans_real_orders_for_a_sweep_and_a_replacement() -> None:
    sizes = [10] * 64
    shares = [NodeShare.build(node_rank=0, num_nodes=1, seed=s) for s in range(4)]
    needs = {
        run: node_shard_order(
            sizes, options=sh.options, epochs=range(1), topology=sh.topology, node_rank=0
        )
        for run, sh in enumerate(shares)
    }
    assert all(sorted(set(o)) == list(range(64)) for o in needs.values())
    p = place(needs, max_serving=2, seed=7)
    check(needs, {}, 2, p)
    assert sorted(p.store_reads().values()) == [16, 16, 16, 16]
    # a replacement node of a 4-node job: its neighbours' caches hold the rest of the data
    job = NodeShare.build(node_rank=0, num_nodes=4, seed=1)
    orders = {
        r: node_shard_order(
            sizes, options=job.options, epochs=range(2), topology=job.topology, node_rank=r
        )
        for r in range(4)
    }
    held = {r: orders[r] for r in (1, 2, 3)}
    mine = list(dict.fromkeys(orders[0]))
    held["gone"] = mine[:-3]  # the node it replaces held all but 3 of its shards
    p = place({**orders, "gone": []}, held, seed=0)
    check({**orders, "gone": []}, held, 4, p)
    assert set(p.store) == set(mine[-3:]) and set(p.store.values()) == {0}
    assert {c.target for c in p.copies} == {0}
    assert {c.source for c in p.copies} == {"gone"}


def test_placement_refuses_bad_values() -> None:
    with pytest.raises(ValueError, match="max_serving must be an integer >= 1, got 0"):
        place({0: [1]}, max_serving=0)
    with pytest.raises(ValueError, match=r"needs\[0\] holds -1"):
        place({0: [-1]})
