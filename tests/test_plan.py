"""The plan: exactly-once coverage, equal lengths, determinism, node affinity, resume."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashfeed.plan import Segment, locate, node_shard_order, plan_epoch

sizes_st = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=12).filter(
    lambda s: sum(s) >= 8
)
topology_st = st.sampled_from([(1, None), (2, None), (2, 1), (3, None), (4, 2), (6, 3), (8, 4)])


def _coverage(plan, total: int) -> np.ndarray:
    taken = np.concatenate([*plan.per_rank, plan.dropped])
    return np.bincount(taken, minlength=total)


@settings(max_examples=150, deadline=None)
@given(sizes=sizes_st, topo=topology_st, seed=st.integers(0, 2**31), epoch=st.integers(0, 5))
def test_every_sample_exactly_once_and_equal_lengths(sizes, topo, seed, epoch):
    world, rpn = topo
    total = sum(sizes)
    if total < world:
        return
    plan = plan_epoch(sizes, seed=seed, epoch=epoch, world_size=world, ranks_per_node=rpn)
    assert len({len(r) for r in plan.per_rank}) == 1
    assert (_coverage(plan, total) == 1).all()
    assert len(plan.dropped) < world


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_st, topo=topology_st, seed=st.integers(0, 1000))
def test_without_drop_last_short_ranks_repeat_and_nothing_is_lost(sizes, topo, seed):
    world, rpn = topo
    if sum(sizes) < world:
        return
    plan = plan_epoch(
        sizes, seed=seed, epoch=0, world_size=world, ranks_per_node=rpn, drop_last=False
    )
    assert len({len(r) for r in plan.per_rank}) == 1
    seen = np.unique(np.concatenate(plan.per_rank))
    assert len(seen) == sum(sizes)
    assert len(np.concatenate(plan.per_rank)) == sum(sizes) + len(plan.repeated)


def test_same_inputs_same_plan_and_epochs_differ():
    a = plan_epoch([50] * 8, seed=7, epoch=1, world_size=4)
    b = plan_epoch([50] * 8, seed=7, epoch=1, world_size=4)
    c = plan_epoch([50] * 8, seed=7, epoch=2, world_size=4)
    assert all((x == y).all() for x, y in zip(a.per_rank, b.per_rank, strict=True))
    assert not all((x == y).all() for x, y in zip(a.per_rank, c.per_rank, strict=True))


def test_nodes_keep_their_shards_across_epochs():
    sizes = [100] * 16
    for node in range(4):
        orders = [
            set(
                node_shard_order(
                    sizes, seed=3, epochs=[e], world_size=8, ranks_per_node=2, node_rank=node
                )
            )
            for e in range(3)
        ]
        assert orders[0] == orders[1] == orders[2]
        assert len(orders[0]) == 4  # 16 shards of equal size over 4 nodes


def test_ranks_of_one_node_read_the_same_window():
    sizes = [64] * 8
    plan = plan_epoch(sizes, seed=0, epoch=0, world_size=2, window=2)
    first = [set(locate(sizes, r[:32])[0].tolist()) for r in plan.per_rank]
    assert first[0] == first[1] and len(first[0]) == 2


@pytest.mark.parametrize("old,new", [((4, 2), (4, 2)), ((4, 2), (3, None)), ((2, None), (6, 3))])
@pytest.mark.parametrize("consumed", [0, 1, 40, 83])
def test_resume_on_any_world_size_sees_each_sample_once(old, new, consumed):
    sizes = [37, 50, 29, 44, 61, 20, 35]
    total = sum(sizes)
    first = plan_epoch(sizes, seed=11, epoch=2, world_size=old[0], ranks_per_node=old[1])
    consumed = min(consumed, first.samples_per_rank)
    done = np.concatenate([r[:consumed] for r in first.per_rank])
    seg = Segment(old[0], old[1], consumed)
    rest = plan_epoch(
        sizes, seed=11, epoch=2, world_size=new[0], ranks_per_node=new[1], segments=[seg]
    )
    everything = np.concatenate([done, *rest.per_rank, rest.dropped])
    assert len({len(r) for r in rest.per_rank}) == 1
    assert np.array_equal(np.sort(everything), np.arange(total))


def test_resume_with_the_same_topology_continues_exactly():
    sizes = [30] * 6
    full = plan_epoch(sizes, seed=5, epoch=0, world_size=2)
    rest = plan_epoch(sizes, seed=5, epoch=0, world_size=2, segments=[Segment(2, None, 40)])
    # same topology: the remaining samples are the same set; each rank's set is unchanged
    for r in range(2):
        assert set(rest.per_rank[r].tolist()) == set(full.per_rank[r][40:].tolist())


def test_window_mixing_beats_shard_local_order_on_class_sorted_data():
    # 10 shards, each holding one class: a shard-local shuffle gives one class per batch
    sizes = [200] * 10
    labels = np.repeat(np.arange(10), 200)
    plan = plan_epoch(sizes, seed=0, epoch=0, world_size=1, window=4)
    batches = labels[plan.per_rank[0][: 64 * 25]].reshape(25, 64)
    classes_per_batch = np.mean([len(np.unique(b)) for b in batches])
    assert classes_per_batch >= 3.5


def test_bad_topology_is_a_clear_error():
    with pytest.raises(ValueError, match="ranks_per_node must divide"):
        plan_epoch([10], seed=0, epoch=0, world_size=4, ranks_per_node=3)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        plan_epoch([10], seed=0, epoch=0, world_size=0)
    with pytest.raises(ValueError, match="another dataset"):
        plan_epoch([10], seed=0, epoch=0, world_size=1, segments=[Segment(1, None, 99)])
