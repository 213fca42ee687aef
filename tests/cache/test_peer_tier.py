"""The cluster tier on real processes: a miss reads from a peer before the store, a corrupt
copy or a dying peer never puts a wrong byte in a fill, and concurrent misses on one shard
single-flight at one node. Each node is a process on its own 127.0.0.N address whose
store requests pass a counting proxy of its own (``benchmarks.harness.peercluster``)."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from flashfeed import storage
from flashfeed.cache import ShardCache
from flashfeed.cache.layout import DatasetDir, dataset_key
from flashfeed.cache.peer.announce import encode_held, encoded_size
from flashfeed.cache.peer.auth import load_token, sign, verify
from flashfeed.cache.peer.client import PeerTier, rendezvous_owner
from flashfeed.cache.peer.clusterwarm import cluster_placement, plan_store_reads, store_owners
from flashfeed.cache.peer.discovery import peers_from, peers_from_ray
from flashfeed.cache.peer.server import PeerServer
from flashfeed.cache.peer.shardset import ShardSet
from flashfeed.cache.warm.cluster import warm_node
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.runtime.lifeline import popen

from support.cache_data import PEER_TOKEN, behind_a_link, kill_when, make_dataset

TOKEN = PEER_TOKEN


def _good(cache: ShardCache, ds, shards) -> None:
    for i in shards:
        assert storage.file_checksum(cache.get(ds, i)) == ds.shards[i].checksum


def test_announcements_round_trip_and_stay_small():
    rng = np.random.default_rng(1)
    for count, k in [(1_000_000, 1_000), (1_000_000, 600_000), (7, 0), (7, 7), (1, 1)]:
        held = rng.choice(count, k, replace=False)
        blob = encode_held(held, count)
        assert ShardSet.from_blob(blob, count).array().tolist() == sorted(held.tolist())
    # a node's share of a 1,000-node job over a million shards: about 2 KiB, not a bitmap's 122
    assert encoded_size(rng.choice(1_000_000, 1_000, replace=False), 1_000_000) < 2500
    with pytest.raises(ValueError, match=r"shard numbers must be in \[0, 5\)"):
        encode_held([5], 5)
    with pytest.raises(ValueError, match="beyond the dataset"):
        ShardSet.from_blob(encode_held([9], 10), 5)


def test_requests_are_signed_with_the_cluster_token(tmp_path, monkeypatch):
    header = sign(TOKEN, "GET", "/v1/have")
    assert verify(TOKEN, "GET", "/v1/have", header)
    assert not verify(TOKEN, "GET", "/v1/shard/x/1", header)  # bound to its path
    assert not verify(b"another-token-0123456789", "GET", "/v1/have", header)
    assert not verify(TOKEN, "GET", "/v1/have", header, now=time.time() + 600)  # too old
    assert not verify(TOKEN, "GET", "/v1/have", None)
    monkeypatch.delenv("FLASHFEED_PEER_TOKEN", raising=False)
    with pytest.raises(ValueError, match="no peer token"):
        load_token()
    path = tmp_path / "token"
    path.write_text("x" * 20)
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by group or others"):
        load_token(token_file=str(path))
    path.chmod(0o600)
    assert load_token(token_file=str(path)) == b"x" * 20

    with PeerServer(cache_dir=str(tmp_path / "c"), token=TOKEN) as server:
        host, port = server.address.split(":")

        def status(auth: str | None) -> int:
            conn = http.client.HTTPConnection(host, int(port), timeout=5)
            conn.request("GET", "/v1/have", headers={"Authorization": auth} if auth else {})
            code = conn.getresponse().status
            conn.close()
            return code

        assert status(None) == 401
        assert status(sign(b"not-the-cluster-token-42", "GET", "/v1/have")) == 401
        assert status(sign(TOKEN, "GET", "/v1/have")) == 200
        assert server.refused == 2
        tier = PeerTier(peers=[server.address], token=TOKEN)
        (tmp_path / "manifest.json").write_text("{}")  # beside the cache root, not in it
        for path in ("/v1/shard/../0", "/v1/index/./0", "/v1/shard/x/y/0", "/v1/other"):
            assert tier.request(server.address, "GET", path).status == 404, path


def test_a_miss_reads_from_the_peer_that_holds_it(s3_prefix, nodes, proxy, tmp_path):
    ds = make_dataset(s3_prefix, shards=4, shard_bytes=300_000)
    a = nodes("a", 2)
    a.call({"fetch": ds.url, "shards": [0, 1, 2, 3]})
    assert a.proxy.shard_bytes() == sum(s.bytes for s in ds.shards)

    tier = PeerTier(peers=[a.address], token=TOKEN)
    with ShardCache(
        tmp_path / "b",
        storage_options={"endpoint_url": proxy.endpoint},
        peers=tier,
        part_size="128KiB",
    ) as cache:
        _good(cache, ds, range(4))
    assert proxy.shard_bytes() == 0 and proxy.log(".idx") == []  # nothing from the store
    assert tier.stats()["bytes_from_peers"] == sum(s.bytes for s in ds.shards)
    assert a.call({"stats": True})["served"] == sum(s.bytes for s in ds.shards)


def test_a_corrupt_copy_is_caught_and_that_peer_not_trusted_with_the_shard(
    s3_prefix, nodes, proxy, tmp_path
):
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=200_000)
    a = nodes("a", 2)
    a.call({"fetch": ds.url, "shards": [0, 1, 2]})
    held = DatasetDir(a.cache_dir, dataset_key(ds.url, ds.manifest)).shard_path(1)
    with open(held, "r+b") as f:  # the peer's disk flips a byte of its copy
        f.seek(100_000)
        byte = f.read(1)
        f.seek(100_000)
        f.write(bytes([byte[0] ^ 0x10]))

    tier = PeerTier(peers=[a.address], token=TOKEN)
    with ShardCache(
        tmp_path / "b", storage_options={"endpoint_url": proxy.endpoint}, peers=tier
    ) as cache:
        _good(cache, ds, [1])
        assert tier.stats()["corrupt_copies"] == 1
        assert proxy.shard_bytes() == ds.shards[1].bytes  # read again, from the store
        served = a.call({"stats": True})["served"]
        os.unlink(cache.get(ds, 1))  # lost here: the next fill skips that peer for shard 1
        _good(cache, ds, [1, 0])
        assert a.call({"stats": True})["served"] == served + ds.shards[0].bytes
        assert proxy.shard_bytes() == 2 * ds.shards[1].bytes
        assert cache.stats()["corrupt_refetches"] == 1


def test_a_peer_killed_mid_transfer_is_dropped_and_the_fill_goes_on(
    s3_prefix, nodes, proxy, tmp_path
):
    ds = make_dataset(s3_prefix, shards=1, shard_bytes=1_200_000, per_shard=8)
    a = nodes("a", 2, serve_rate=400_000)  # serves slowly: the kill lands mid-transfer
    a.call({"fetch": ds.url, "shards": [0]})
    tier = PeerTier(peers=[a.address], token=TOKEN)

    killer = kill_when(a, lambda: tier.stats().get("bytes_from_peers", 0) > 0)
    with ShardCache(
        tmp_path / "b",
        storage_options={"endpoint_url": proxy.endpoint},
        peers=tier,
        part_size="512KiB",
    ) as cache:
        _good(cache, ds, [0])
    killer.join()
    stats = tier.stats()
    assert a.proc.returncode == -9
    assert stats["peers_dropped"] >= 1
    assert 0 < stats["bytes_from_peers"] < ds.shards[0].bytes
    assert stats["bytes_from_peers"] + stats["bytes_from_store"] == ds.shards[0].bytes
    assert proxy.shard_bytes() == stats["bytes_from_store"]


def test_concurrent_misses_single_flight_at_one_node(s3_prefix, nodes):
    ds = make_dataset(s3_prefix, shards=10, shard_bytes=250_000)
    cluster = [nodes(n, i + 2, store_rate=4_000_000) for i, n in enumerate("abc")]
    for node in cluster:
        node.call({"peers": [n.address for n in cluster]})
    for node in cluster:  # all three miss every shard at once
        node.send({"fetch": ds.url, "shards": list(range(10))})
    for node in cluster:
        node.answer()
    store = [n.proxy.shard_bytes() for n in cluster]
    assert sum(store) == sum(s.bytes for s in ds.shards)  # each shard left the store once
    assert sum(1 for b in store if b) >= 2  # and the store reads were spread over nodes
    for node in cluster:
        d = DatasetDir(node.cache_dir, dataset_key(ds.url, ds.manifest))
        for i, info in enumerate(ds.shards):
            assert storage.file_checksum(d.shard_path(i)) == info.checksum


def test_when_the_node_that_single_flights_a_shard_dies_another_takes_over(s3_prefix, nodes):
    ds = make_dataset(s3_prefix, shards=8, shard_bytes=600_000)
    a = nodes("a", 2, store_rate=300_000)  # a slow store link: a's fill is still running
    b = nodes("b", 3)
    for node in (a, b):
        node.call({"peers": [a.address, b.address]})
    key = dataset_key(ds.url, ds.manifest)
    shard = next(
        i for i in range(8) if rendezvous_owner([a.address, b.address], key, i) == a.address
    )
    b.send({"fetch": ds.url, "shards": [shard]})
    deadline = time.monotonic() + 20
    while a.proxy.shard_bytes() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    a.kill()
    out = b.answer()
    assert out["stats"]["fills_asked"] >= 1 and out["stats"]["peers_dropped"] >= 1
    assert b.proxy.shard_bytes() == ds.shards[shard].bytes  # b took the store read over
    d = DatasetDir(b.cache_dir, key)
    assert storage.file_checksum(d.shard_path(shard)) == ds.shards[shard].checksum


def test_a_sweeps_warm_reads_each_shard_from_the_store_at_the_node_the_plan_chose(s3_prefix, nodes):
    ds = make_dataset(s3_prefix, shards=9, shard_bytes=150_000)
    cluster = [nodes(n, i + 2, store_rate=3_000_000) for i, n in enumerate("abc")]
    addresses = [n.address for n in cluster]
    shares = {
        a: NodeShare.build(node_rank=0, num_nodes=1, seed=run) for run, a in enumerate(addresses)
    }
    placement = cluster_placement(ds, shares, max_serving=2)
    owners = store_owners(placement)
    assert sorted(placement.store_reads().values()) == [3, 3, 3]
    for node in cluster:
        node.call({"peers": addresses})
        node.call({"assign": ds.url, "owners": {str(s): a for s, a in owners.items()}})
    for node in cluster:  # three runs of a sweep warm their shares at once
        node.send({"fetch": ds.url, "shards": shares[node.address].order(ds)})
    for node in cluster:
        node.answer()
    for node in cluster:
        mine = [s for s, a in owners.items() if a == node.address]
        assert node.proxy.shard_bytes() == sum(ds.shards[s].bytes for s in mine)
        d = DatasetDir(node.cache_dir, dataset_key(ds.url, ds.manifest))
        for i, info in enumerate(ds.shards):
            assert storage.file_checksum(d.shard_path(i)) == info.checksum


def test_a_partition_between_two_nodes_falls_back_to_the_store(s3_prefix, nodes, proxy, tmp_path):
    """B reaches A's server only through a proxy; the partition makes the proxy hold every
    request unanswered (dropped packets): B gives up on A within its timeout, marks it down
    and reads from the store, every byte still checked."""
    ds = make_dataset(s3_prefix, shards=3, shard_bytes=200_000)
    a = nodes("a", 2)
    a.call({"fetch": ds.url, "shards": [0, 1, 2]})
    with behind_a_link(a) as (link, tier):
        with ShardCache(
            tmp_path / "b", storage_options={"endpoint_url": proxy.endpoint}, peers=tier
        ) as cache:
            _good(cache, ds, [0])
            assert proxy.shard_bytes() == 0  # over the link, from A
            link.delay = 60.0  # the partition: nothing crosses the link any more
            start = time.monotonic()
            _good(cache, ds, [1])  # A still announced as holding it: tried, timed out, dropped
            assert tier.stats()["peers_dropped"] >= 1
            tier.announce_ttl = 0.0
            _good(cache, ds, [2])  # the announcement times out: A is left out at once
            assert time.monotonic() - start < 15
        assert tier.stats()["peers_down"] >= 1
        assert proxy.shard_bytes() == ds.shards[1].bytes + ds.shards[2].bytes


def test_a_standalone_node_serves_its_cache_and_refuses_a_bad_token_file(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHFEED_PEER_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_bytes(TOKEN)
    token_file.chmod(0o600)
    cmd = [sys.executable, "-m", "flashfeed.cache.peer", "serve", "--cache-dir"]
    cmd += [str(tmp_path / "c"), "--listen", "127.0.0.5:0", "--hosts", "127.0.0.6,127.0.0.7:9"]
    proc = popen([*cmd, "--token-file", str(token_file)], stdout=subprocess.PIPE, text=True)
    try:
        address = json.loads(proc.stdout.readline())["address"]
        tier = PeerTier(peers=[address], token=TOKEN)
        assert tier.holdings() == {address: {}}  # signed, answered: an empty cache
    finally:
        proc.kill()
        proc.wait()
    token_file.chmod(0o644)
    bad = subprocess.run(
        [*cmd, "--token-file", str(token_file)], capture_output=True, text=True, timeout=60
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"flashfeed peer: peer token file {token_file} is readable by group or others "
        f"(mode 0644): `chmod 600 {token_file}`"
    ]


def test_peers_are_found_where_cache_warm_finds_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHFEED_PEERS", "node1,10.0.0.2:7000,fe80::1")
    assert peers_from(port=7460) == ["node1:7460", "10.0.0.2:7000", "[fe80::1]:7460"]
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes in rank order\nnode7 slots=8\nnode8\n")
    assert peers_from(hostfile=str(hostfile), port=9) == ["node7:9", "node8:9"]
    assert peers_from(hosts="a,b:1", port=2) == ["a:2", "b:1"]
    raw = [
        {"NodeID": "b", "Alive": True, "NodeManagerAddress": "10.1.0.2"},
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.1.0.1"},
        {"NodeID": "c", "Alive": False, "NodeManagerAddress": "10.1.0.3"},
    ]
    assert peers_from_ray(raw, port=7460) == ["10.1.0.1:7460", "10.1.0.2:7460"]
    with pytest.raises(ValueError, match=r"port must be in 1\.\.65535, got 0"):
        peers_from(hosts="a", port=0)


def test_cache_warm_with_peers_takes_from_the_store_only_what_no_peer_holds(
    s3_prefix, nodes, proxy, tmp_path, s3_store
):
    """A replacement node's ``cache warm --peers``: its share from the surviving peers, the
    store only for shards none of them holds (counted at the new node's proxy)."""
    ds = make_dataset(s3_prefix, shards=6, shard_bytes=150_000)
    a, b = nodes("a", 2), nodes("b", 3)
    a.call({"fetch": ds.url, "shards": [0, 1, 2]})
    b.call({"fetch": ds.url, "shards": [2, 3]})
    env = {**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint}
    argv = [sys.executable, "-m", "flashfeed.cli", "cache", "warm", ds.url, "--cache-dir"]
    argv += [str(tmp_path / "new"), "--json", "--no-progress", "--no-shuffle"]
    argv += ["--peers", f"{a.address},{b.address}"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)[0]
    assert proxy.shard_bytes() == ds.shards[4].bytes + ds.shards[5].bytes  # none held them
    assert result["peers"]["bytes_from_peers"] == sum(ds.shards[i].bytes for i in range(4))
    d = DatasetDir(str(tmp_path / "new"), dataset_key(ds.url, ds.manifest))
    for i, info in enumerate(ds.shards):
        assert storage.file_checksum(d.shard_path(i)) == info.checksum


def test_an_index_from_a_peer_must_be_the_verified_shards_own(s3_prefix, nodes, proxy, tmp_path):
    """The manifest has no checksum of an index: one from a peer is checked against the tar
    headers of the verified shard; a peer's altered index fails the fill like bad bytes."""
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=100_000)
    a = nodes("a", 2)
    a.call({"fetch": ds.url, "shards": [0, 1]})
    idx = DatasetDir(a.cache_dir, dataset_key(ds.url, ds.manifest)).shard_path(0) + ".idx"
    text = open(idx).read()
    lines = text.splitlines()
    first = lines[1].split()
    first[1] = str(int(first[1]) + 512)  # the first member's offset moved by one tar block
    with open(idx, "w") as f:
        f.write("\n".join([lines[0], " ".join(first), *lines[2:]]) + "\n")

    tier = PeerTier(peers=[a.address], token=TOKEN)
    with ShardCache(
        tmp_path / "b", storage_options={"endpoint_url": proxy.endpoint}, peers=tier
    ) as cache:
        _good(cache, ds, [0, 1])
        assert open(cache.get(ds, 0) + ".idx").read() == text  # the store's, not the peer's
        assert open(cache.get(ds, 1) + ".idx").read() != text
    assert tier.stats()["corrupt_copies"] == 1
    assert proxy.shard_bytes() == ds.shards[0].bytes and len(proxy.log(".idx")) == 1


def test_a_cluster_warm_task_reads_peers_copies_and_its_planned_store_reads(
    s3_prefix, nodes, proxy, tmp_path
):
    """A cluster warm's task on node 1 (``warm_node``, as Ray runs it) with ``--peers``: what
    node 0 holds comes from node 0, the rest from the store at node 1, the node the placement
    chose (not handed to node 0 by a hash: it would keep shards it never reads)."""
    ds = make_dataset(s3_prefix, shards=16, shard_bytes=60_000)
    shares = [NodeShare.build(node_rank=r, num_nodes=2) for r in (0, 1)]
    theirs = list(dict.fromkeys(shares[1].order(ds)))
    a = nodes("a", 2)
    a.call({"fetch": ds.url, "shards": theirs[:3]})  # node 0 holds 3 of node 1's shards
    before = a.proxy.shard_bytes()
    spec = {"peers": [a.address, "127.0.0.3:9"], "self": None, "ranked": True}
    spec = plan_store_reads(ds.url, spec, shares, None)
    assert {spec["owners"][s] for s in theirs} == {"127.0.0.3:9"}
    out = warm_node(
        ds.url,
        str(tmp_path / "b"),
        shares[1],
        {"peers": spec, "storage_options": {"endpoint_url": proxy.endpoint}},
    )
    assert "error" not in out, out
    assert out["peers"]["bytes_from_peers"] == sum(ds.shards[s].bytes for s in theirs[:3])
    assert proxy.shard_bytes() == sum(ds.shards[s].bytes for s in theirs[3:])
    assert a.proxy.shard_bytes() == before  # node 0 was asked for nothing else
    with pytest.raises(ValueError, match="--peers names 1 nodes but the cluster warm has 2"):
        plan_store_reads(ds.url, {"peers": [a.address]}, shares, None)


def test_a_node_serves_at_most_max_streams_copies_at_once(s3_prefix, proxy, tmp_path):
    """Beyond ``max_streams`` responses at once a node answers 503, and ``rate`` paces what
    it serves. A fill that meets the busy node waits for it, and never goes to the store
    for it: the shard still leaves the store once."""
    ds = make_dataset(s3_prefix, shards=2, shard_bytes=400_000)
    with ShardCache(tmp_path / "a") as held:
        _good(held, ds, [0, 1])
    key = dataset_key(ds.url, ds.manifest)
    with PeerServer(
        cache_dir=str(tmp_path / "a"), token=TOKEN, max_streams=1, rate=100_000
    ) as server:
        tier = PeerTier(peers=[server.address], token=TOKEN)
        slow = tier.request(server.address, "GET", f"/v1/shard/{key}/0")
        assert slow.status == 206  # holds the one stream while its body is paced out
        start = time.monotonic()
        busy = tier.request(server.address, "GET", f"/v1/shard/{key}/1")
        assert busy.status == 503
        busy.close()
        with ShardCache(
            tmp_path / "b", storage_options={"endpoint_url": proxy.endpoint}, peers=tier
        ) as cache:
            filled: list[str] = []
            fill = threading.Thread(target=lambda: filled.append(cache.get(ds, 1)))
            fill.start()
            deadline = time.monotonic() + 3  # the one stream is held 4 s (400 kB at 100 kB/s)
            while not tier.stats().get("peers_busy") and time.monotonic() < deadline:
                time.sleep(0.01)
            assert not filled and tier.stats()["peers_busy"] >= 1  # waiting for the node
            assert len(slow.read()) == ds.shards[0].bytes
            assert time.monotonic() - start > 2
            slow.close()
            fill.join(30)
            assert storage.file_checksum(filled[0]) == ds.shards[1].checksum
        assert proxy.shard_bytes() == 0 and tier.stats().get("peers_dropped", 0) == 0
        assert tier.stats()["bytes_from_peers"] == ds.shards[1].bytes
