"""A process forked from one that fills (DALI's reader processes are forked) fills through
its own cache on connections of its own: no keep-alive connection of the parent's carries a
request of the child's, while both fill at once, against the real S3 server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from benchmarks.harness.slowproxy import SlowProxy
from flashfeed import Dataset, storage
from flashfeed.cache import ShardCache
from flashfeed.s3.directget import SignedObject, reader_for

from support.cache_data import make_dataset

SHARDS = 6


@pytest.fixture
def proxy(s3_store):
    p = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    yield p
    p.close()


def _fill_all(cache: ShardCache, ds: Dataset, shards: range) -> None:
    for i in shards:
        path = cache.get(ds, i)
        if Path(path).read_bytes() != ds.read_shard(i):
            raise AssertionError(f"shard {i} of {ds.url} came back wrong")


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the forked child did not finish its fill")


def test_a_forked_child_fills_on_connections_of_its_own(s3_prefix, proxy, tmp_path):
    opts = {"endpoint_url": proxy.endpoint}  # every request passes the proxy, which numbers
    for who in ("parent", "child"):  # the connections that carry them
        make_dataset(f"{s3_prefix}/{who}", shards=SHARDS, shard_bytes=150_000, seed=len(who))
    parent_ds = Dataset.open(f"{s3_prefix}/parent", storage_options=opts)
    fs, path = storage.filesystem(parent_ds.shard_url(0), opts)
    assert isinstance(reader_for(fs, path, connections=2), SignedObject)  # the path under test

    cache = ShardCache(tmp_path / "parent", capacity="64MiB", storage_options=opts)
    _fill_all(cache, parent_ds, range(0, 1))  # this thread now keeps a connection open
    pid = os.fork()
    if pid == 0:  # the child: its own cache, filled while the parent fills
        code = 1
        try:  # every request naming the child's dataset is the child's own
            child_ds = Dataset.open(f"{s3_prefix}/child", storage_options=opts)
            with ShardCache(tmp_path / "child", capacity="64MiB", storage_options=opts) as own:
                _fill_all(own, child_ds, range(SHARDS))
            code = 0
        finally:
            os._exit(code)
    try:
        _fill_all(cache, parent_ds, range(1, SHARDS))
    finally:
        code = _wait(pid, 120)
        cache.close()
    assert code == 0, "the child's fill failed"

    carried: dict[int, set[str]] = {}
    for req in proxy.requests:
        for who in ("parent", "child"):
            if f"/{who}/" in req.path:
                carried.setdefault(req.conn, set()).add(who)
    shared = {conn: who for conn, who in carried.items() if len(who) > 1}
    assert not shared, f"connections that carried both processes' requests: {shared}"
    assert any(who == {"child"} for who in carried.values())
    assert any(who == {"parent"} for who in carried.values())
    child_gets = [r for r in proxy.requests if "/child/" in r.path and r.path.endswith(".tar")]
    assert len(child_gets) >= SHARDS
