"""The reserved run as users live it, on a simulated cluster (tests/cluster.py): ingest on
Ray, warm every node, stop the object store, train with torchrun on 2 nodes from their
caches through the outage, lose a node, bring the store back, warm the new node from its
peers' caches (the cluster tier), resume on 3.

The cluster's nodes are namespaces on this machine, each with its own address, cache tmpfs
and counting S3 proxy, so the test can tell what each node fetched from the store.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from flashfeed import Dataset, storage
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.cli.devstore import EmbeddedStore
from flashfeed.ingest.samplecorpus import make_imagefolder
from flashfeed.loader.telemetry.ledger import check_exactly_once, key_hash, read_ledger

from support.cluster import MARKER, SimCluster, bytes_read, free_port, namespaces_available
from support.journey import keys_of, kill_node_run, logs, manifest_gets, torchrun, wait_for

pytestmark = pytest.mark.slow

_WHY_NOT = namespaces_available()
needs_namespaces = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))


_WHOAMI = (
    "import os, socket, s3fs\n"
    "d = os.environ['FLASHFEED_CACHE_DIR']\n"
    "open(os.path.join(d, 'mine'), 'w').write(socket.gethostname())\n"
    "fs = s3fs.S3FileSystem()\n"
    "fs.pipe('flashfeed/' + os.environ['FFT_PREFIX'] + '/' + socket.gethostname(), b'x')\n"
    "print(socket.gethostname(), sorted(os.listdir(d)))\n"
)


@needs_namespaces
def test_cluster_comes_up_and_goes_down_cleanly(cluster: SimCluster, s3_prefix: str) -> None:
    nodes = [cluster.add_node(), cluster.add_node()]
    prefix = s3_prefix.removeprefix("s3://flashfeed/")
    for node in nodes:
        proc = cluster.run(
            node, [sys.executable, "-c", _WHOAMI], timeout=60, env={"FFT_PREFIX": prefix}
        )
        assert proc.returncode == 0, proc.stderr
        # its own hostname, and a cache that no other node sees
        assert proc.stdout.split() == [node.hostname, "['mine']"]
    for node in nodes:
        puts = [r.path for r in node.proxy.since() if r.method == "PUT"]
        assert puts == [f"/flashfeed/{prefix}/{node.hostname}"]  # through its own proxy only

    cluster.start_ray()
    seen = cluster.ray_nodes()
    assert sorted(str(n["address"]) for n in seen) == [n.address for n in nodes]
    assert any("raylet" in cmd for _, marker, cmd in cluster.survivors() if "node1" in marker)
    # Ray listens on every interface; the cluster's own network keeps that off this machine's
    assert not cluster.host_listeners()

    cluster.stop_ray()
    left = [p for p in cluster.survivors() if "raylet" in p[2] or "gcs_server" in p[2]]
    assert not left, f"Ray processes outlived the stop: {left}"


# -- the journey ----------------------------------------------------------------------------
CLASSES, PER_CLASS, PER_SHARD = 4, 24, 8  # 96 samples in 12 shards
BATCH, CKPT_EVERY = 4, 3
# 96 samples: an epoch is 6 steps on 4 ranks (2 nodes x 2) and 4 steps on 6 ranks. Training
# holds after step 10 (epoch 1, batch 4); the last checkpoint is step 9 (epoch 1, batch 3):
# 48 samples of epoch 1 are trained, step 10's 16 are replayed after the restart, and the
# remaining 48 split evenly over 6 ranks (2 batches each), so nothing is dropped.
HOLD_AFTER, EPOCHS = 10, 3


def _shard_of(key: str) -> str:
    return key.rsplit("/", 1)[0]


@needs_namespaces
def test_journey_ingest_warm_train_lose_a_node_resume_on_three(
    cluster: SimCluster, s3_store: EmbeddedStore, s3_prefix: str, tmp_path: Path
) -> None:
    try:
        _journey(cluster, s3_store, s3_prefix, tmp_path)
    finally:
        if not s3_store.ready():  # the outage ends with the test, whatever happened
            s3_store.start()


def _journey(cluster: SimCluster, s3_store: EmbeddedStore, s3_prefix: str, tmp_path: Path) -> None:
    t0 = time.monotonic()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = round(time.monotonic() - t0 - sum(timings.values()), 1)

    # a raw corpus on S3, not on any node's disk
    src = make_imagefolder(tmp_path / "raw", classes=CLASSES, per_class=PER_CLASS, size=(24, 24))
    raw, ds = f"{s3_prefix}/raw", f"{s3_prefix}/ds"
    for path in sorted(src.rglob("*.jpg")):
        storage.put_file(str(path), f"{raw}/{path.relative_to(src).as_posix()}")
    n0, n1 = cluster.add_node(), cluster.add_node()
    address = cluster.start_ray()
    lap("cluster up")

    # 1. ingest as a Ray job of the cluster; its shard tasks write through their node's proxy
    marks = [n.proxy.mark() for n in cluster.nodes]
    argv = ["flashfeed", "ingest", raw, ds, "--samples-per-shard", str(PER_SHARD)]
    argv += ["--ray-address", address, "--progress", "none", "--json"]
    done = cluster.run(n0, argv, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    dataset = Dataset.open(ds)
    sizes = {
        "/" + dataset.shard_url(i).split("://", 1)[1]: s.bytes for i, s in enumerate(dataset.shards)
    }
    assert len(sizes) == CLASSES * PER_CLASS // PER_SHARD
    writers = {
        n.index: {r.path for r in n.proxy.since(m) if r.method == "PUT" and r.path in sizes}
        for n, m in zip(cluster.nodes, marks, strict=True)
    }
    assert all(writers.values()), f"shard tasks ran on one node only: {writers}"
    assert set().union(*writers.values()) == set(sizes)
    lap("ingest")

    # 2. warm every node, node ranks in torchrun's order (node i is --node-rank i)
    marks = [n.proxy.mark() for n in cluster.nodes]
    argv = ["flashfeed", "cache", "warm", ds, "--ray-address", address]
    argv += ["--hosts", ",".join(n.address for n in cluster.nodes)]
    argv += ["--ranks-per-node", "2", "--epochs", str(EPOCHS - 1), "--json", "--no-progress"]
    argv += ["--capacity", "64MiB"]
    done = cluster.run(n0, argv, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    warmed = {
        n.index: bytes_read(n.proxy.since(m), sizes)
        for n, m in zip(cluster.nodes, marks, strict=True)
    }
    for i, fetched in warmed.items():
        assert fetched, f"node {i} warmed nothing"
        twice = {p: n for p, n in fetched.items() if n != sizes[p]}
        assert not twice, f"node {i} fetched shards more than once: {twice}"
    lap("warm")

    # the outage: the store stops after the warm; the warmed nodes train from their caches
    s3_store.stop()
    assert not s3_store.ready()

    # 3. train on 2 nodes x 2 ranks; every rank holds after step HOLD_AFTER
    ckpt, keys = str(tmp_path / "ckpt"), str(tmp_path / "keys")
    common = [ds, "--ckpt-dir", ckpt, "--keys-dir", keys, "--epochs", str(EPOCHS)]
    common += ["--batch-size", str(BATCH), "--ckpt-every", str(CKPT_EVERY)]
    marks = [n.proxy.mark() for n in cluster.nodes]
    port = free_port(n0.address, cluster.netns)
    args = [*common, "--ledger-dir", str(tmp_path / "ledger1")]
    args += ["--hold-after-step", str(HOLD_AFTER), "--hold-node", "1"]
    runs = [torchrun(cluster, n, nnodes=2, port=port, phase="train1", args=args) for n in (n0, n1)]
    held = lambda: len(glob.glob(os.path.join(keys, "held-rank*"))) == 4  # noqa: E731
    try:
        wait_for(held, runs, "2 nodes x 2 ranks training to the hold")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs(cluster, 'train1')}") from None
    train1 = [
        bytes_read(n.proxy.since(m), sizes) for n, m in zip(cluster.nodes, marks, strict=True)
    ]
    pairs = list(zip(cluster.nodes, marks, strict=True))
    manifests1 = [manifest_gets(n.proxy.since(m)) for n, m in pairs]
    lap("train 2x2")

    # 4. SIGKILL every rank of node 1; torchrun ends the rest (node 0's ranks fail their barrier)
    kill_node_run(cluster, runs, 1)
    lap("crash")
    s3_store.start()  # the store is back before the new node, whose cache is cold, joins
    # its objects read back a moment after it answers again: until then a GET fails and is
    # retried, which the new node's manifest count below would take for extra reads
    wait_for(lambda: _readable(f"{ds}/manifest.json"), [], "the store's objects after its restart")
    lap("store back")

    # 5. restart on 3 nodes x 2 ranks from the last checkpoint; finish that epoch and one more
    n2 = cluster.add_node()
    cluster.start_ray([n2])
    lap("node 2 joins")

    # 5a. the survivors serve their caches to the cluster; the new node warms its share from
    # them and takes from the store only shards that no surviving node holds
    token = {"FLASHFEED_PEER_TOKEN": "journey-cluster-token-0123456789"}
    peers = [f"{n.address}:{free_port(n.address, cluster.netns)}" for n in (n0, n1)]
    serve = [sys.executable, "-m", "flashfeed.cache.peer", "serve"]
    serve += ["--cache-dir", cluster.cache_dir]
    servers = [
        cluster.popen(
            n,
            [*serve, "--listen", peer],
            env={**token, MARKER: f"{cluster.tag}:node{n.index}:peers"},
            log=os.path.join(cluster.root, f"peers-node{n.index}.log"),
        )
        for n, peer in zip((n0, n1), peers, strict=True)
    ]
    serving = lambda: all(  # noqa: E731
        '"address"' in Path(cluster.root, f"peers-node{i}.log").read_text() for i in (0, 1)
    )
    wait_for(serving, servers, "the survivors' peer servers")
    mark = n2.proxy.mark()
    argv = ["flashfeed", "cache", "warm", ds, "--cache-dir", cluster.cache_dir]
    argv += ["--node-rank", "2", "--num-nodes", "3", "--ranks-per-node", "2"]
    argv += ["--epochs", str(EPOCHS), "--capacity", "64MiB", "--json", "--no-progress"]
    argv += ["--peers", ",".join(peers)]
    done = cluster.run(n2, argv, timeout=300, env=token)
    assert done.returncode == 0, done.stdout + done.stderr
    warm2 = bytes_read(n2.proxy.since(mark), sizes)
    manifest_warm2 = manifest_gets(n2.proxy.since(mark))
    held = set(warmed[0]) | set(warmed[1])
    share2 = NodeShare.build(node_rank=2, num_nodes=3, ranks_per_node=2, epochs=EPOCHS)
    share_paths = {"/" + dataset.shard_url(i).split("://", 1)[1] for i in share2.order(dataset)}
    assert warm2 == {p: sizes[p] for p in share_paths - held}, "the warm took store bytes"
    from_peers = json.loads(done.stdout)[0]["peers"]["bytes_from_peers"]
    assert from_peers == sum(sizes[p] for p in share_paths & held)
    for proc in servers:
        cluster.kill_group(proc)
        proc.wait(timeout=10)
    lap("node 2 warms from peers")
    marks = [n.proxy.mark() for n in cluster.nodes]
    port = free_port(n0.address, cluster.netns)
    args = [*common, "--ledger-dir", str(tmp_path / "ledger2")]
    runs = [
        torchrun(cluster, n, nnodes=3, port=port, phase="train2", args=args) for n in cluster.nodes
    ]
    for proc in runs:
        proc.wait(timeout=300)
    assert [p.returncode for p in runs] == [0, 0, 0], logs(cluster, "train2")
    train2 = [
        bytes_read(n.proxy.since(m), sizes) for n, m in zip(cluster.nodes, marks, strict=True)
    ]
    pairs = list(zip(cluster.nodes, marks, strict=True))
    manifests2 = [manifest_gets(n.proxy.since(m)) for n, m in pairs]
    left = cluster.wait_gone(":train2", timeout=10)
    assert not left, f"processes of the finished run outlived it: {left}"
    lap("train 3x2")

    def short(paths: dict[str, int] | set[str]) -> set[str]:
        """``/bucket/.../ds/shards/000003.tar`` -> ``shards/000003.tar``, as in ``__key__``."""
        return {p.split("/ds/", 1)[1] for p in paths}

    # -- the ledgers: every sample of each epoch exactly once across the crash -----------------
    # Rule: the crashed run counts only up to its last complete checkpoint (step 9): what it
    # delivered after (step 10) is replayed by the restart. Epochs trained whole on one
    # topology drop N mod (ranks x batch) samples with drop_last (0 here); the epoch resumed
    # on a new world size drops fewer than (new ranks x batch) (0 here, by the sizes above).
    received = keys_of(keys)
    ckpt_step = (HOLD_AFTER // CKPT_EVERY) * CKPT_EVERY
    kept = [r for r in received if r[0] != "ws4-from000000" or r[2] <= ckpt_step]
    assert {r[0] for r in received} == {"ws4-from000000", f"ws6-from{ckpt_step:06d}"}
    assert max(r[2] for r in received if r[0] == "ws4-from000000") == HOLD_AFTER
    replayed = {r[3] for r in received if r[0] == "ws4-from000000" and r[2] > ckpt_step}
    assert replayed == {1}, "the crash was not in the middle of epoch 1"
    n_samples = dataset.manifest.num_samples
    every = {r[4] for r in kept}
    assert len(every) == n_samples
    assert {_shard_of(k) for k in every} <= short(sizes), "keys of no shard of the dataset"
    by_epoch = {e: [key_hash(r[4]) for r in kept if r[3] == e] for e in range(EPOCHS)}
    checks = check_exactly_once(by_epoch, every, epochs=range(EPOCHS))
    assert all(c.ok for c in checks.values()), "\n".join(map(str, checks.values()))
    # the Loader's own ledgers (written from __key__) hold exactly what the ranks received
    runs_ = {"ws4-from000000": "ledger1", f"ws6-from{ckpt_step:06d}": "ledger2"}
    for run, ledger_dir in runs_.items():
        ledger = {e: sorted(h) for e, h in read_ledger(str(tmp_path / ledger_dir)).items()}
        mine = {
            e: sorted(key_hash(r[4]) for r in received if r[0] == run and r[3] == e) for e in ledger
        }
        assert ledger == mine, f"the Loader's ledger of {run} is not what its ranks received"

    # -- what each node fetched ---------------------------------------------------------------
    # the manifest (header and shard table) reaches a node once, not once per rank
    for phase, gets in (("train 2x2", manifests1), ("train 3x2", manifests2)):
        for i, (headers, tables) in enumerate(gets):
            assert headers <= 1 and tables <= 1, f"{phase}: node {i} fetched the manifest twice"
    assert manifest_warm2 == (1, 1)  # the new node: once, at its warm (from the store:
    assert manifests2[2] == (0, 0)  # the version check is a HEAD), then its node's copy

    read_by = {
        (run, node): {_shard_of(r[4]) for r in received if (r[0], r[1]) == (run, node)}
        for run, node in {(r[0], r[1]) for r in received}
    }

    # the outage: each rank of the warmed nodes said once that it read the node's copy
    offline = f"object store unreachable: reading version {dataset.manifest.digest}"
    for i in (0, 1):
        text = Path(cluster.root, f"train1-node{i}.log").read_text()
        assert text.count(offline) == 2, text[-3000:]
    for i in (0, 1):
        assert not train1[i], f"warmed node {i} fetched while training: {train1[i]}"
        assert read_by[("ws4-from000000", i)] <= short(warmed[i])
    new = train2[2]
    assert all(new[p] == sizes[p] for p in new), f"node 2 fetched a shard twice: {new}"
    # what its warm did not bring, it fetched on first read, once
    assert short(new) == read_by[(f"ws6-from{ckpt_step:06d}", 2)] - short(share_paths)
    assert not set(new) & set(warm2), "node 2 fetched a warmed shard again"
    for i in (0, 1):
        assert short(train2[i]) <= read_by[(f"ws6-from{ckpt_step:06d}", i)]
        total = Counter(warmed[i]) + Counter(train2[i])
        assert all(total[p] == sizes[p] for p in total), f"node {i} fetched a shard twice"

    # -- the warm record and the capacity belong to the cache ----------------------------------
    mismatch = "this node reads shards it was not warmed with"
    log = {
        (p, i): Path(cluster.root, f"{p}-node{i}.log").read_text()
        for p, i in [("train1", 0), ("train1", 1), ("train2", 0), ("train2", 1), ("train2", 2)]
    }
    assert not any(mismatch in log[("train1", i)] for i in (0, 1)), "warned on a matching run"
    for i in (0, 1):  # warmed for 2 nodes, resumed on 3: each rank says so once
        assert log[("train2", i)].count(mismatch) == 2, log[("train2", i)][-3000:]
        assert "number of nodes" in log[("train2", i)]
    assert mismatch not in log[("train2", 2)]  # warmed for the run it joined
    for node in (n0, n1):
        status = cluster.run(
            node, ["flashfeed", "cache", "status", cluster.cache_dir, "--json"], timeout=60
        )
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["capacity"] == 64 * 2**20

    cluster.stop_ray()
    left = cluster.wait_gone(timeout=10)
    assert not left, f"processes of the cluster outlived it: {left}"
    lap("stop")
    print("journey timings (s):", timings)


def _readable(url: str) -> bool:
    """True once the store serves the object at ``url`` (read here, through no node's proxy)."""
    try:
        storage.read_bytes(url)
    except Exception:
        return False
    return True
