"""Node services as peers of each other: two services on two simulated nodes (127.0.0.2 and
127.0.0.3, their own cache dirs and sockets), the store behind the counting proxy. A tenant
of node B reads what node A's tenant filled from A, not from the store; a peer that is down
leaves B on the store. Bad ``peers`` sections fail in one line naming the value."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from flashfeed.cache.layout import dataset_key
from flashfeed.cache.node import NodeClient
from flashfeed.cache.node.tenants import ConfigError, NodeConfig
from flashfeed.cache.peer import PeerTier
from flashfeed.cache.peer.client import rendezvous_owner
from flashfeed.dataset import Dataset

from support.loader_helpers import make_image_dataset
from support.node_tenant import Tenant

SHARED = "ffshared"  # the bucket both tenants read (conftest.py)

TOKEN = b"node-peers-test-token-" + os.urandom(8).hex().encode()


def _free_port(host: str) -> int:
    with socket.create_server((host, 0)) as s:
        return s.getsockname()[1]


@pytest.fixture
def cluster(make_node: Any) -> Iterator[dict[str, Any]]:
    """Two node services' configs (not started), each naming the other as its peer."""
    base = tempfile.mkdtemp(prefix="ffnodepeers-", dir="/tmp")
    os.chmod(base, 0o755)
    token_file = os.path.join(base, "peer.token")
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, TOKEN)
    os.close(fd)
    addrs = {n: f"127.0.0.{h}:{_free_port(f'127.0.0.{h}')}" for n, h in (("a", 2), ("b", 3))}
    nodes = {}
    for name, other in (("a", "b"), ("b", "a")):
        os.makedirs(os.path.join(base, name))
        peers = {"listen": addrs[name], "hosts": [addrs[name], addrs[other]],
                 "token_file": token_file}  # fmt: skip
        nodes[name] = make_node(os.path.join(base, name), peers=peers,
                               tenants={"ffnodea": {"quota": "16MiB"},
                                        "ffnodeb": {"quota": "16MiB"}})  # fmt: skip
    try:
        yield {"nodes": nodes, "addrs": addrs, "base": base}
    finally:
        for n in nodes.values():
            n.stop()  # before the directory goes (``make_node`` stops them again: a no-op)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fresh_dataset(node_store: dict[str, Any]) -> str:
    """A dataset no other test has read (the proxy's counts of it start at zero)."""
    url = f"s3://{SHARED}/peers-{os.urandom(4).hex()}"
    make_image_dataset(url, [8] * 6, storage_options=node_store["admin"])
    return url


def _tenant(node_store: dict[str, Any], user: str, node: Any) -> Tenant:
    return Tenant(user, node_store["keys"][user], node_store["proxy"].endpoint, node.socket)


def _expected_keys(url: str, admin: dict) -> list[str]:
    ds = Dataset.open(url, storage_options=admin)
    return [
        f"{ds.shards[i].path}/s{i:04d}-{n:06d}" for i in range(6) for n in range(i * 8, i * 8 + 8)
    ]


def _store_bytes(proxy: Any, url: str) -> int:
    """Bytes of shard GETs of ``url``'s dataset the store answered, as the proxy saw them."""
    name = url.rsplit("/", 1)[1]
    return sum(
        r.range[1] - r.range[0]
        for r in proxy.log(name)
        if r.method == "GET" and r.path.endswith(".tar") and r.range is not None
    )


def _admin_status(node: Any) -> dict[str, Any]:
    with NodeClient(node.socket, reconnect_timeout=5) as c:
        return c.status()


def _fetched(node: Any, tenant: str) -> int:
    rows = _admin_status(node)["report"]["rows"]
    return sum(r["fetched_bytes"] for r in rows if r["tenant"] == tenant)


def _epoch(tenant: Tenant, url: str) -> list[str]:
    got = tenant.run("epoch", url, "1")
    assert got["rc"] == 0, got["stderr"]
    return sorted(got["keys"][0])


def test_a_tenant_of_node_b_reads_from_node_a_not_the_store(cluster, node_store, fresh_dataset):
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    a.start()
    b.start()
    proxy, admin = node_store["proxy"], node_store["admin"]
    ds = Dataset.open(fresh_dataset, storage_options=admin)
    total = sum(s.bytes for s in ds.shards)
    addrs = [cluster["addrs"]["a"], cluster["addrs"]["b"]]
    key = dataset_key(ds.url, ds.manifest)
    # the shards B single-flights for the cluster: A's tenant has B fill them
    by_b = sum(
        s.bytes for i, s in enumerate(ds.shards) if rendezvous_owner(addrs, key, i) == addrs[1]
    )
    expected = _expected_keys(fresh_dataset, admin)
    alice, bob = _tenant(node_store, "ffnodea", a), _tenant(node_store, "ffnodeb", b)
    try:
        assert _epoch(alice, fresh_dataset) == expected
        assert _store_bytes(proxy, fresh_dataset) == total  # each shard read once
        assert _fetched(a, "ffnodea") == total  # A holds all six, charged to its tenant
        assert _fetched(b, "(peers)") == by_b  # B's fills for A, charged to its peers' account
        assert _epoch(bob, fresh_dataset) == expected
    finally:
        alice.kill_all()
        bob.kill_all()
    assert _store_bytes(proxy, fresh_dataset) == total  # B's other shards came from A
    assert len(b.store_files()) == 6  # B holds its own copies now
    assert _fetched(b, "ffnodeb") == total - by_b  # what B's tenant fetched, from A
    served = _admin_status(a)["peers"]
    assert served["served_bytes"] >= total - by_b  # A's peer server sent B those shards
    b_peers = _admin_status(b)["peers"]
    assert b_peers["address"] == cluster["addrs"]["b"]
    assert b_peers["peers"] == [cluster["addrs"]["a"]]  # its own entry left out
    assert b_peers["bytes_from_peers"] >= total - by_b
    assert b_peers.get("bytes_from_store", 0) == by_b
    reader = PeerTier(peers=[cluster["addrs"]["a"]], token=b"not-the-cluster-token")
    resp = reader.request(cluster["addrs"]["a"], "GET", "/v1/stats")
    resp.close()
    assert resp.status == 401  # only token holders are served
    a.write_config(peers={**a.config["peers"], "max_streams": 2})
    with NodeClient(a.socket, reconnect_timeout=5) as c:
        assert not c.reload().get("error_in_config")
    assert "the peers section changed: it applies after a restart" in a.log_tail()
    assert _admin_status(a)["peers"]["address"] == cluster["addrs"]["a"]  # still serving


def _cli_status(node: Any) -> str:
    """``flashfeed cache status`` as the admin (root) sees it on ``node``."""
    boot = "import sys; from flashfeed.cli import main; sys.exit(main())"
    env = {**os.environ, "FLASHFEED_NODE_SOCKET": node.socket}
    got = subprocess.run([sys.executable, "-c", boot, "cache", "status"], env=env,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert got.returncode == 0, got.stderr
    return got.stdout


def _rows(node: Any) -> list[dict[str, Any]]:
    return _admin_status(node)["report"]["rows"]


def test_misses_on_two_nodes_read_each_shard_from_the_store_once(
    cluster, node_store, fresh_dataset
):
    a, b = cluster["nodes"]["a"], cluster["nodes"]["b"]
    a.start()
    b.start()
    proxy, admin = node_store["proxy"], node_store["admin"]
    total = sum(s.bytes for s in Dataset.open(fresh_dataset, storage_options=admin).shards)
    expected = _expected_keys(fresh_dataset, admin)
    alice, bob = _tenant(node_store, "ffnodea", a), _tenant(node_store, "ffnodeb", b)
    proxy.delay = 0.3  # each store read takes a while: the other node misses meanwhile
    try:
        # both nodes miss every shard at once: each shard is read from the store by one
        with ThreadPoolExecutor(2) as pool:
            epochs = list(pool.map(lambda t: _epoch(t, fresh_dataset), (alice, bob)))
        proxy.delay = 0.0
        assert epochs == [expected, expected]
        assert _store_bytes(proxy, fresh_dataset) == total
        for node in (a, b):  # each node holds one copy, and its accounts say who paid for it
            assert len(node.store_files()) == 6
            assert sum(r["fetched_bytes"] for r in _rows(node)) == total
        seen = bob.run("cli", "cache", "status")  # B's tenant sees its own rows only
        assert seen["cli_rc"] == 0 and "ffnodeb" in seen["stdout"]
        assert "(peers)" not in seen["stdout"] and "ffnodea" not in seen["stdout"]
        assert "ffnodeb" in _cli_status(b)  # the admin sees every account
    finally:
        proxy.delay = 0.0
        alice.kill_all()
        bob.kill_all()


def test_a_peer_that_is_down_leaves_node_b_on_the_store(cluster, node_store, fresh_dataset):
    b = cluster["nodes"]["b"]
    b.start()  # A never starts: nothing listens at its peer address
    proxy, admin = node_store["proxy"], node_store["admin"]
    total = sum(s.bytes for s in Dataset.open(fresh_dataset, storage_options=admin).shards)
    bob = _tenant(node_store, "ffnodeb", b)
    try:
        assert _epoch(bob, fresh_dataset) == _expected_keys(fresh_dataset, admin)
    finally:
        bob.kill_all()
    assert _store_bytes(proxy, fresh_dataset) == total
    assert _fetched(b, "ffnodeb") == total
    assert _admin_status(b)["peers"]["peers_down"] >= 1  # A was asked, and left out


def _parse(tmp_path, peers: Any) -> NodeConfig:
    return NodeConfig.parse(
        {"cache_dir": str(tmp_path / "c"), "capacity": "1GiB", "peers": peers}, source="n.json"
    )


def test_bad_peers_sections_fail_in_one_line_naming_the_value(tmp_path, monkeypatch):
    monkeypatch.delenv("FLASHFEED_PEER_TOKEN", raising=False)
    monkeypatch.delenv("FLASHFEED_PEERS", raising=False)
    good = tmp_path / "token"
    good.write_bytes(TOKEN)
    good.chmod(0o600)
    loose = tmp_path / "loose"
    loose.write_bytes(TOKEN)
    loose.chmod(0o644)
    ok = {"listen": "127.0.0.2:7460", "token_file": str(good)}
    for peers, says in _cases(ok, tmp_path, str(loose)):
        with pytest.raises(ConfigError) as err:
            _parse(tmp_path, peers)
        message = str(err.value)
        assert message.startswith("n.json: ") and says in message, message
        assert "\n" not in message
    cfg = _parse(tmp_path, {**ok, "hosts": ["127.0.0.2", "127.0.0.3:7461"], "rate": "1MiB"})
    assert cfg.peers.peers == ("127.0.0.2:7460", "127.0.0.3:7461")
    assert cfg.peers.listen == ("127.0.0.2", 7460)
    assert cfg.peers.rate == float(1 << 20) and cfg.peers.token == TOKEN
    assert _parse(tmp_path, None).peers is None
    assert cfg.peer_fill_quota == (1 << 30) // 4  # fills for peers: a quarter by default
    assert _parse(tmp_path, {**ok, "fill_quota": "64MiB"}).peer_fill_quota == 64 << 20
    assert _parse(tmp_path, {**ok, "fill_quota": 0}).peer_fill_quota == 0


def _cases(ok: dict, tmp_path: Any, loose: str) -> list[tuple[Any, str]]:
    return [
        ("nope", "peers must be an object, got 'nope'"),
        ({**ok, "listen": "7460"}, "peers.listen must be host:port, got '7460'"),
        ({**ok, "listen": "0.0.0.0:7460"}, "got '0.0.0.0:7460'"),
        ({**ok, "max_streams": 0}, "peers.max_streams must be an integer >= 1, got 0"),
        ({**ok, "rate": "fast"}, "peers.rate"),
        ({**ok, "hosts": [1, 2]}, "peers.hosts must be a list of host[:port], got [1, 2]"),
        ({**ok, "hosts": "a,,b"}, "--hosts has an empty entry: 'a,,b'"),
        ({**ok, "hostfile": str(tmp_path / "absent")}, "cannot read the hostfile"),
        ({**ok, "token_file": loose}, "readable by group or others"),
        ({"listen": "127.0.0.2:7460"}, "no peer token"),
        ({**ok, "tokenfile": "x"}, "unknown key(s) ['tokenfile']"),
        ({**ok, "fill_quota": "lots"}, "peers.fill_quota must be a byte count"),
    ]


def test_the_service_refuses_to_start_on_a_bad_peers_section_in_one_line(tmp_path):
    token = tmp_path / "token"
    token.write_bytes(TOKEN)
    token.chmod(0o600)
    taken = socket.create_server(("127.0.0.2", 0))
    busy = f"127.0.0.2:{taken.getsockname()[1]}"
    boot = "import sys; from flashfeed.cli import main; sys.exit(main())"
    try:
        for peers, says in (
            ({"listen": busy, "token_file": str(token), "max_streams": 0},
             "peers.max_streams must be an integer >= 1, got 0"),
            ({"listen": busy, "token_file": str(token)},
             f"peers.listen: cannot listen on {busy}: Address already in use"),
        ):  # fmt: skip
            config = tmp_path / "node.json"
            config.write_text(json.dumps({"cache_dir": str(tmp_path / "c"), "capacity": "1GiB",
                                          "socket": str(tmp_path / "node.sock"),
                                          "peers": peers}))  # fmt: skip
            cmd = [sys.executable, "-c", boot, "node", "serve", str(config)]
            got = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            assert got.returncode == 2, got.stderr
            lines = got.stderr.strip().splitlines()
            assert len(lines) == 1, got.stderr
            assert lines[0].startswith("flashfeed node serve: error: "), got.stderr
            assert lines[0].endswith(says), got.stderr
    finally:
        taken.close()
