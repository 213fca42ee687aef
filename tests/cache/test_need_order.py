"""Need order: the parts of every shard in flight are fetched in one priority order.

The unit tests drive ``RangedFetcher`` with a fetch function that records the ranges asked
for; the end-to-end test reads a shuffled plan through the real S3 server and the cache.
"""

from __future__ import annotations

import threading
import time

import pytest

from benchmarks.harness.slowproxy import SlowProxy
from flashfeed import storage
from flashfeed.cache import ShardCache, ShardNeed
from flashfeed.cache.fetch.aimd import AdaptiveLimit
from flashfeed.cache.fetch.needorder import PartPriority, part_priorities
from flashfeed.cache.fetch.ranged import RangedFetcher
from flashfeed.dataset import Dataset
from flashfeed.format.wdsindex import Component, SampleIndex
from flashfeed.loader import Loader
from flashfeed.loader.passorder import make_pass_order
from flashfeed.s3.retry import RetryPolicy

from support.loader_helpers import make_image_dataset

FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.01, deadline=10)


class Recorder:
    """A store of named objects whose first request blocks until released."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, int]] = []
        self.gate = threading.Event()
        self.lock = threading.Lock()

    def fetch_of(self, name: str, data: bytes):
        def fetch(start: int, end: int) -> bytes:
            with self.lock:
                self.asked.append((name, start))
                first = len(self.asked) == 1
            if first:
                assert self.gate.wait(10)
            return data[start:end]

        return fetch


def _fill_in_thread(fetcher, fetch, data, priority, out):
    buf = bytearray(len(data))

    def write(offset: int, chunk: bytes) -> None:
        buf[offset : offset + len(chunk)] = chunk

    def run() -> None:
        fetcher.fetch_into(fetch, len(data), write, priority=priority)
        out.append(bytes(buf))

    t = threading.Thread(target=run)
    t.start()
    return t


def _wait_queued(fetcher, n: int) -> None:
    deadline = time.monotonic() + 10
    while fetcher.queue.pending() < n:
        assert time.monotonic() < deadline, "parts never queued"
        time.sleep(0.001)


def test_parts_of_two_shards_are_fetched_in_need_order_across_shards():
    a = bytes(range(256)) * 16  # 4096 bytes: 8 parts of 512
    b = bytes(reversed(range(256))) * 16
    # the batch that first needs each part; shard b's parts interleave with a's
    need_a = [0, 5, 9, 2, 14, 7, 11, 3]
    need_b = [1, 4, 6, 8, 10, 12, 13, 15]
    store = Recorder()
    out: list[bytes] = []
    with RangedFetcher(part_size=512, limit=AdaptiveLimit(1), retry=FAST) as fetcher:
        ta = _fill_in_thread(
            fetcher, store.fetch_of("a", a), a, lambda off: need_a[off // 512], out
        )
        _wait_queued(fetcher, 7)  # one thread holds a's most urgent part at the gate
        tb = _fill_in_thread(
            fetcher, store.fetch_of("b", b), b, lambda off: need_b[off // 512], out
        )
        _wait_queued(fetcher, 15)
        store.gate.set()
        ta.join(10)
        tb.join(10)
    assert sorted(out) == sorted([a, b])
    assert store.asked[0] == ("a", 0)  # batch 0: taken before b's parts were queued
    expected = sorted(
        [("a", i * 512, n) for i, n in enumerate(need_a)]
        + [("b", i * 512, n) for i, n in enumerate(need_b)],
        key=lambda x: x[2],
    )
    assert store.asked == [(name, off) for name, off, _ in expected]


def test_ties_keep_the_order_parts_were_submitted_in():
    data = bytes(4096)
    store = Recorder()
    out: list[bytes] = []
    with RangedFetcher(part_size=1024, limit=AdaptiveLimit(1), retry=FAST) as fetcher:
        t = _fill_in_thread(fetcher, store.fetch_of("x", data), data, lambda off: 3.0, out)
        _wait_queued(fetcher, 3)
        store.gate.set()
        t.join(10)
    assert [off for _, off in store.asked] == [0, 1024, 2048, 3072]


def test_fills_of_equal_need_advance_side_by_side_front_first():
    # two shards needed by the same batch: their parts alternate, each shard's front first,
    # so fewer parts overtake a part of their own shard (those are hashed from the file)
    a, b = bytes(range(256)) * 8, bytes(reversed(range(256))) * 8  # 4 parts of 512 each
    store = Recorder()
    out: list[bytes] = []
    with RangedFetcher(part_size=512, limit=AdaptiveLimit(1), retry=FAST) as fetcher:
        ta = _fill_in_thread(fetcher, store.fetch_of("a", a), a, lambda off: 2.0, out)
        _wait_queued(fetcher, 3)  # a's first part holds the only slot, at the gate
        tb = _fill_in_thread(fetcher, store.fetch_of("b", b), b, lambda off: 2.0, out)
        _wait_queued(fetcher, 7)
        store.gate.set()
        ta.join(10)
        tb.join(10)
    assert sorted(out) == sorted([a, b])
    assert store.asked == [
        ("a", 0), ("b", 0), ("a", 512), ("b", 512),
        ("a", 1024), ("b", 1024), ("a", 1536), ("b", 1536),
    ]  # fmt: skip


def _sample(start: int, size: int) -> SampleIndex:
    return SampleIndex(f"k{start}", (Component("jpg", start, size, f"k{start}.jpg"),))


def test_part_priorities_follow_the_first_batch_that_needs_a_sample_in_the_part():
    # four samples over three parts of 100 bytes; sample 1 straddles parts 0 and 1
    index = [_sample(0, 50), _sample(60, 80), _sample(150, 40), _sample(210, 50)]
    need = ShardNeed.build(rows=[2, 1], batches=[4, 7])
    got = part_priorities(index, need, size=300, part_size=100)
    assert got.tolist() == [7.0, 4.0, 7.0]  # part 2: no needed sample -> the last batch
    need = ShardNeed.build(rows=[1, 3, 0], batches=[2, 9, 5])
    assert part_priorities(index, need, size=300, part_size=100).tolist() == [2.0, 2.0, 9.0]
    # a sample straddling into a part gives it its batch even when the part it starts in
    # already has that batch from another sample
    both = ShardNeed.build(rows=[0, 1, 3], batches=[0, 0, 9])
    assert part_priorities(index, both, size=300, part_size=100).tolist() == [0.0, 0.0, 9.0]
    before = PartPriority(need, default=float("inf"))
    assert before(0) == before(250) == 2.0  # the shard's first need until the index is in
    before.learn_index(index, size=300, part_size=100)
    assert [before(0), before(150), before(250)] == [2.0, 2.0, 9.0]
    assert PartPriority(None, default=-1.0)(123) == -1.0


def test_a_need_must_be_well_formed():
    with pytest.raises(ValueError, match="as long"):
        ShardNeed.build([1, 2], [0])
    with pytest.raises(ValueError, match="at least one row"):
        ShardNeed.build([], [])
    with pytest.raises(ValueError, match=">= 0"):
        ShardNeed.build([-1], [0])


@pytest.fixture
def proxy(s3_store):
    p = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    yield p
    p.close()


def _tar_bytes_asked(proxy, path: str) -> int:
    reqs = [r for r in proxy.log(path) if r.method == "GET" and r.path.endswith(".tar")]
    return sum(r.range[1] - r.range[0] for r in reqs if r.range)


def test_a_shuffled_first_batch_is_served_before_its_shards_are_complete(
    s3_prefix, proxy, tmp_path
):
    """Through the real S3 server: the first batch is in hand while its shards still
    arrive, and every sample delivered is the stored shard's bytes."""
    proxy.delay = 0.03  # a slow store: each request
    make_image_dataset(s3_prefix, [96, 96, 96], classes=10)
    ds = Dataset.open(s3_prefix, storage_options={"endpoint_url": proxy.endpoint})
    cache = ShardCache(
        str(tmp_path / "cache"), capacity=1 << 30, part_size="4KiB", concurrency=2, retry=FAST
    )
    loader = Loader(
        ds, batch_size=8, image_size=16, cache=cache, shuffle=True, window=3, py_workers=0,
        readahead=0, fields={"image": "jpg", "label": "cls", "raw": "jpg"},
    )  # fmt: skip
    plan = make_pass_order(
        loader.position.remaining(), loader.position.shard_sizes,
        batch_size=loader.batch_size, drop_last=loader.drop_last,
    )  # fmt: skip
    first_shards = sorted(set(plan.shards[:8].tolist()))
    it = iter(loader)
    batch = next(it)
    # counters, not clocks: with batch 0 in hand its shards are neither cached nor all read
    asked = sum(_tar_bytes_asked(proxy, ds.shards[s].path) for s in first_shards)
    assert not all(cache.contains(ds, s) for s in first_shards)
    assert asked < sum(ds.shards[s].bytes for s in first_shards)
    batches = [batch, *it]
    stats = loader.stats()
    loader.close()
    assert stats["readahead"]["batches_served_while_arriving"] >= 1
    stored = {
        s: storage.read_bytes(ds.shard_url(s), storage_options=ds.storage_options)
        for s in range(len(ds.shards))
    }
    index = {s: ds.read_index(s) for s in range(len(ds.shards))}
    delivered = [bytes(x.numpy()) for b in batches for x in b["raw"]]
    assert len(delivered) == len(plan.ids)
    for blob, s, r in zip(delivered, plan.shards.tolist(), plan.rows.tolist(), strict=True):
        c = next(c for c in index[s][r].components if c.ext == "jpg")
        assert blob == stored[s][c.offset : c.offset + c.size]
    # one GET per byte: each shard's ranges were asked for exactly once, in all
    for info in ds.shards:
        assert _tar_bytes_asked(proxy, info.path) == info.bytes
    # need order: once the indexes were in (a few parts go before, in submission order),
    # the parts holding batch 0's samples were asked for before the rest of all shards
    part = 4096
    asked = [
        (r.path.rsplit("/", 1)[1], r.range[0] // part)
        for r in proxy.requests
        if r.method == "GET" and r.path.endswith(".tar") and r.range
    ]
    first = {
        (ds.shards[s].path.rsplit("/", 1)[1], p)
        for s, r in zip(plan.shards[:8].tolist(), plan.rows[:8].tolist(), strict=True)
        for p in range(index[s][r].start // part, (index[s][r].end - 1) // part + 1)
    }
    last_needed = max(asked.index(p) for p in first)
    slack = 4 * len(first_shards)  # parts taken before a shard's index had arrived
    assert last_needed < len(first) + slack < len(asked) // 2
    cache.close()


def _shard_parts_need(windows: str) -> tuple[list[list[int]], list[list[float]]]:
    """The second window's shards of a first epoch and each one's part priorities, derived
    as the loader's read-ahead derives them (``StreamFeeder._tell_need``: the plan's pass
    order, each sample's batch), 100 samples of 1 KiB per shard, 10 KiB parts."""
    import numpy as np

    from flashfeed.plan.plan import PlanOptions, Topology, rank_plan

    sizes = np.array([100] * 8)
    options = PlanOptions(seed=3, window=4, arrival_windows=windows)
    ids = rank_plan(sizes, options=options, epoch=0, topology=Topology(1), rank=0).samples
    order = make_pass_order(ids, sizes, batch_size=10, drop_last=True)
    shards, first = order.shard_order()
    later = shards[4:]  # window 1: the shards first needed after window 0's
    index = [_sample(1024 * r, 1024) for r in range(100)]
    out = []
    for shard in later:
        pos = np.flatnonzero(order.shards == shard)
        need = ShardNeed.build(order.rows[pos], order.batch_of(pos))
        out.append(part_priorities(index, need, size=102400, part_size=10240).tolist())
    return [later, first[4:]], out


def test_every_first_epoch_window_asks_the_front_of_its_shards_first():
    """With every window of the first epoch in arrival slices the need order of a later
    window's shards, which the fill follows, asks the front part of each of them before any
    shard's back half; a window shuffled whole needs every part from its first batches."""
    (_, first_batches), every = _shard_parts_need("all")
    window_start = min(first_batches)
    fronts = [p[0] for p in every]
    backs = [min(p[5:]) for p in every]  # the back half of each shard
    assert max(fronts) < min(backs), (fronts, backs)
    assert max(fronts) - window_start < 3  # the window's first batches need only fronts
    (_, first_batches), whole = _shard_parts_need("first")
    window_start = min(first_batches)
    # shuffled whole: within its first 3 batches (30 samples of 400) most parts are needed
    assert sum(p - window_start < 3 for parts in whole for p in parts) > 10
    assert min(min(p[5:]) for p in whole) - window_start < 3
