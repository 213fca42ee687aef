"""Announcements as versions: a reader that knows version V of a node gets only what changed
since, or the full announcement when the node's bounded log no longer reaches back to V."""

from __future__ import annotations

import json
import os
import time

import pytest

from benchmarks.harness.peercluster import start_node
from flashfeed.cache.layout import DatasetDir, dataset_key
from flashfeed.cache.peer.client import PeerTier
from flashfeed.cache.peer.holdings import HoldingsLog, apply, since_param

from support.cache_data import make_dataset

TOKEN = "delta-token-of-this-test-0123456789"


def _complete(state):
    return {k: sorted(h.complete) for k, h in state[2].items()}


def test_deltas_replay_every_change_and_fall_back_to_the_full_announcement():
    log = HoldingsLog(max_versions=3, max_changes=1000)
    steps = [
        {"a": (10, [1, 2])},
        {"a": (10, [1, 2, 3])},
        {"a": (10, [2, 3]), "b": (4, [0])},  # 1 evicted, a second dataset
        {"a": (10, [2, 3, 7]), "b": (4, [0])},
        {"a": (10, [2, 3, 7])},  # b's directory removed
        {"a": (12, [11])},  # a new version of a (another shard count)
    ]
    states = [apply(None, json.loads(log.body(None)))]
    for holdings in steps:
        log.update(holdings)
        assert log.update(holdings) == log.version  # no change: no new version
        want = {k: sorted(v) for k, (_, v) in holdings.items()}
        for known in states:
            body = json.loads(log.body(since_param(known[0], known[1])))
            # the versions within the log's reach get a delta; older ones the full
            assert body["full"] == (known[1] < log.floor), (known[1], log.floor)
            assert _complete(apply(known, body)) == want
        states.append(apply(states[-1], json.loads(log.body(since_param(*states[-1][:2])))))
        assert _complete(states[-1]) == want
    assert log.floor == log.version - 3
    # another instance of the server (restarted): its versions mean nothing here
    other = HoldingsLog()
    other.update({"a": (12, [5])})
    assert json.loads(other.body(since_param(log.instance, log.version)))["full"]
    with pytest.raises(ValueError, match="delta from another version"):
        apply((log.instance, 0, {}), json.loads(log.body(since_param(log.instance, 5))))


def test_the_log_is_bounded_by_changed_shards():
    log = HoldingsLog(max_changes=100)
    log.update({"a": (1000, range(50))})
    v = log.version
    log.update({"a": (1000, range(60))})
    assert log.delta(since_param(log.instance, v)) is not None
    log.update({"a": (1000, range(500))})  # 440 changes at once: over the bound alone
    assert log.floor == log.version  # only a reader already at the newest gets a delta
    assert log.delta(since_param(log.instance, v)) is None
    with pytest.raises(ValueError, match="max_versions and max_changes must be >= 1"):
        HoldingsLog(max_changes=0)


def test_a_peer_learns_a_new_shard_and_an_eviction_through_deltas(s3_prefix, s3_store, tmp_path):
    """Node A (its own process, a cache of room for two shards) fills a third shard, which
    evicts one: a reader that knew A's holdings learns both from a delta, not a full
    announcement."""
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=100_000)
    key = dataset_key(ds.url, ds.manifest)
    room = ds.shards[0].bytes + ds.shards[1].bytes + 4096
    os.environ["FLASHFEED_PEER_TOKEN"] = TOKEN
    a = start_node("a", "127.0.0.2", str(tmp_path / "a"), s3_store.info.s3_port, capacity=room)
    try:
        a.call({"fetch": ds.url, "shards": [0, 1]})
        tier = PeerTier(peers=[a.address], token=TOKEN.encode())
        assert tier.holdings(fresh=True)[a.address][key].complete == {0, 1}
        assert tier.stats()["announce_full"] == 1
        first_bytes = tier.stats()["announce_bytes"]
        a.call({"fetch": ds.url, "shards": [2]})
        d = DatasetDir(a.cache_dir, key)
        on_disk = {i for i in range(3) if os.path.exists(d.shard_path(i))}
        assert len(on_disk) == 2 and 2 in on_disk  # one of 0 and 1 was evicted
        for _ in range(100):  # A rebuilds its announcement at most every half second
            seen = tier.holdings(fresh=True)[a.address][key].complete
            if seen == on_disk:
                break
            time.sleep(0.1)
        assert seen == on_disk
        stats = tier.stats()
        assert stats["announce_full"] == 1 and stats["announce_delta"] >= 1
        assert stats.get("peers_down", 0) == 0 and stats["announce_bytes"] > first_bytes
    finally:
        a.stop()
        os.environ.pop("FLASHFEED_PEER_TOKEN", None)
