"""``flashfeed cache warm|status|verify|evict`` go to the node service when
``FLASHFEED_NODE_SOCKET`` is set: a tenant warms and evicts inside its own quota, an admin
verifies the whole cache."""

from __future__ import annotations

import json
import os

from flashfeed.cache.node import NodeClient
from flashfeed.cache.node.cli import status_text

from support.loader_helpers import make_image_dataset

SHARED = "ffshared"  # the bucket both tenants read (conftest.py)


def test_cache_commands_through_the_service(node, tenants, datasets):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}, "ffnodeb": {"quota": "16MiB"}})
    node.start()
    alice, bob = tenants
    url = datasets["alpha"]
    warm = alice.run("cli", "cache", "warm", url, job="sweep")
    assert warm["cli_rc"] == 0, warm["stderr"]
    assert len(node.store_files()) == 6
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        rows = admin.status()["report"]["rows"]
    (row,) = [r for r in rows if r["tenant"] == "ffnodea"]
    assert row["job"] == "sweep" and row["pinned_bytes"] == row["resident_bytes"] > 0
    assert alice.run("cli", "cache", "status")["cli_rc"] == 0
    bob.run("get", datasets["shared"], "0")
    top = bob.run("cli", "top", "--iterations", "1")["stdout"]
    assert "node service" in top and "ffnodeb" in top
    assert "ffnodea" not in top and "ffalpha" not in top  # only bob's own rows
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        assert "ffnodea" in status_text(admin.status())  # the admin's view has every tenant

    refused = bob.run("cli", "cache", "verify")
    assert refused["cli_rc"] == 1
    assert refused["stderr"].strip() == (
        "flashfeed cache verify: error: tenant ffnodeb may not verify the node cache"
    )
    victim = [f for f in node.store_files() if "alpha" in f][2]
    with open(victim, "r+b") as f:
        f.write(b"\0" * 64)
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        report = admin.verify()
        status = admin.status()
    assert report["checked"] == 7 and report["corrupt"] == 1 and report["charges_dropped"] == 1
    assert not os.path.exists(victim)
    on_disk = node.disk_bytes()
    assert status["used"] == status["report"]["totals"]["resident_bytes"] == on_disk

    evicted = alice.run("cli", "cache", "evict", "--dataset", url)
    assert evicted["cli_rc"] == 0, evicted["stderr"]
    (left,) = node.store_files()  # bob's shard of the shared dataset stays
    assert "shared" in left
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        assert admin.status()["used"] == node.disk_bytes()


def test_a_mixture_warm_goes_to_the_service_and_fails_at_once_over_quota(
    node, tenants, datasets, node_store
):
    """``cache warm MIXTURE.json`` with the service selected: every source's shards of this
    node's share in one warm, pinned for the job; over the quota, one line and no fetch."""
    node.write_config(tenants={"ffnodea": {"quota": 1000}})
    node.start()
    alice, _ = tenants
    other = f"s3://{SHARED}/mixed-{os.urandom(3).hex()}"
    make_image_dataset(other, [5, 7, 6], storage_options=node_store["admin"])
    mix = os.path.join(node.base, "mix.json")
    with open(mix, "w") as f:
        json.dump({"sources": [{"url": datasets["alpha"], "weight": 1, "name": "a"},
                               {"url": other, "weight": 1, "name": "b"}]}, f)  # fmt: skip
    os.chmod(mix, 0o644)
    refused = alice.run("cli", "cache", "warm", mix, job="mix")
    assert refused["cli_rc"] == 1
    line = refused["stderr"].strip()
    assert "\n" not in line and "cannot fit in the quota of tenant ffnodea" in line, line
    assert datasets["alpha"] in line and other in line, line
    assert node.store_files() == []  # failed before any fetch

    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    warm = alice.run("cli", "cache", "warm", mix, job="mix")
    assert warm["cli_rc"] == 0, warm["stderr"]
    assert "of the 2 sources of" in warm["stdout"] and "through the node service" in warm["stdout"]
    files = node.store_files()
    assert {("alpha" in f) for f in files} == {True, False}  # shards of both sources
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        rows = admin.status()["report"]["rows"]
    (row,) = [r for r in rows if r["tenant"] == "ffnodea"]
    assert row["job"] == "mix" and row["pinned_bytes"] == row["resident_bytes"] > 0
    assert row["fetched_bytes"] == sum(os.path.getsize(f) for f in files)  # each shard once
    assert f"warmed {len(files)} shards of the 2 sources" in warm["stdout"]
    assert not os.path.exists(os.path.join(alice.home, ".cache", "flashfeed"))
