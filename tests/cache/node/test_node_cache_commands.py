"""``flashfeed cache warm|status|verify|evict`` go to the node service when
``FLASHFEED_NODE_SOCKET`` is set: a tenant warms and evicts inside its own quota, an admin
verifies the whole cache."""

from __future__ import annotations

import os

from flashfeed.cache.node import NodeClient


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

    refused = bob.run("cli", "cache", "verify")
    assert refused["cli_rc"] == 1
    assert refused["stderr"].strip() == (
        "flashfeed cache verify: error: tenant ffnodeb may not verify the node cache"
    )
    victim = node.store_files()[2]
    with open(victim, "r+b") as f:
        f.write(b"\0" * 64)
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        report = admin.verify()
        status = admin.status()
    assert report["checked"] == 6 and report["corrupt"] == 1 and report["charges_dropped"] == 1
    assert not os.path.exists(victim)
    on_disk = sum(os.stat(f).st_size for f in node.store_files())
    assert status["used"] == status["report"]["totals"]["resident_bytes"] == on_disk

    evicted = alice.run("cli", "cache", "evict", "--dataset", url)
    assert evicted["cli_rc"] == 0, evicted["stderr"]
    assert node.store_files() == []
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        assert admin.status()["used"] == 0
