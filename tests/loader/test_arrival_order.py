"""``PlanOptions(arrival_slices=n)``: the first epoch's first window read front to back in
``n`` slices of its shard pieces, so its first batches need only the front of every shard.
The order is a pure function of the plan inputs (resume stays exact) and keeps the window's
class mixing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flashfeed.loader import Loader
from flashfeed.loader.position import Position
from flashfeed.loader.shuffle_quality import shuffle_quality
from flashfeed.plan import PlanOptions, Topology, plan_epoch, rank_plan

from support.loader_helpers import make_image_dataset

SIZES = [100, 120, 90, 110, 100, 100, 80, 100]


def _order(slices: int, epoch: int = 0, world: int = 1, rank: int = 0) -> np.ndarray:
    options = PlanOptions(seed=5, arrival_slices=slices)
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


def test_later_epochs_keep_the_plain_window_shuffle_and_ranks_share_the_same_samples():
    assert np.array_equal(_order(1, epoch=1), _order(8, epoch=1))
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
            s: plan_epoch(sizes, options=PlanOptions(seed=1, arrival_slices=s), epoch=0,
                          topology=Topology(world)).per_rank[0]
            for s in (1, 8)
        }  # fmt: skip
        first = len(plans[1]) // 4  # window 0 of this rank
        q = {s: shuffle_quality(labels[p[:first]], batch_size=64) for s, p in plans.items()}
        assert q[8].classes_per_batch == q[1].classes_per_batch == 4
        assert q[8].quality >= 0.98 * q[1].quality


def test_arrival_slices_is_checked_and_saved_and_old_states_keep_their_order(tmp_path):
    with pytest.raises(ValueError, match="arrival_slices must be >= 1, got 0"):
        PlanOptions(arrival_slices=0)
    make_image_dataset(str(tmp_path / "ds"), [40, 40, 40], size=16)
    loader = Loader(str(tmp_path / "ds"), batch_size=8, image_size=16, py_workers=1)
    state = loader.state_dict()
    assert state["arrival_slices"] == 1  # the default: the plain window shuffle
    position = loader.position
    assert isinstance(position, Position)
    sliced = {**state, "arrival_slices": 8, "segments": [[1, 1, 8]]}  # 8 samples consumed
    assert position.load_state_dict(sliced).arrival_slices == 8
    options = dataclasses.replace(position.options, arrival_slices=8)
    top = Topology(1)
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
    loader.close()
