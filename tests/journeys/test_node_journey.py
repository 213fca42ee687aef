"""The node service's journey: two simulated nodes on this machine (a service each, its own
cache directory and socket, one SeaweedFS), two tenants (real Unix users) and three jobs.

alice warms her node's share of a dataset only she may read through node 0's service while
bob trains an epoch of a shared dataset through node 1's; alice's third job, a warm beyond
her quota, is refused in one line; node 1's service is SIGKILLed and bob's training resumes
from its checkpoint through node 0. Checked from what was delivered and what is on disk:
each job's keys once, no descriptor of alice's dataset ever handed to bob, and accounting
whose per-tenant rows add up to each node's totals and to the bytes on its disk."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections import Counter
from typing import Any

from flashfeed.cache.node import NodeClient
from flashfeed.cache.warm import NodeShare
from flashfeed.dataset import Dataset
from flashfeed.loader import ShardDataset

from support import REPO
from support.journey import wait_for
from support.node_journey import JourneyTenant

# the node tests' fixtures (real Unix users, a store with an identity per tenant, datasets)
_spec = importlib.util.spec_from_file_location(
    "node_conftest", REPO / "tests" / "cache" / "node" / "conftest.py"
)
_node = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_node)
tenant_users, node_store, datasets = _node.tenant_users, _node.node_store, _node.datasets
NodeProc = _node.NodeProc

ALICE, BOB = _node.USERS
SUMMED = ("resident_bytes", "pinned_bytes", "fetched_bytes", "hits", "misses")


def _admin_status(node: Any) -> dict[str, Any]:
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        return admin.status()


def _check_accounting(node: Any) -> dict[str, Any]:
    """Per-tenant rows sum to the node's totals; resident bytes are the bytes on disk."""
    status = _admin_status(node)
    report = status["report"]
    for k in SUMMED:
        assert sum(r[k] for r in report["rows"]) == report["totals"][k], (k, report)
    on_disk = node.disk_bytes()
    assert report["totals"]["resident_bytes"] == status["used"] == on_disk, (status, on_disk)
    return status


def _shards(node: Any, name: str) -> list[int]:
    """The shard numbers of dataset ``name`` complete in the node's cache."""
    return sorted(
        int(os.path.basename(f).split(".")[0]) for f in node.store_files() if f"/{name}-" in f
    )


def _row(status: dict[str, Any], tenant: str, job: str) -> dict[str, Any]:
    (row,) = [r for r in status["report"]["rows"] if (r["tenant"], r["job"]) == (tenant, job)]
    return row


def test_two_nodes_two_tenants_three_jobs(node_store, datasets, tenant_users):
    admin = node_store["admin"]
    alpha, shared = datasets["alpha"], datasets["shared"]
    alpha_ds = Dataset.open(alpha, storage_options=admin)
    shared_ds = Dataset.open(shared, storage_options=admin)
    shared_bytes = sum(s.bytes for s in shared_ds.shards)
    share = sorted(set(NodeShare.build(node_rank=0, num_nodes=2).order(alpha_ds)))
    share_bytes = sum(alpha_ds.shards[i].bytes for i in share)
    # alice's share fits on node 0; her share and all of the shared dataset do not
    quota = share_bytes + shared_bytes // 2
    tenants = {ALICE: {"quota": quota}, BOB: {"quota": "16MiB"}}
    bases = [tempfile.mkdtemp(prefix=f"ffjourney-n{i}-", dir="/tmp") for i in range(2)]
    nodes = [NodeProc(b, node_store, tenants=tenants) for b in bases]
    work = tempfile.mkdtemp(prefix="ffjourney-train-", dir="/tmp")
    bob_uid = JourneyTenant(BOB, node_store["keys"][BOB], "", "").uid
    os.chown(work, bob_uid, bob_uid)
    made: list[JourneyTenant] = []

    def tenant(user: str, node: Any) -> JourneyTenant:
        t = JourneyTenant(user, node_store["keys"][user], node_store["proxy"].endpoint, node.socket)
        made.append(t)
        return t

    try:
        for n in nodes:
            n.start()
        alice0, bob0, bob1 = tenant(ALICE, nodes[0]), tenant(BOB, nodes[0]), tenant(BOB, nodes[1])

        # job 1 (alice) warms node 0 while job 2 (bob) trains through node 1
        warm = alice0.start("cli", "cache", "warm", alpha, "--node-rank", "0", "--num-nodes",
                            "2", "--no-progress", job="warm-a")  # fmt: skip
        train = bob1.start("train", shared, work, "20", job="train-b")
        out, err = warm.communicate(timeout=120)
        assert warm.returncode == 0, err.decode()[-2000:]
        assert f"warmed {len(share)} shards of {alpha}" in out.decode()
        wait_for(lambda: os.path.exists(os.path.join(work, "held")), [train], "bob's 20 keys")

        # bob may not read alice's dataset on either node: refused, nothing handed over
        refusals = 0
        for t in (bob0, bob1):
            got = t.run("get", alpha, "0,1")
            assert got["error_type"] == "NodeAccessError", got
            assert got["sha256"] == {}, got
            assert got["error"].startswith(f"access refused to dataset {alpha} for tenant {BOB}")
            refusals += 1
        assert refusals == 2

        # job 3 (alice) would not fit beside job 1's pins: one line, before any fetch
        over = alice0.run("cli", "cache", "warm", shared, "--no-progress", job="sweep-a")
        assert over["cli_rc"] == 1
        line = over["stderr"].strip()
        assert "\n" not in line, line
        assert line.startswith(f"flashfeed cache warm: error: warm of 6 shards of {shared}"), line
        assert f"cannot fit in the quota of tenant {ALICE}" in line and "job warm-a" in line
        assert _shards(nodes[0], "shared") == []

        # node 1's service dies; bob's job (gone with its node) resumes through node 0
        nodes[1].kill()
        train.kill()
        train.wait()
        resumed = bob0.run("train", shared, work, "0", job="train-b")
        assert resumed["rc"] == 0, resumed["stderr"][-2000:]
        assert (resumed["resumed_at"], resumed["delivered"]) == (20, 48)

        # exactly once: bob's delivered keys are the dataset's, each once
        with open(os.path.join(work, "keys.log")) as f:
            delivered = f.read().splitlines()
        cache = tempfile.mkdtemp(prefix="ffjourney-ref-", dir="/tmp")
        try:
            reference = ShardDataset(
                shared, shuffle=False, rank=0, world_size=1, storage_options=admin, cache_dir=cache
            )
            expected = [s["__key__"] for s in reference]
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        assert len(expected) == 48
        assert Counter(delivered) == Counter(expected)
        assert delivered == expected  # in plan order, across the resume

        # accounting on node 0: alice's warm is pinned and charged to her; it adds up
        status0 = _check_accounting(nodes[0])
        a = _row(status0, ALICE, "warm-a")
        assert a["pinned_bytes"] == a["resident_bytes"] >= share_bytes
        assert a["resident_bytes"] <= quota
        assert a["fetched_bytes"] == share_bytes  # each shard of the share left the store once
        assert _shards(nodes[0], "alpha") == share
        # bob's resumed run read from its checkpoint's shard on: those, each fetched once
        b = _row(status0, BOB, "train-b")
        rest = list(range(20 // 8, 6))
        assert _shards(nodes[0], "shared") == rest
        assert b["fetched_bytes"] == sum(shared_ds.shards[i].bytes for i in rest)
        assert b["resident_bytes"] > 0 and b["pinned_bytes"] == 0
        # node 1 comes back from its kill with its books matching its disk
        nodes[1].start()
        status1 = _check_accounting(nodes[1])
        assert {r["tenant"] for r in status1["report"]["rows"]} <= {BOB}
        assert _shards(nodes[1], "alpha") == []
    finally:
        for t in made:
            t.kill_all()
        for n in nodes:
            n.stop()
        for d in (*bases, work):
            shutil.rmtree(d, ignore_errors=True)
    for t in made:
        assert all(p.poll() is not None for p in t.procs)
