"""A cold first batch holds the rest of the download: until it is made, the cache starts no
GET for bytes that only later batches need (``PartQueue.hold``, ``ShardCache.hold_fetches``,
``StreamFeeder.hold_ahead``), so its own bytes get every request and its decode the CPU.

The unit tests drive ``RangedFetcher`` with a fetch function that records the ranges asked
for; the loader test reads the real S3 server through ``slowproxy.SlowProxy``.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from benchmarks.harness.slowproxy import SlowProxy
from flashfeed.cache import ShardCache
from flashfeed.cache.fetch.aimd import AdaptiveLimit
from flashfeed.cache.fetch.ranged import RangedFetcher
from flashfeed.dataset import Dataset
from flashfeed.loader import Loader
from flashfeed.loader.passorder import make_pass_order
from flashfeed.loader.readahead import StreamFeeder
from flashfeed.s3.retry import RetryPolicy

from support.loader_helpers import make_image_dataset

FAST = RetryPolicy(attempts=3, base_delay=0.001, max_delay=0.01, deadline=10)
PART = 512


def _fill(fetcher: RangedFetcher, data: bytes, need: list[int], asked: list[int]):
    buf = bytearray(len(data))
    lock = threading.Lock()

    def fetch(start: int, end: int) -> bytes:
        with lock:
            asked.append(start // PART)
        return data[start:end]

    def write(offset: int, chunk: bytes) -> None:
        buf[offset : offset + len(chunk)] = chunk

    t = threading.Thread(
        target=fetcher.fetch_into,
        args=(fetch, len(data), write),
        kwargs={"priority": lambda off: need[off // PART]},
    )
    t.start()
    return t, buf


def _until(cond, what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.002)


def test_held_parts_wait_until_release_and_the_needed_ones_go_first():
    data = bytes(range(256)) * 16  # 8 parts of 512
    need = [0, 9, 2, 14, 1, 7, 3, 11]
    asked: list[int] = []
    with RangedFetcher(part_size=PART, limit=AdaptiveLimit(2), retry=FAST) as fetcher:
        fetcher.queue.hold(3, seconds=60)
        t, buf = _fill(fetcher, data, need, asked)
        allowed = {i for i, n in enumerate(need) if n <= 3}
        _until(lambda: len(asked) >= len(allowed), "the needed parts were never asked for")
        time.sleep(0.2)  # time enough for a held part to be (wrongly) started
        assert sorted(asked) == sorted(allowed)
        assert t.is_alive()
        fetcher.queue.release()
        t.join(10)
    assert bytes(buf) == data
    assert sorted(asked) == list(range(8))
    assert set(asked[: len(allowed)]) == allowed


def test_a_hold_ends_by_itself():
    data = bytes(range(256)) * 8  # 4 parts
    asked: list[int] = []
    with RangedFetcher(part_size=PART, limit=AdaptiveLimit(2), retry=FAST) as fetcher:
        fetcher.queue.hold(0, seconds=0.3)  # never released: the parts start once it ends
        t, buf = _fill(fetcher, data, [0, 5, 6, 7], asked)
        t.join(10)
        assert not t.is_alive()
    assert bytes(buf) == data and sorted(asked) == [0, 1, 2, 3]


def test_a_trickle_runs_held_parts_one_at_a_time_in_need_order():
    """``hold(..., trickle=1)``: the parts no first batch needs still download while the
    hold lasts, never more than one at a time, in need order."""
    data = bytes(range(256)) * 16  # 8 parts of 512
    need = [0, 9, 2, 14, 1, 7, 3, 11]
    held = {i for i, n in enumerate(need) if n > 3}
    lock = threading.Lock()
    running: set[int] = set()
    most = [0]
    order: list[int] = []

    def fetch(start: int, end: int) -> bytes:
        part = start // PART
        with lock:
            order.append(part)
            running.add(part)
            most[0] = max(most[0], len(running & held))
        time.sleep(0.02)  # long enough for a second held part to start beside it, wrongly
        with lock:
            running.discard(part)
        return data[start:end]

    buf = bytearray(len(data))

    def write(offset: int, chunk: bytes) -> None:
        buf[offset : offset + len(chunk)] = chunk

    with RangedFetcher(part_size=PART, limit=AdaptiveLimit(4), retry=FAST) as fetcher:
        fetcher.queue.hold(3, seconds=60)  # every part queued before the trickle begins
        t = threading.Thread(
            target=fetcher.fetch_into,
            args=(fetch, len(data), write),
            kwargs={"priority": lambda off: need[off // PART]},
        )
        t.start()
        _until(lambda: fetcher.queue.pending() == len(held), "the held parts never queued")
        time.sleep(0.05)
        assert not set(order) & held
        fetcher.queue.hold(3, seconds=60, trickle=1)
        t.join(10)  # never released: the trickle alone brings every part
        assert not t.is_alive()
    assert bytes(buf) == data
    assert most[0] == 1
    assert sorted(order[: len(need) - len(held)]) == sorted(set(range(8)) - held)
    assert order[len(need) - len(held) :] == sorted(held, key=lambda i: need[i])


def test_hold_refuses_a_bad_trickle():
    with RangedFetcher(part_size=PART, limit=AdaptiveLimit(2), retry=FAST) as fetcher:
        for bad in (-1, 1.5, True):
            with pytest.raises(ValueError, match="trickle must be an integer >= 0"):
                fetcher.queue.hold(3, seconds=1, trickle=bad)  # type: ignore[arg-type]


def test_hold_refuses_negative_seconds(tmp_path):
    with (
        ShardCache(str(tmp_path / "c"), capacity=1 << 20) as cache,
        pytest.raises(ValueError, match="seconds must be >= 0, got -1"),
    ):
        cache.hold_fetches(2, seconds=-1)


@pytest.fixture
def proxy(s3_store):
    p = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    yield p
    p.close()


def _first_batch_gets(
    s3_prefix: str, proxy: SlowProxy, tmp_path, monkeypatch, *, build_delay: float = 0.0
) -> tuple[list[tuple[str, int]], set[tuple[str, int]], set[tuple[str, int]], int]:
    """A cold loader through the proxy (4 shards, a window of 3, a fetch ahead of the 4th):
    the (shard, part) GETs sent before its first batch was made, the parts that the hold
    lets through (those of batches 0 to lookahead + 1: the first run, and what the wait
    after it asks for), those of them no batch of the first run needs, and the parts of
    all shards. The epoch must deliver every sample
    once. ``build_delay``: seconds added to the pipeline's build."""
    from flashfeed.loader.image.dali_runner import DaliRunner

    make_image_dataset(s3_prefix, [64, 64, 64, 64], classes=10)
    ds = Dataset.open(s3_prefix, storage_options={"endpoint_url": proxy.endpoint})
    cache = ShardCache(
        str(tmp_path / "cache"), capacity=1 << 30, part_size="4KiB", concurrency=2, retry=FAST
    )
    at_release: list[int] = []
    real = StreamFeeder.release_ahead
    build = DaliRunner.start

    def release(self: StreamFeeder) -> None:
        if self._holding:
            at_release.append(len(proxy.requests))
        real(self)

    def slow_build(self: DaliRunner, order: object) -> float:
        time.sleep(build_delay)
        return float(build(self, order))  # type: ignore[arg-type]

    monkeypatch.setattr(StreamFeeder, "release_ahead", release)
    monkeypatch.setattr(DaliRunner, "start", slow_build)
    loader = Loader(
        ds, batch_size=8, image_size=16, cache=cache, shuffle=True, window=3, py_workers=0,
        fields={"image": "jpg", "label": "cls", "raw": "jpg"},
    )  # fmt: skip
    plan = make_pass_order(
        loader.position.remaining(), loader.position.shard_sizes,
        batch_size=loader.batch_size, drop_last=loader.drop_last,
    )  # fmt: skip
    index = {s: ds.read_index(s) for s in range(len(ds.shards))}

    def parts_of(batches: int) -> set[tuple[str, int]]:
        n = batches * loader.batch_size
        rows = zip(plan.shards[:n].tolist(), plan.rows[:n].tolist(), strict=True)
        return {
            (ds.shards[s].path.rsplit("/", 1)[1], p)
            for s, r in rows
            for p in range(index[s][r].start // 4096, (index[s][r].end - 1) // 4096 + 1)
        }

    allowed = parts_of(loader._lookahead() + 2)  # batches 0..lookahead + 1
    soon = allowed - parts_of(loader._lookahead() + 1)  # not of the first run's batches
    batches = list(loader)
    loader.close()
    cache.close()
    assert len(at_release) == 1
    before = [
        (r.path.rsplit("/", 1)[1], r.range[0] // 4096)
        for r in proxy.requests[: at_release[0]]
        if r.method == "GET" and r.path.endswith(".tar") and r.range
    ]
    delivered = [k for b in batches for k in b["__key__"]]
    assert len(delivered) == len(plan.ids) == len(set(delivered))
    labels = np.concatenate([b["label"].numpy() for b in batches])
    assert labels.min() >= 0 and labels.max() < 10
    total_parts = sum(-(-info.bytes // 4096) for info in ds.shards)
    return before, allowed, soon, total_parts


def test_a_cold_first_batch_asks_only_for_its_own_bytes_until_it_is_made(
    s3_prefix, proxy, tmp_path, monkeypatch
):
    """By default (no trickle), every shard GET sent before the first batch was made holds
    a sample of the batches the first run and the wait after it read; the epoch still
    delivers every sample."""
    before, allowed, soon, total_parts = _first_batch_gets(
        s3_prefix, proxy, tmp_path, monkeypatch, build_delay=0.5
    )
    assert before and set(before) <= allowed
    assert len(before) < total_parts // 2  # the rest waited for the first batch
    assert soon and set(before) & soon  # what batch 1's wait asks for was not held


def test_a_trickle_keeps_the_download_going_while_a_slow_first_batch_is_made(
    s3_prefix, proxy, tmp_path, monkeypatch
):
    """With a trickle of one GET, parts that the hold keeps back are fetched while the
    first batch is made (here a pipeline build 0.5 s slower): the download does not stand
    idle until then, and the parts the hold lets through still went."""
    monkeypatch.setattr("flashfeed.loader.readahead._HOLD_TRICKLE", 1)
    before, allowed, _, _ = _first_batch_gets(
        s3_prefix, proxy, tmp_path, monkeypatch, build_delay=0.5
    )
    assert set(before) & allowed
    assert set(before) - allowed


def test_the_first_gets_are_sent_before_the_pipeline_is_built(
    s3_prefix, proxy, tmp_path, monkeypatch
):
    """The pipeline's build keeps the fetch threads from running: a cold loader waits
    (briefly) until each of its first batch's shards has its index and its first GETs are
    out, then builds. Observed at the store: ranged GETs of every shard of batch 0 arrived
    before the build began."""
    from flashfeed.loader.image.dali_runner import DaliRunner

    proxy.delay = 0.02  # each request: the index alone takes a round trip
    make_image_dataset(s3_prefix, [48, 48, 48], classes=10)
    ds = Dataset.open(s3_prefix, storage_options={"endpoint_url": proxy.endpoint})
    cache = ShardCache(
        str(tmp_path / "cache"), capacity=1 << 30, part_size="4KiB", concurrency=4, retry=FAST
    )
    at_build: list[int] = []
    real = DaliRunner.start

    def start(self: DaliRunner, order: object) -> float:
        at_build.append(len(proxy.requests))
        return float(real(self, order))  # type: ignore[arg-type]

    monkeypatch.setattr(DaliRunner, "start", start)
    loader = Loader(ds, batch_size=8, image_size=16, cache=cache, window=3, py_workers=0)
    plan = make_pass_order(
        loader.position.remaining(), loader.position.shard_sizes,
        batch_size=loader.batch_size, drop_last=loader.drop_last,
    )  # fmt: skip
    first = {ds.shards[s].path.rsplit("/", 1)[1] for s in set(plan.shards[:8].tolist())}
    n = sum(len(b["label"]) for b in loader)
    loader.close()
    cache.close()
    assert n == len(plan.ids) and at_build
    sent = {
        r.path.rsplit("/", 1)[1]
        for r in proxy.requests[: at_build[0]]
        if r.method == "GET" and r.path.endswith(".tar") and r.range
    }
    assert first <= sent
