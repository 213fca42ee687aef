"""A training loader on the cluster tier: its cache (and its reader processes, through the
cache's handle) read shards from a peer before the store; a peer's corrupt copy is caught
and the epoch still delivers every sample exactly once (the delivered keys, and the ledger
written from them, against the keys of the dataset's own indexes)."""

from __future__ import annotations

from collections import Counter

import pytest

from flashfeed.cache import ShardCache
from flashfeed.cache.layout import DatasetDir, dataset_key
from flashfeed.cache.peer.client import PeerTier
from flashfeed.dataset import Dataset
from flashfeed.loader import Loader
from flashfeed.loader.telemetry.ledger import check_exactly_once

from support.loader_helpers import image_keys, make_image_dataset
from support.peer_cluster import start_node
from support.slowproxy import SlowProxy

TOKEN = b"loader-cluster-token-0123456789"


@pytest.fixture
def peer(tmp_path, s3_store, monkeypatch):
    monkeypatch.setenv("FLASHFEED_PEER_TOKEN", TOKEN.decode())
    node = start_node("a", "127.0.0.2", str(tmp_path / "a"), s3_store.info.s3_port)
    yield node
    node.stop()


def test_a_loader_reads_through_peers_and_delivers_each_sample_once(
    s3_prefix, s3_store, peer, tmp_path
):
    make_image_dataset(s3_prefix, [12, 12, 12, 12], size=16)
    ds = Dataset.open(s3_prefix)
    peer.call({"fetch": ds.url, "shards": [0, 1, 2, 3]})
    held = DatasetDir(peer.cache_dir, dataset_key(ds.url, ds.manifest)).shard_path(2)
    with open(held, "r+b") as f:  # the peer's copy of shard 2 has a flipped byte
        f.seek(700)
        byte = f.read(1)
        f.seek(700)
        f.write(bytes([byte[0] ^ 1]))
    proxy = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    try:
        tier = PeerTier(peers=[peer.address], token=TOKEN)
        cache = ShardCache(
            str(tmp_path / "b"), storage_options={"endpoint_url": proxy.endpoint}, peers=tier
        )
        assert cache.handle().open().copies.peers.peers == [peer.address]  # reader processes
        loader = Loader(
            ds, batch_size=4, image_size=16, cache=cache, ledger_dir=str(tmp_path / "ledger"),
            py_workers=1, seed=3,
        )  # fmt: skip
        delivered = [k for batch in loader for k in batch["__key__"]]
        cache.close()
        keys = image_keys(s3_prefix)
        assert Counter(delivered) == Counter(keys)  # every sample once
        check = check_exactly_once(str(tmp_path / "ledger"), keys, epochs=[0])[0]
        assert check.ok, str(check)
        assert proxy.shard_bytes() == ds.shards[2].bytes  # the store served the corrupt one only
    finally:
        proxy.close()
