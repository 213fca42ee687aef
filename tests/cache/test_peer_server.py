"""A node's ``PeerServer`` answering a peer that asked it to fill a shard: the peer's read
that follows at once waits for that fill, even before the fill has made the dataset's folder
(the race that let a second node read the same shard from the store)."""

from __future__ import annotations

import threading
import time

from flashfeed import storage
from flashfeed.cache import ShardCache
from flashfeed.cache.layout import dataset_key
from flashfeed.cache.peer.client import PeerTier
from flashfeed.cache.peer.server import PeerServer

from support.cache_data import make_dataset

TOKEN = b"cluster-token-of-this-test-0123456789"


def test_a_read_right_after_a_fill_request_waits_for_the_fill_to_start(s3_prefix, tmp_path):
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=200_000)
    key = dataset_key(ds.url, ds.manifest)
    started = threading.Event()
    with ShardCache(tmp_path / "owner") as cache:

        def late_fill(dataset, shard):  # a fill that reaches the pool late (a busy node)
            started.set()
            time.sleep(0.5)
            cache.fetch(dataset, shard)

        with PeerServer(
            cache_dir=str(tmp_path / "owner"),
            token=TOKEN,
            fill=late_fill,
            open_dataset=cache.open_dataset,
        ) as server:
            tier = PeerTier(peers=[server.address], token=TOKEN)
            asked = tier.request(
                server.address, "POST", f"/v1/fill/{key}/1", body=f'{{"url": "{ds.url}"}}'.encode()
            )
            asked.read()
            assert asked.status == 202
            assert started.wait(5)
            got = tier.request(server.address, "GET", f"/v1/shard/{key}/1")
            body = got.read()
            got.close()
            assert got.status == 206
            assert storage.checksum(body) == ds.shards[1].checksum
            # a shard nobody asked for is still a plain miss
            other = tier.request(server.address, "GET", f"/v1/shard/{key}/0")
            other.read()
            assert other.status == 404
