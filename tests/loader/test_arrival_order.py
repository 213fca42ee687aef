"""``PlanOptions(arrival_slices=n)``: the first epoch's windows (``arrival_windows="all"``,
or only its first: ``"first"``) read front to back in ``n`` slices of their shard pieces, so
a window's first batches need only the front of every shard of it. The order is a pure
function of the plan inputs (resume stays exact) and keeps the window's class mixing where
a shard holds one class; from an empty cache the first batch comes while the window's shards
arrive.

The cold test reads the real S3 server behind ``slowproxy.SlowProxy``; nothing is faked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from benchmarks.harness.shuffle_quality import shuffle_quality
from flashfeed.cache import ShardCache
from flashfeed.dataset import Dataset
from flashfeed.loader import Loader
from flashfeed.loader.position import Position
from flashfeed.plan.plan import PlanOptions, Topology, plan_epoch, rank_plan
from flashfeed.s3.retry import RetryPolicy

from support.loader_helpers import make_image_dataset

SIZES = [100, 120, 90, 110, 100, 100, 80, 100]


def _order(
    slices: int,
    epoch: int = 0,
    world: int = 1,
    rank: int = 0,
    spacing: str = "even",
    windows: str = "first",
) -> np.ndarray:
    options = PlanOptions(
        seed=5, arrival_slices=slices, arrival_spacing=spacing, arrival_windows=windows
    )
    topology = Topology(world)
    return rank_plan(SIZES, options=options, epoch=epoch, topology=topology, rank=rank).samples


def _front(ids: np.ndarray) -> np.ndarray:
    """Where each sample sits in its shard, 0 (front) to 1 (back)."""
    offsets = np.concatenate([[0], np.cumsum(SIZES)])
    shard = np.searchsorted(offsets, ids, side="right") - 1
    return (ids - offsets[shard]) / np.asarray(SIZES)[shard]


def test_the_first_window_is_read_front_to_back_and_the_rest_is_unchanged():
    plain, arrival = _order(1), _order(8)
    offsets = np.cumsum(SIZES)
    shards = np.searchsorted(offsets, plain, side="right")
    first4 = list(dict.fromkeys(shards.tolist()))[:4]  # window 0: the stream's first 4 shards
    window = int(np.isin(shards, first4).sum())
    assert np.isin(shards[:window], first4).all()
    assert sorted(plain[:window]) == sorted(arrival[:window])  # the same samples
    assert np.array_equal(plain[window:], arrival[window:])  # later windows untouched
    front = _front(arrival[:window])
    assert (np.diff(np.floor(front * 8)) >= 0).all()  # slice after slice, front to back
    assert not (np.diff(np.floor(_front(plain[:window]) * 8)) >= 0).all()
    # the first 48 samples (of about 52 in slice 0) come from the front eighth of all four
    assert front[:48].max() < 1 / 8
    assert set(np.searchsorted(offsets, arrival[:48], side="right").tolist()) == set(first4)


def _windows(plain: np.ndarray) -> list[tuple[int, int, list[int]]]:
    """The windows of a plain (unsliced) single-rank order: (start, end, shards), 4 shards
    each, found from where the samples' shards change."""
    offsets = np.cumsum(SIZES)
    shards = np.searchsorted(offsets, plain, side="right")
    seen = list(dict.fromkeys(shards.tolist()))
    out, a = [], 0
    for k in range(0, len(seen), 4):
        group = seen[k : k + 4]
        b = a + int(np.isin(shards, group).sum())
        assert np.isin(shards[a:b], group).all()
        out.append((a, b, group))
        a = b
    return out


@pytest.mark.parametrize("spacing", ["even", "doubling"])
def test_all_windows_of_the_first_epoch_are_read_front_to_back(spacing):
    plain, first = _order(1), _order(8, spacing=spacing)
    every = _order(8, spacing=spacing, windows="all")
    windows = _windows(plain)
    assert len(windows) == 2
    a0, b0, _ = windows[0]
    assert np.array_equal(every[a0:b0], first[a0:b0])  # window 0: as "first" slices it
    assert np.array_equal(plain[b0:], first[b0:])  # "first": later windows shuffled whole
    offsets = np.cumsum(SIZES)
    cuts = 2.0 ** -np.arange(7, 0, -1) if spacing == "doubling" else np.arange(1, 8) / 8
    for a, b, group in windows:
        assert sorted(every[a:b]) == sorted(plain[a:b])  # the same samples, window by window
        front = _front(every[a:b])
        part = np.searchsorted(cuts, front, side="right")
        assert (np.diff(part) >= 0).all(), (a, b)  # slice after slice, front to back
        assert not (np.diff(np.searchsorted(cuts, _front(plain[a:b]), side="right")) >= 0).all()
        # its first samples come from the front of all four of its shards
        head = every[a : a + 20]
        assert _front(head).max() < (1 / 16 if spacing == "doubling" else 1 / 8)
        assert set(np.searchsorted(offsets, head, side="right").tolist()) == set(group)
    assert not np.array_equal(every[b0:], first[b0:])


def test_doubling_slices_read_the_very_front_first_and_the_back_half_last():
    plain, arrival = _order(1), _order(8, spacing="doubling")
    offsets = np.cumsum(SIZES)
    first4 = list(dict.fromkeys(np.searchsorted(offsets, plain, side="right").tolist()))[:4]
    window = int(np.isin(np.searchsorted(offsets, plain, side="right"), first4).sum())
    assert sorted(plain[:window]) == sorted(arrival[:window])
    assert np.array_equal(plain[window:], arrival[window:])
    front = _front(arrival[:window])
    # slice j > 0 ends at 2**(j - 7) of its piece, slice 0 is the front 1/128: slice after
    # slice, front to back
    part = np.searchsorted(2.0 ** -np.arange(7, 0, -1), front, side="right")
    assert (np.diff(part) >= 0).all()
    assert not (np.diff(np.searchsorted(2.0 ** -np.arange(7, 0, -1), _front(plain[:window]),
                                        side="right")) >= 0).all()  # fmt: skip
    # the first 24 samples (of about 26 in the front 1/16) come from the front 1/16 of all four;
    # even slices need the front 1/8 for as many
    assert front[:24].max() < 1 / 16
    assert set(np.searchsorted(offsets, arrival[:24], side="right").tolist()) == set(first4)
    # the back half of every piece is read last, in one slice: about half the window
    back = front >= 0.5
    assert back[-int(back.sum()) :].all()
    assert 0.45 < back.mean() < 0.55


def test_doubling_slices_mix_a_shard_sorted_by_class_better_than_even_ones():
    """Where a shard's samples are sorted by class (an ImageFolder written class by class),
    the arrival order costs the first window class mixing: doubling slices lose less."""
    sizes = [1100] * 4
    labels = np.tile(np.repeat(np.arange(10), 110), 4)  # 10 classes in order in each shard
    q = {}
    for slices, spacing in ((1, "even"), (8, "even"), (8, "doubling")):
        options = PlanOptions(seed=1, arrival_slices=slices, arrival_spacing=spacing)
        plan = plan_epoch(sizes, options=options, epoch=0, topology=Topology(1)).per_rank[0]
        q[slices, spacing] = shuffle_quality(labels[plan], batch_size=64)
    assert q[8, "doubling"].quality > 1.5 * q[8, "even"].quality
    assert q[8, "doubling"].classes_per_batch > q[8, "even"].classes_per_batch
    assert q[1, "even"].quality > q[8, "doubling"].quality  # not free: the plain order mixes best


def test_later_epochs_keep_the_plain_window_shuffle_and_ranks_share_the_same_samples():
    assert np.array_equal(_order(1, epoch=1), _order(8, epoch=1))
    assert np.array_equal(_order(1, epoch=1), _order(8, epoch=1, windows="all"))
    every = [_order(8, world=4, rank=r, windows="all") for r in range(4)]
    assert sorted(np.concatenate(every)) == sorted(np.concatenate([_order(1, world=4, rank=r)
                                                                   for r in range(4)]))  # fmt: skip
    plain = [_order(1, world=4, rank=r) for r in range(4)]
    arrival = [_order(8, world=4, rank=r) for r in range(4)]
    # the node's stream is dealt round-robin: the ranks together read the same samples
    assert sorted(np.concatenate(plain)) == sorted(np.concatenate(arrival))
    assert all(len(a) == len(b) for a, b in zip(plain, arrival, strict=True))
    assert all(not np.array_equal(a, b) for a, b in zip(plain, arrival, strict=True))


def test_arrival_order_keeps_the_window_class_mixing():
    sizes = [500] * 16
    labels = np.repeat(np.arange(16), 500)  # one class per shard: the hardest case
    for world in (1, 4):
        plans = {
            (s, sp): plan_epoch(sizes, options=PlanOptions(seed=1, arrival_slices=s,
                                                           arrival_spacing=sp), epoch=0,
                                topology=Topology(world)).per_rank[0]
            for s, sp in ((1, "even"), (8, "even"), (8, "doubling"))
        }  # fmt: skip
        first = len(plans[1, "even"]) // 4  # window 0 of this rank
        q = {k: shuffle_quality(labels[p[:first]], batch_size=64) for k, p in plans.items()}
        for k in ((8, "even"), (8, "doubling")):
            assert q[k].classes_per_batch == q[1, "even"].classes_per_batch == 4
            assert q[k].quality >= 0.98 * q[1, "even"].quality


def test_all_windows_keep_the_epoch_class_mixing_where_a_shard_holds_one_class():
    """The project's measure over the whole first epoch (several windows), "all" against
    "first" and the plain order: where each shard holds one class (the hardest layout) the
    slices of every window lose nothing. Where a shard's samples are sorted by class the
    arrival order costs class mixing, now in every window of the first epoch, not only the
    first (``docs/LOADER.md``): doubling slices keep more of it than even ones."""
    sizes = [500] * 16
    labels = np.repeat(np.arange(16), 500)
    sorted_labels = np.tile(np.repeat(np.arange(10), 50), 16)  # 10 classes in order per shard
    for world in (1, 4):
        q, qs = {}, {}
        for slices, spacing, windows in (
            (1, "even", "first"), (8, "doubling", "first"), (8, "doubling", "all"),
            (8, "even", "all"),
        ):  # fmt: skip
            options = PlanOptions(seed=1, arrival_slices=slices, arrival_spacing=spacing,
                                  arrival_windows=windows)  # fmt: skip
            plan = plan_epoch(sizes, options=options, epoch=0, topology=Topology(world))
            q[slices, spacing, windows] = shuffle_quality(labels[plan.per_rank[0]], batch_size=64)
            qs[slices, spacing, windows] = shuffle_quality(
                sorted_labels[plan.per_rank[0]], batch_size=64
            )
        every, first, plain = (
            q[8, "doubling", "all"],
            q[8, "doubling", "first"],
            q[1, "even", "first"],
        )
        assert every.quality >= 0.99 * first.quality and every.quality >= 0.99 * plain.quality
        assert every.classes_per_batch >= 0.99 * plain.classes_per_batch
        # class-sorted shards: the cost, measured; doubling slices keep more of the mixing
        assert qs[8, "doubling", "all"].quality < qs[8, "doubling", "first"].quality
        assert qs[8, "doubling", "all"].quality > 1.25 * qs[8, "even", "all"].quality


def test_arrival_slices_is_checked_and_saved_and_old_states_keep_their_order(tmp_path):
    with pytest.raises(ValueError, match="arrival_slices must be >= 1, got 0"):
        PlanOptions(arrival_slices=0)
    make_image_dataset(str(tmp_path / "ds"), [40, 40, 40], size=16)
    loader = Loader(
        str(tmp_path / "ds"), batch_size=8, image_size=16, py_workers=1, arrival_windows="all"
    )
    state = loader.state_dict()
    assert state["arrival_slices"] == 8  # the default
    assert state["arrival_spacing"] == "doubling"  # the default
    with pytest.raises(ValueError, match="arrival_spacing must be one of"):
        PlanOptions(arrival_spacing="log")
    position = loader.position
    assert isinstance(position, Position)
    top = Topology(1)
    sliced = {**state, "segments": [[1, 1, 8]]}  # 8 samples consumed
    assert position.load_state_dict(sliced).arrival_slices == 8
    options = position.options
    expect = rank_plan(position.shard_sizes, options=options, epoch=0, topology=top, rank=0)
    assert np.array_equal(position.remaining(), expect.samples[8:])
    old = {k: v for k, v in sliced.items() if k != "arrival_slices"}  # saved before the option
    assert position.load_state_dict(old).arrival_slices == 1
    plain = dataclasses.replace(options, arrival_slices=1)
    expect = rank_plan(position.shard_sizes, options=plain, epoch=0, topology=top, rank=0)
    assert np.array_equal(position.remaining(), expect.samples[8:])
    assert not np.array_equal(
        rank_plan(position.shard_sizes, options=options, epoch=0, topology=top, rank=0).samples,
        expect.samples,
    )
    with pytest.raises(ValueError, match="'arrival_slices' must be an integer"):
        position.load_state_dict({**state, "arrival_slices": "8"})
    # a state saved before arrival_spacing cut the window in equal slices: it keeps them
    even = {k: v for k, v in sliced.items() if k != "arrival_spacing"}
    assert position.load_state_dict(even).arrival_spacing == "even"
    evenly = dataclasses.replace(options, arrival_spacing="even")
    expect = rank_plan(position.shard_sizes, options=evenly, epoch=0, topology=top, rank=0)
    assert np.array_equal(position.remaining(), expect.samples[8:])
    with pytest.raises(ValueError, match="'arrival_spacing' must be one of"):
        position.load_state_dict({**state, "arrival_spacing": "odd"})
    # a state saved before arrival_windows sliced only the first epoch's first window
    assert state["arrival_windows"] == "all"  # the keyword's (the default is "first")
    assert PlanOptions().arrival_windows == "first"
    with pytest.raises(ValueError, match=r"arrival_windows must be one of .*got 'last'"):
        PlanOptions(arrival_windows="last")
    assert position.load_state_dict(sliced).arrival_windows == "all"
    firstly = {k: v for k, v in sliced.items() if k != "arrival_windows"}
    assert position.load_state_dict(firstly).arrival_windows == "first"
    only_first = dataclasses.replace(options, arrival_windows="first")
    expect = rank_plan(position.shard_sizes, options=only_first, epoch=0, topology=top, rank=0)
    assert np.array_equal(position.remaining(), expect.samples[8:])
    with pytest.raises(ValueError, match="state field 'arrival_windows' must be one of"):
        position.load_state_dict({**state, "arrival_windows": 1})
    loader.close()


def _fetched(proxy, ds) -> dict[int, int]:
    """Bytes of each shard object the store was asked for (whole GETs count in full)."""
    got = {}
    for i, info in enumerate(ds.shards):
        reqs = [
            r for r in proxy.log(_object(ds, i)) if r.method == "GET" and r.path.endswith(".tar")
        ]
        got[i] = sum((r.range[1] - r.range[0]) if r.range else info.bytes for r in reqs)
    return got


def _object(ds, shard: int) -> str:
    """The shard's object path as the proxy sees it (bucket/prefix/name)."""
    return ds.shard_url(shard).split("://", 1)[1]


def _cold_first_batch(prefix, proxy, tmp, slices):
    """Bytes of each shard requested from the store when the first batch is in hand, the
    shards' sizes, and whether any shard was whole in the cache by then; then the epoch."""
    ds = Dataset.open(prefix, storage_options={"endpoint_url": proxy.endpoint})
    retry = RetryPolicy(attempts=4, base_delay=0.01, max_delay=0.05, deadline=10)
    cache = ShardCache(str(tmp), capacity=1 << 30, retry=retry, part_size="16KiB", concurrency=1)
    before = {i: len(proxy.log(_object(ds, i))) for i in range(len(ds.shards))}
    loader = Loader(ds, batch_size=16, image_size=16, cache=cache, seed=2, py_workers=1)
    if slices != loader.state_dict()["arrival_slices"]:
        loader.load_state_dict({**loader.state_dict(), "arrival_slices": slices})
    it = iter(loader)
    batch = next(it)
    landed = _fetched(proxy, ds)
    whole = any(cache.contains(ds, i) for i in range(len(ds.shards)))
    n = len(batch["label"]) + sum(len(b["label"]) for b in it)
    assert n == 384 and all(len(proxy.log(_object(ds, i))) > b for i, b in before.items())
    loader.close()
    cache.close()
    return landed, {i: s.bytes for i, s in enumerate(ds.shards)}, whole


def test_cold_first_batch_comes_before_the_window_has_landed(s3_store, proxy, tmp_path):
    """Bytes observed at the store, not the plan: with the arrival order the first batch is
    in hand when the front of each shard of the window has been fetched; with the plain
    window shuffle its random samples need parts from all over the window first."""
    proxy.delay = 0.02  # each request; one 16 KiB part in flight at a time
    got = {}
    for slices in (8, 1):  # the same dataset, a fresh store prefix and empty cache for each
        prefix = f"s3://flashfeed/arrival-{slices}-{tmp_path.name}"
        make_image_dataset(prefix, [96] * 4, size=64)
        got[slices] = _cold_first_batch(prefix, proxy, tmp_path / f"cache{slices}", slices)
    landed, size, whole = got[8]
    assert not whole  # no shard of the window (all four) had landed whole
    assert all(landed[i] < size[i] for i in size), (landed, size)
    assert sum(landed.values()) < sum(size.values()) / 3, (landed, size)
    assert sum(landed.values()) < sum(got[1][0].values()), (got[8], got[1])
