"""The node service with two real Unix users as tenants: descriptors of shards a real loader
epoch reads, refused access, shared bytes, private files, quotas, reload, accounting."""

from __future__ import annotations

import os

from flashfeed.cache.node import NodeClient
from flashfeed.dataset import Dataset

from support.loader_helpers import make_image_dataset

SHARED = "ffshared"  # the bucket both tenants read (conftest.py)


def _keys(url: str, admin: dict) -> list[str]:
    ds = Dataset.open(url, storage_options=admin)
    return [
        f"{ds.shards[i].path}/s{i:04d}-{n:06d}" for i in range(6) for n in range(i * 8, i * 8 + 8)
    ]


def _admin_status(node) -> dict:
    with NodeClient(node.socket, reconnect_timeout=5) as c:
        return c.status()


def test_loader_epochs_read_descriptors_from_the_service(node, tenants, datasets, node_store):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    node.start()
    alice, _ = tenants
    got = alice.run("epoch", datasets["alpha"], "2")
    assert got["rc"] == 0, got["stderr"]
    expected = _keys(datasets["alpha"], node_store["admin"])
    assert [sorted(k) for k in got["keys"]] == [expected, expected]
    rows = _admin_status(node)["report"]["rows"]
    mine = [r for r in rows if r["tenant"] == "ffnodea"]
    total = sum(
        s.bytes for s in Dataset.open(datasets["alpha"], storage_options=node_store["admin"]).shards
    )
    assert sum(r["fetched_bytes"] for r in mine) == total  # each shard fetched once
    assert (
        1 <= sum(r["misses"] for r in mine) <= 6
    )  # reads that waited (fetches ahead did the rest)
    assert sum(r["hits"] for r in mine) >= 6  # the second epoch read them as hits
    assert len(node.store_files()) == 6
    # closing the loader gives the descriptors back: the service's evictions free bytes then
    closed = alice.run("epoch-close", datasets["alpha"])
    assert closed["rc"] == 0, closed["stderr"]
    assert sorted(closed["keys"]) == expected
    assert closed["held"] >= 1 and closed["after_close"] == 0, closed


def test_a_mixture_reads_every_source_through_the_service(node, tenants, datasets, node_store):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    node.start()
    alice, _ = tenants
    other = f"s3://{SHARED}/other-{os.urandom(3).hex()}"  # not a copy of alpha's samples
    make_image_dataset(other, [5, 7, 6], storage_options=node_store["admin"])
    got = alice.run("mix-epoch", datasets["alpha"], other)
    assert got["rc"] == 0, got["stderr"]
    assert got["kinds"] == {"a": "node", "b": "node"} and not got["embedded_cache"]
    by = {n: [k for k in got["keys"] if k.startswith(n + ":")] for n in "ab"}
    assert abs(len(by["a"]) - len(by["b"])) <= 1  # weights 1:1
    assert len(set(by["a"])) == len(by["a"])  # the larger source: each sample once
    assert len(set(by["b"])) == 18  # the smaller one: every sample, then again (cycled)
    assert got["held"] >= 2  # descriptors the service handed over, of both datasets
    rows = [r for r in _admin_status(node)["report"]["rows"] if r["tenant"] == "ffnodea"]
    assert sum(r["misses"] + r["hits"] for r in rows) >= sum(got["misses"].values()) > 0
    assert sum(r["fetched_bytes"] for r in rows) > 0


def test_tenant_without_access_is_refused_in_one_line_and_gets_no_bytes(node, tenants, datasets):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}, "ffnodeb": {"quota": "16MiB"}})
    node.start()
    alice, bob = tenants
    assert alice.run("get", datasets["alpha"], "0")["hits"] == {"0": False}  # cached now
    got = bob.run("get", datasets["alpha"], "0")
    assert got["error_type"] == "NodeAccessError"
    refused = f"access refused to dataset {datasets['alpha']} for tenant ffnodeb"
    assert got["error"] == f"{refused} (the store answered 403)"
    assert got["sha256"] == {}
    assert "\n" not in got["error"]


def test_two_tenants_share_one_copy_and_cached_files_are_private(node, tenants, datasets):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}, "ffnodeb": {"quota": "16MiB"}})
    node.start()
    alice, bob = tenants
    a = alice.run("get", datasets["shared"], "0,1")
    b = bob.run("get", datasets["shared"], "0,1")
    assert a["hits"] == {"0": False, "1": False}
    assert b["hits"] == {"0": True, "1": True}  # bob's reads are hits on alice's fills
    assert a["sha256"] == b["sha256"]
    files = node.store_files()
    assert len(files) == 2  # one copy, whoever fetched it
    for f in files:
        assert os.stat(f).st_mode & 0o077 == 0
        assert bob.run("try-read", f)["error"] == "PermissionError"
    assert bob.run("try-read", node.cache_dir)["error"] in ("PermissionError", "IsADirectoryError")
    assert os.stat(node.cache_dir).st_mode & 0o077 == 0


def test_status_and_metrics_add_up_and_show_a_tenant_only_its_own(node, tenants, datasets):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}, "ffnodeb": {"quota": "16MiB"}})
    node.start()
    alice, bob = tenants
    alice.run("get", datasets["alpha"], "0,1,2")
    bob.run("get", datasets["shared"], "0")
    alice.run("get", datasets["shared"], "0,1")
    admin = _admin_status(node)
    rows, totals = admin["report"]["rows"], admin["report"]["totals"]
    for figure in ("resident_bytes", "pinned_bytes", "hits", "misses", "fetched_bytes"):
        assert sum(r[figure] for r in rows) == totals[figure]
    on_disk = node.disk_bytes()
    assert totals["resident_bytes"] == admin["used"] == on_disk
    by = {r["tenant"]: r for r in rows}
    assert by["ffnodea"]["misses"] == 4 and by["ffnodeb"]["misses"] == 1
    assert by["ffnodea"]["hits"] == 1  # shard 0 of shared, which bob fetched
    bob_view = bob.run("cli", "node", "status", "--json")
    assert bob_view["cli_rc"] == 0
    metrics = bob.run("cli", "node", "metrics")["stdout"]
    assert 'flashfeed_node_misses_total{tenant="ffnodeb",job="default"} 1' in metrics
    assert 'flashfeed_node_resident_bytes{tenant="ffnodeb",job="default"}' in metrics
    for text in (metrics, str(bob_view)):
        assert "ffalpha" not in text and "ffnodea" not in text


def test_a_fill_in_progress_is_handed_over_and_read_as_it_lands(
    node, tenants, datasets, node_store
):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    node.start()
    alice, _ = tenants
    node_store["proxy"].delay = 2.0  # the shard's GET waits: the fill stays in flight
    try:
        got = alice.run("partial", datasets["alpha"], "5")
    finally:
        node_store["proxy"].delay = 0.0
    assert got["rc"] == 0, got["stderr"]
    assert got["partial"] is True and got["samples"] == 8  # its index came first
    assert got["complete_at_first"] is False and got["ended"] is True
    assert got["streamed"] == got["final"]  # the part file handed over became the shard


def test_the_dali_loader_reads_through_the_service(node, tenants, datasets, node_store):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    node.start()
    alice, _ = tenants
    got = alice.run("dali-epoch", datasets["alpha"])
    assert got["rc"] == 0, got["stderr"][-3000:]
    assert sorted(got["keys"]) == _keys(datasets["alpha"], node_store["admin"])
    assert got["labels"] == [int(k.rsplit("-", 1)[1]) % 10 for k in got["keys"]]
    rows = [r for r in _admin_status(node)["report"]["rows"] if r["tenant"] == "ffnodea"]
    assert sum(r["misses"] + r["hits"] for r in rows) >= 6 and len(node.store_files()) == 6


def test_an_arrow_fill_in_progress_is_handed_over_and_located_as_it_lands(
    node, tenants, node_store
):
    from support.loader_helpers import make_token_dataset

    url = f"s3://{SHARED}/tokens-{os.urandom(3).hex()}"
    rows = [8192, 12288]  # rows of 64 int32 tokens: 3 MiB in shard 1, batches of 64 KiB
    make_token_dataset(url, rows, seq_len=64, storage_options=node_store["admin"],
                       batch_bytes=64 << 10)  # fmt: skip
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    node.start()
    alice, _ = tenants
    proxy = node_store["proxy"]
    proxy.rate = 1_000_000  # 3 MiB at 1 MB/s: the fill lands 1 MiB at a time for 3 s
    try:
        got = alice.run("partial-arrow", url, "1")
    finally:
        proxy.rate = 0.0
    assert got["rc"] == 0, got["stderr"]
    assert got["partial"] is True and got["complete_at_first"] is False, got
    assert got["batches"] >= 1 and 0 < got["rows"] <= rows[1], got  # from its own bytes
    assert got["again"] is True
    epoch = alice.run("token-epoch", url)  # and a TokenLoader through the service reads it
    assert epoch["rc"] == 0, epoch["stderr"]
    assert epoch["first"] == [n * 7 for n in range(sum(rows))]
