"""Quotas of the node service: a tenant's fills evict its own unpinned shards only, a warm
that cannot fit fails at once in one line, and the quota changes without a restart."""

from __future__ import annotations

import os
import signal
import time

import pytest

from benchmarks.harness.nodeservice import held_evicted_bytes
from flashfeed.cache.node import NodeClient, NodeShardSource
from flashfeed.cache.node import source as node_source
from flashfeed.dataset import Dataset
from flashfeed.runtime.fdpath import map_readonly


def _rows(node) -> dict[str, dict]:
    with NodeClient(node.socket, reconnect_timeout=5) as c:
        rows = c.status()["report"]["rows"]
    out: dict[str, dict] = {}
    for r in rows:
        t = out.setdefault(r["tenant"], dict.fromkeys(r, 0))
        for k, v in r.items():
            if isinstance(v, (int, float)):
                t[k] += v
    return out


def test_a_fill_over_quota_evicts_the_tenants_own_unpinned_shards_only(
    node, tenants, datasets, node_store
):
    sizes = [
        s.bytes for s in Dataset.open(datasets["alpha"], storage_options=node_store["admin"]).shards
    ]
    quota = sizes[0] + sizes[1] + sizes[2] + min(sizes) // 2
    node.write_config(tenants={"ffnodea": {"quota": quota}, "ffnodeb": {"quota": "16MiB"}})
    node.start()
    alice, bob = tenants
    warm = alice.run("cli", "node", "warm", datasets["alpha"], "--shards", "0", "--job", "keep")
    assert warm["cli_rc"] == 0, warm["stderr"]
    assert bob.run("cli", "node", "warm", datasets["shared"], "--shards", "0-1")["cli_rc"] == 0
    assert alice.run("get", datasets["alpha"], "1")["hits"] == {"1": False}
    assert alice.run("get", datasets["alpha"], "2")["hits"] == {"2": False}
    before = set(node.store_files())
    assert alice.run("get", datasets["alpha"], "3")["hits"] == {"3": False}
    after = set(node.store_files())
    gone = before - after
    assert len(gone) == 1 and "alpha" in next(iter(gone)) and "000001" in next(iter(gone))
    rows = _rows(node)
    assert rows["ffnodea"]["evictions_suffered"] == 1 and rows["ffnodea"]["evictions_caused"] == 1
    assert rows["ffnodeb"]["evictions_suffered"] == 0
    assert rows["ffnodea"]["resident_bytes"] <= quota
    assert rows["ffnodeb"]["pinned_bytes"] > 0
    assert sum(1 for f in after if "shared" in f) == 2  # bob's pins untouched


def test_a_warm_over_quota_fails_at_once_and_a_new_quota_applies_without_restart(
    node, tenants, datasets, node_store
):
    sizes = [
        s.bytes for s in Dataset.open(datasets["alpha"], storage_options=node_store["admin"]).shards
    ]
    node.write_config(tenants={"ffnodea": {"quota": sizes[0] + sizes[1] + 10}})
    node.start()
    alice, _ = tenants
    assert (
        alice.run("cli", "node", "warm", datasets["alpha"], "--shards", "0", "--job", "sweep")[
            "cli_rc"
        ]
        == 0
    )
    got = alice.run("cli", "node", "warm", datasets["alpha"], "--job", "tomorrow")
    assert got["cli_rc"] == 1
    line = got["stderr"].strip()
    assert "\n" not in line, line
    assert line.startswith(
        f"flashfeed node warm: error: warm of 6 shards of {datasets['alpha']}"
    ), line
    assert "cannot fit in the quota of tenant ffnodea" in line and "by job sweep" in line, line
    assert len(node.store_files()) == 1  # failed before any fetch
    pid = node.proc.pid
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    again = alice.run("cli", "node", "warm", datasets["alpha"], "--job", "tomorrow")
    assert again["cli_rc"] == 0, again["stderr"]
    assert node.proc.pid == pid and node.proc.poll() is None
    assert len(node.store_files()) == 6
    assert os.path.exists(node.config_path)


def test_a_full_node_evicts_anyones_unpinned_shards_and_says_whose(
    node, tenants, datasets, node_store
):
    shared = Dataset.open(datasets["shared"], storage_options=node_store["admin"]).shards
    alpha = Dataset.open(datasets["alpha"], storage_options=node_store["admin"]).shards
    # room for four shards and their indexes (a few hundred bytes each), not for a fifth
    capacity = int((alpha[0].bytes + alpha[1].bytes + alpha[2].bytes + shared[0].bytes) * 1.05)
    node.write_config(
        capacity=capacity, tenants={"ffnodea": {"quota": "16MiB"}, "ffnodeb": {"quota": "16MiB"}}
    )
    node.start()
    alice, bob = tenants
    assert alice.run("cli", "node", "warm", datasets["alpha"], "--shards", "0")["cli_rc"] == 0
    alice.run("get", datasets["alpha"], "1")
    alice.run("get", datasets["alpha"], "2")
    bob.run("get", datasets["shared"], "0")  # the node is full now
    got = bob.run("get", datasets["shared"], "1")
    assert got["hits"] == {"1": False}
    rows = _rows(node)
    assert rows["ffnodea"]["evictions_suffered"] == 1 and rows["ffnodeb"]["evictions_caused"] == 1
    left = node.store_files()
    assert any("alpha" in f and "000000" in f for f in left)  # alice's pin stays
    assert node.disk_bytes() <= capacity


def test_sighup_reads_the_config_again_even_when_its_file_looks_unchanged(node, tenants, datasets):
    node.write_config(tenants={"ffnodea": {"quota": "1KiB"}})
    node.start()
    alice, _ = tenants
    refused = alice.run("cli", "node", "warm", datasets["alpha"], "--shards", "0")
    assert refused["cli_rc"] == 1 and "quota of tenant ffnodea (1.0 KiB)" in refused["stderr"]
    st = os.stat(node.config_path)
    node.write_config(tenants={"ffnodea": {"quota": "9MiB"}})  # as long as the last one
    assert os.stat(node.config_path).st_size == st.st_size
    os.utime(node.config_path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and as old
    time.sleep(0.2)
    assert alice.run("cli", "node", "warm", datasets["alpha"], "--shards", "0")["cli_rc"] == 1
    os.kill(node.proc.pid, signal.SIGHUP)
    time.sleep(0.3)
    again = alice.run("cli", "node", "warm", datasets["alpha"], "--shards", "0")
    assert again["cli_rc"] == 0, again["stderr"]


def test_a_loader_lets_go_of_evicted_shards_once_its_readers_have_them(
    node, node_store, datasets, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard the service evicts while a loader holds its descriptor stays on the disk,
    beyond the quota, until the loader lets go: it does so ``GRACE`` seconds after it last
    handed out the path (its readers map a path at once), not at its ``max_held``-th shard."""
    monkeypatch.setattr(node_source, "GRACE", 60.0)  # nothing let go of while reading
    monkeypatch.setattr(node_source, "SWEEP_EVERY", 0.1)
    node.write_config(tenants={"root": {"quota": "16MiB"}})
    node.start()
    url = datasets["shared"]
    ds = Dataset.open(url, storage_options=node_store["admin"])
    source = NodeShardSource(ds, socket_path=node.socket, storage_options=node_store["admin"])
    try:
        for i in range(6):
            with map_readonly(source.local_path(i)) as m:
                assert m[:] == ds.read_shard(i)
        assert source.client.evict(url)["evicted"] == 6
        held = held_evicted_bytes(os.getpid(), node.base)
        assert held == sum(ds.shards[i].bytes for i in range(6))  # read on within the grace
        with map_readonly(source.local_path(5)) as m:  # a held read: its path is valid
            assert m[:] == ds.read_shard(5)
        monkeypatch.setattr(node_source, "GRACE", 0.5)
        time.sleep(0.7)
        with map_readonly(source.local_path(0)) as m:  # read on as held; the rest let go
            assert m[:] == ds.read_shard(0)
        assert held_evicted_bytes(os.getpid(), node.base) == ds.shards[0].bytes
        assert source.held() == 1
        with map_readonly(source.local_path(3)) as m:  # no longer held: fetched again
            assert m[:] == ds.read_shard(3)
        assert source.held() == 2 and source.stats()["misses"] == 7
    finally:
        source.close()
