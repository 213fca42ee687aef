"""The cluster tier's faults under a training reader: a ``ShardDataset`` epoch over a cache
whose misses go to peers first, while a peer serves flipped bytes, is killed mid-transfer,
is cut off by a partition, or single-flights a shard and dies. In every case the epoch
delivers each sample exactly once, with the bytes the dataset holds (read from what was
delivered, against the shards' own tar members)."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

from flashfeed.cache import ShardCache
from flashfeed.cache.layout import DatasetDir, dataset_key
from flashfeed.cache.peer.client import PeerTier, rendezvous_owner
from flashfeed.dataset import Dataset
from flashfeed.loader import ShardDataset

from support.cache_data import PEER_TOKEN, behind_a_link, kill_when, make_dataset


def _expected(ds: Dataset) -> dict[str, str]:
    """Each sample's key (as the loader names it) -> the digest of its members' bytes,
    read from the shards' tar members."""
    out: dict[str, str] = {}
    for i, info in enumerate(ds.shards):
        members: dict[str, dict[str, bytes]] = {}
        with tarfile.open(fileobj=io.BytesIO(ds.read_shard(i))) as tar:
            for m in tar.getmembers():
                key, _, ext = m.name.partition(".")
                f = tar.extractfile(m)
                assert f is not None
                members.setdefault(key, {})[ext] = f.read()
        for key, got in members.items():
            out[f"{info.path}/{key}"] = _digest(got)
    return out


def _digest(members: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for ext in sorted(members):
        h.update(ext.encode() + b"\0" + members[ext])
    return h.hexdigest()


def _epoch(ds: Dataset, cache: ShardCache) -> dict[str, str]:
    """One epoch as a training process reads it: key -> digest, each key once."""
    reader = ShardDataset(ds, cache=cache, shuffle=False)
    out: dict[str, str] = {}
    try:
        for sample in reader:
            key = sample["__key__"]
            assert key not in out, f"{key} delivered twice"
            members = {k: bytes(v) for k, v in sample.items() if not k.startswith("__")}
            out[key] = _digest(members)
    finally:
        reader.close()
    return out


def _epoch_through(
    tier: PeerTier, ds: Dataset, store: str, root, killer=None, **cache_kw
) -> dict[str, int]:
    """An epoch over a cache in ``root`` whose misses go to ``tier``'s peers, then the
    store at ``store``, while ``killer`` (``kill_when``) strikes: checked to deliver each
    sample once with its bytes; the tier's counters after it."""
    try:
        with ShardCache(
            root, storage_options={"endpoint_url": store}, peers=tier, **cache_kw
        ) as cache:
            got = _epoch(ds, cache)
    finally:
        if killer is not None:
            killer.join()
    assert got == _expected(ds)
    return tier.stats()


def _flip(node, ds: Dataset, shard: int) -> None:
    path = DatasetDir(node.cache_dir, dataset_key(ds.url, ds.manifest)).shard_path(shard)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))


def test_an_epoch_through_a_peer_that_serves_flipped_bytes(s3_prefix, nodes, proxy, tmp_path):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=200_000)
    a = nodes("a", 2)
    a.call({"fetch": ds.url, "shards": [0, 1, 2, 3]})
    _flip(a, ds, 2)
    tier = PeerTier(peers=[a.address], token=PEER_TOKEN)
    assert _epoch_through(tier, ds, proxy.endpoint, tmp_path / "b")["corrupt_copies"] == 1
    assert proxy.shard_bytes() == ds.shards[2].bytes  # only the flipped one, again, from the store


def test_an_epoch_through_a_peer_killed_mid_transfer(s3_prefix, nodes, proxy, tmp_path):
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=800_000, per_shard=8)
    a = nodes("a", 2, serve_rate=400_000)  # serves slowly: the kill lands mid-transfer
    a.call({"fetch": ds.url, "shards": [0, 1, 2]})
    tier = PeerTier(peers=[a.address], token=PEER_TOKEN)

    killer = kill_when(a, lambda: tier.stats().get("bytes_from_peers", 0) > 0)
    stats = _epoch_through(tier, ds, proxy.endpoint, tmp_path / "b", killer, part_size="256KiB")
    assert a.proc.returncode == -9 and stats["peers_dropped"] >= 1
    assert 0 < stats["bytes_from_peers"] < sum(s.bytes for s in ds.shards)
    assert proxy.shard_bytes() == stats["bytes_from_store"]


def test_an_epoch_across_a_partition(s3_prefix, nodes, proxy, tmp_path):
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=200_000)
    a = nodes("a", 2)
    a.call({"fetch": ds.url, "shards": [0, 1, 2]})
    with behind_a_link(a) as (link, tier):
        assert tier.holdings()  # A's announcement, learnt before the link goes down
        link.delay = 60.0  # the partition: nothing crosses the link any more
        stats = _epoch_through(tier, ds, proxy.endpoint, tmp_path / "b")
    assert stats["peers_dropped"] >= 1
    assert proxy.shard_bytes() == sum(s.bytes for s in ds.shards)  # all of it from the store


def test_an_epoch_while_the_node_that_single_flights_a_shard_dies(
    s3_prefix, nodes, proxy, tmp_path
):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=600_000)
    a = nodes("a", 2, store_rate=300_000)  # a slow store link: a's fills are still running
    key = dataset_key(ds.url, ds.manifest)
    assert rendezvous_owner([a.address], key, 0) == a.address  # the one peer owns every shard
    tier = PeerTier(peers=[a.address], token=PEER_TOKEN)

    killer = kill_when(a, lambda: a.proxy.shard_bytes() > 0)  # a single-flights: kill it
    stats = _epoch_through(tier, ds, proxy.endpoint, tmp_path / "b", killer)
    assert a.proc.returncode == -9
    assert stats["fills_asked"] >= 1 and stats["peers_dropped"] >= 1
    assert proxy.shard_bytes() == stats.get("bytes_from_store", 0)  # b took the store over
