"""The plan: exactly-once coverage, equal lengths, determinism, node affinity, resume.

The rank-local functions are checked against a brute-force reference that materialises the
whole epoch as Python lists, step by step as the module docstring describes it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from flashfeed.plan.plan import (
    PlanOptions,
    Segment,
    Topology,
    deal,
    epoch_sequence,
    locate,
    node_samples,
    node_shard_order,
    plan_epoch,
    rank_plan,
)
from flashfeed.plan.streams import _SALT_EPOCH, _SALT_NODES, _SALT_WINDOW

sizes_st = st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=12).filter(
    lambda s: sum(s) >= 8
)
topology_st = st.sampled_from(
    [Topology(ws, rpn) for ws, rpn in [(1, 1), (2, 2), (2, 1), (3, 3), (4, 2), (6, 3), (8, 4)]]
)
options_st = st.builds(
    PlanOptions,
    seed=st.integers(0, 2**40),
    shuffle=st.booleans(),
    window=st.integers(1, 5),
    drop_last=st.booleans(),
)


# ---------------------------------------------------------------- brute-force reference


def _gen(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32, *keys])


def _ref_streams(sizes, opts: PlanOptions, epoch: int, num_nodes: int) -> list[list[int]]:
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    order = (
        _gen(opts.seed, _SALT_NODES).permutation(len(sizes)).tolist()
        if opts.shuffle
        else list(range(len(sizes)))
    )
    chain = [(s, offsets[s] + i) for s in order for i in range(sizes[s])]
    total = len(chain)
    streams = []
    for node in range(num_nodes):
        mine = chain[total * node // num_nodes : total * (node + 1) // num_nodes]
        if not opts.shuffle:
            streams.append([g for _, g in mine])
            continue
        pieces: list[list[int]] = []
        for k, (s, g) in enumerate(mine):
            if k == 0 or mine[k - 1][0] != s:
                pieces.append([])
            pieces[-1].append(g)
        perm = _gen(opts.seed, _SALT_EPOCH, epoch, node).permutation(len(pieces)).tolist()
        stream: list[int] = []
        for w, first in enumerate(range(0, len(perm), opts.window)):
            window = [g for p in perm[first : first + opts.window] for g in pieces[p]]
            mixed = _gen(opts.seed, _SALT_WINDOW, epoch, node, w).permutation(np.array(window))
            stream += mixed.tolist()
        streams.append(stream)
    return streams


def _ref_parts(sizes, opts, epoch, topology, segments) -> tuple[list[list[int]], int]:
    """Every node's part of what remains for ``topology``, and the samples each rank skips."""
    skip = 0
    if segments and segments[-1].topology == topology:
        skip, segments = segments[-1].samples_per_rank, segments[:-1]
    first = segments[0].topology if segments else topology
    remaining = [g for s in _ref_streams(sizes, opts, epoch, first.num_nodes) for g in s]
    for seg in segments:
        topo, n = seg.topology, seg.topology.num_nodes
        parts = _cut(remaining, n)
        remaining = [g for p in parts for g in p[seg.samples_per_rank * topo.rpn :]]
    return _cut(remaining, topology.num_nodes), skip


def _cut(seq: list[int], n: int) -> list[list[int]]:
    return [seq[len(seq) * j // n : len(seq) * (j + 1) // n] for j in range(n)]


def _ref_ranks(sizes, opts, epoch, topology, segments) -> tuple[list[list[int]], list[int]]:
    parts, skip = _ref_parts(sizes, opts, epoch, topology, segments)
    rpn = topology.rpn
    dealt = [p[r::rpn] for p in parts for r in range(rpn)]
    lengths = [len(d) for d in dealt]
    target = min(lengths) if opts.drop_last else max(lengths)
    ranks, dropped = [], []
    for d in dealt:
        if not d and target:
            raise ValueError("a rank has no samples")
        dropped += d[target:]
        padded = (d * (target // max(1, len(d)) + 1))[:target]
        ranks.append(padded[skip:])
    return ranks, dropped


@st.composite
def _history(draw, sizes):
    """A random sequence of segments, each consuming at most what its plan allows; training
    that goes on under the same topology extends its segment, as the loader records it."""
    opts = draw(options_st)
    segments: list[Segment] = []
    for _ in range(draw(st.integers(0, 3))):
        topo = draw(topology_st)
        try:
            ranks, _ = _ref_ranks(sizes, opts, 2, topo, segments)
        except ValueError:
            break
        consumed = draw(st.integers(0, len(ranks[0])))
        if segments and segments[-1].topology == topo:
            consumed += segments.pop().samples_per_rank
        segments.append(Segment(topo.world_size, topo.rpn, consumed))
    return opts, segments


@settings(max_examples=250, deadline=None)
@given(data=st.data(), sizes=sizes_st, topo=topology_st)
def test_rank_plan_matches_the_brute_force_reference(data, sizes, topo):
    opts, segments = data.draw(_history(sizes))
    try:
        ranks, dropped = _ref_ranks(sizes, opts, 2, topo, segments)
    except ValueError:
        with pytest.raises(ValueError, match="no samples"):
            plan_epoch(sizes, options=opts, epoch=2, topology=topo, segments=segments)
        return
    everything = plan_epoch(sizes, options=opts, epoch=2, topology=topo, segments=segments)
    for rank in range(topo.world_size):
        got = rank_plan(sizes, options=opts, epoch=2, topology=topo, rank=rank, segments=segments)
        assert got.samples.tolist() == ranks[rank]
        assert everything.per_rank[rank].tolist() == ranks[rank]
    assert sorted(everything.dropped.tolist()) == sorted(dropped)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), sizes=sizes_st, topo=topology_st)
def test_node_samples_are_its_ranks_in_lock_step(data, sizes, topo):
    opts, segments = data.draw(_history(sizes))
    assume(opts.drop_last)  # without it, short ranks repeat samples: not a fetch order
    plan = plan_epoch(sizes, options=opts, epoch=2, topology=topo, segments=segments)
    rpn = topo.rpn
    for node in range(topo.num_nodes):
        got = node_samples(
            sizes, options=opts, epoch=2, topology=topo, node_rank=node, segments=segments
        )
        ranks = plan.per_rank[node * rpn : (node + 1) * rpn]
        expect = np.stack(ranks, axis=1).reshape(-1) if len(ranks[0]) else np.zeros(0)
        assert got.tolist() == expect.tolist()


# ---------------------------------------------------------------- the guarantees


def _coverage(plan, total: int) -> np.ndarray:
    taken = np.concatenate([*plan.per_rank, plan.dropped])
    return np.bincount(taken, minlength=total)


@settings(max_examples=150, deadline=None)
@given(sizes=sizes_st, topo=topology_st, seed=st.integers(0, 2**31), epoch=st.integers(0, 5))
def test_every_sample_exactly_once_and_equal_lengths(sizes, topo, seed, epoch):
    total = sum(sizes)
    if total < topo.world_size:
        return
    plan = plan_epoch(sizes, options=PlanOptions(seed=seed), epoch=epoch, topology=topo)
    assert len({len(r) for r in plan.per_rank}) == 1
    assert (_coverage(plan, total) == 1).all()
    assert len(plan.dropped) < topo.world_size
    one = rank_plan(sizes, options=PlanOptions(seed=seed), epoch=epoch, topology=topo, rank=0)
    assert one.dropped_total == len(plan.dropped)


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_st, topo=topology_st, seed=st.integers(0, 1000))
def test_without_drop_last_short_ranks_repeat_and_nothing_is_lost(sizes, topo, seed):
    if sum(sizes) < topo.world_size:
        return
    opts = PlanOptions(seed=seed, drop_last=False)
    plan = plan_epoch(sizes, options=opts, epoch=0, topology=topo)
    assert len({len(r) for r in plan.per_rank}) == 1
    seen = np.unique(np.concatenate(plan.per_rank))
    assert len(seen) == sum(sizes)
    assert len(np.concatenate(plan.per_rank)) == sum(sizes) + len(plan.repeated)


def test_same_inputs_same_plan_and_epochs_differ():
    opts = PlanOptions(seed=7)
    a = plan_epoch([50] * 8, options=opts, epoch=1, topology=Topology(4))
    b = plan_epoch([50] * 8, options=opts, epoch=1, topology=Topology(4))
    c = plan_epoch([50] * 8, options=opts, epoch=2, topology=Topology(4))
    assert all((x == y).all() for x, y in zip(a.per_rank, b.per_rank, strict=True))
    assert not all((x == y).all() for x, y in zip(a.per_rank, c.per_rank, strict=True))


def test_nodes_keep_their_shards_across_epochs():
    sizes = [100] * 16
    for node in range(4):
        orders = [
            set(
                node_shard_order(
                    sizes,
                    options=PlanOptions(seed=3),
                    epochs=[e],
                    topology=Topology(8, 2),
                    node_rank=node,
                )
            )
            for e in range(3)
        ]
        assert orders[0] == orders[1] == orders[2]
        assert len(orders[0]) == 4  # 16 shards of equal size over 4 nodes


def test_ranks_of_one_node_read_the_same_window():
    sizes = [64] * 8
    plan = plan_epoch(sizes, options=PlanOptions(window=2), epoch=0, topology=Topology(2))
    first = [set(locate(sizes, r[:32])[0].tolist()) for r in plan.per_rank]
    assert first[0] == first[1] and len(first[0]) == 2


@pytest.mark.parametrize(
    "old,new",
    [
        (Topology(4, 2), Topology(4, 2)),
        (Topology(4, 2), Topology(3)),
        (Topology(2), Topology(6, 3)),
        (Topology(4, 2), Topology(6, 2)),
    ],
)
@pytest.mark.parametrize("consumed", [0, 1, 40, 83])
@pytest.mark.parametrize("drop_last", [True, False])
def test_resume_on_any_world_size_sees_each_sample_once(old, new, consumed, drop_last):
    sizes = [37, 50, 29, 44, 61, 20, 35]
    total = sum(sizes)
    opts = PlanOptions(seed=11, drop_last=drop_last)
    first = plan_epoch(sizes, options=opts, epoch=2, topology=old)
    consumed = min(consumed, first.samples_per_rank)
    done = np.concatenate([r[:consumed] for r in first.per_rank])
    seg = Segment(old.world_size, old.ranks_per_node, consumed)
    rest = plan_epoch(sizes, options=opts, epoch=2, topology=new, segments=[seg])
    assert len({len(r) for r in rest.per_rank}) == 1
    if drop_last:
        everything = np.concatenate([done, *rest.per_rank, rest.dropped])
        assert np.array_equal(np.sort(everything), np.arange(total))
        assert len(rest.dropped) < new.world_size
    else:  # nothing lost; repeats only to even out the ranks
        delivered = np.concatenate([done, *rest.per_rank])
        assert np.array_equal(np.unique(delivered), np.arange(total))
        assert len(delivered) == total + len(rest.repeated) + _repeats_in(first, consumed)


def _repeats_in(plan, consumed: int) -> int:
    return sum(max(0, consumed - len(set(r.tolist()))) for r in plan.per_rank)


def test_resume_with_the_same_topology_continues_exactly():
    sizes = [30] * 6
    full = plan_epoch(sizes, options=PlanOptions(seed=5), epoch=0, topology=Topology(2))
    rest = plan_epoch(
        sizes,
        options=PlanOptions(seed=5),
        epoch=0,
        topology=Topology(2),
        segments=[Segment(2, None, 40)],
    )
    for r in range(2):
        assert np.array_equal(rest.per_rank[r], full.per_rank[r][40:])


@settings(max_examples=60, deadline=None)
@given(ws=st.sampled_from([1, 2, 4, 8]), consumed=st.integers(0, 20))
def test_topology_spellings_are_one_topology(ws, consumed):
    """A state saved without ranks_per_node resumes exactly under ranks_per_node=world_size."""
    assert Topology(ws) == Topology(ws, ws) == Topology(ws, None)
    assert Segment(ws, None, consumed) == Segment(ws, ws, consumed)
    sizes = [25] * 8
    opts = PlanOptions(seed=1)
    full = rank_plan(sizes, options=opts, epoch=0, topology=Topology(ws), rank=0)
    rest = rank_plan(
        sizes,
        options=opts,
        epoch=0,
        topology=Topology(ws, ws),
        rank=0,
        segments=[Segment(ws, None, consumed)],
    )
    assert np.array_equal(rest.samples, full.samples[consumed:])


def test_window_mixing_beats_shard_local_order_on_class_sorted_data():
    # 10 shards, each holding one class: a shard-local shuffle gives one class per batch
    sizes = [200] * 10
    labels = np.repeat(np.arange(10), 200)
    plan = plan_epoch(sizes, options=PlanOptions(window=4), epoch=0, topology=Topology(1))
    batches = labels[plan.per_rank[0][: 64 * 25]].reshape(25, 64)
    classes_per_batch = np.mean([len(np.unique(b)) for b in batches])
    assert classes_per_batch >= 3.5


def test_without_shuffle_a_rank_reads_in_dataset_order():
    opts = PlanOptions(shuffle=False)
    plan = plan_epoch([5, 5, 5, 5], options=opts, epoch=3, topology=Topology(2))
    assert plan.per_rank[0].tolist() == list(range(0, 20, 2))


def test_resplit_of_a_large_epoch_stays_local():
    """The rest of an epoch re-split 8 -> 6 nodes: each new rank's samples come from the
    shards of at most a few old nodes, not from all over the dataset."""
    sizes = np.full(4000, 50)
    opts = PlanOptions(seed=9)
    old, new = Topology(64, 8), Topology(48, 8)
    seg = Segment(64, 8, 1000)
    before = [
        set(node_shard_order(sizes, options=opts, epochs=[0], topology=old, node_rank=j))
        for j in range(old.num_nodes)
    ]
    got = rank_plan(sizes, options=opts, epoch=0, topology=new, rank=17, segments=[seg])
    shards = set(locate(sizes, got.samples)[0].tolist())
    owners = [j for j, s in enumerate(before) if s & shards]
    assert 1 <= len(owners) <= 3


def test_bad_inputs_are_clear_errors_naming_the_field():
    with pytest.raises(ValueError, match="ranks_per_node must divide"):
        Topology(4, 3)
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        Topology(0)
    with pytest.raises(ValueError, match="window must be >= 1"):
        PlanOptions(window=0)
    with pytest.raises(ValueError, match="seed must be an integer"):
        PlanOptions(seed="x")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="drop_last must be True or False"):
        PlanOptions(drop_last="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch must be >= 0"):
        rank_plan([10], options=PlanOptions(), epoch=-3, topology=Topology(1), rank=0)
    with pytest.raises(ValueError, match="rank must be in"):
        rank_plan([10], options=PlanOptions(), epoch=0, topology=Topology(2), rank=2)
    with pytest.raises(ValueError, match="another dataset"):
        plan_epoch(
            [10],
            options=PlanOptions(),
            epoch=0,
            topology=Topology(1),
            segments=[Segment(1, None, 99)],
        )


@settings(max_examples=100, deadline=None)
@given(sizes=sizes_st, topo=topology_st, opts=options_st, epochs=st.integers(1, 3))
def test_node_shard_order_is_the_first_need_of_each_shard(sizes, topo, opts, epochs):
    for node in range(topo.num_nodes):
        expect: list[int] = []
        for epoch in range(epochs):
            try:
                ids = node_samples(sizes, options=opts, epoch=epoch, topology=topo, node_rank=node)
            except ValueError:
                return
            shards = locate(sizes, ids)[0].tolist()
            expect += list(dict.fromkeys(shards))
        got = node_shard_order(
            sizes, options=opts, epochs=range(epochs), topology=topo, node_rank=node
        )
        assert got == expect


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("world,rpn", [(1, 1), (3, 3), (4, 2), (6, 3), (5, 1)])
def test_dealing_the_epoch_sequence_gives_every_rank_its_plan(world, rpn, drop_last):
    sizes = [37, 50, 29, 44, 61, 23]
    options = PlanOptions(seed=4, drop_last=drop_last)
    topo = Topology(world, rpn)
    seq = epoch_sequence(sizes, options=options, epoch=2, topology=topo)
    assert sorted(seq.tolist()) == list(range(sum(sizes)))  # the whole epoch, each once
    for rank in range(world):
        want = rank_plan(sizes, options=options, epoch=2, topology=topo, rank=rank)
        got = deal(seq, topology=topo, rank=rank, drop_last=drop_last)
        assert np.array_equal(got.samples, want.samples)
        assert np.array_equal(got.dropped, want.dropped)
        assert np.array_equal(got.repeated, want.repeated)
        assert got.dropped_total == want.dropped_total
