"""Fixtures of the node service tests: two real Unix users (tenants), a store whose S3
identities give them different access, datasets, and a service run as a real process."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.nodeservice import NodeServiceProc
from benchmarks.harness.slowproxy import SlowProxy, is_shard_get
from benchmarks.harness.unixusers import unix_users, user_python
from flashfeed.cli.devstore import EmbeddedStore

from support.loader_helpers import make_image_dataset
from support.node_tenant import Tenant

USERS = ("ffnodea", "ffnodeb")
ALPHA, SHARED = "ffalpha", "ffshared"  # alice reads both buckets, bob only the shared one


@pytest.fixture(scope="session")
def tenant_users() -> Iterator[tuple[str, ...]]:
    """Two real Unix users, created for the session (tests run as root)."""
    if os.geteuid() != 0:
        pytest.skip("the node service tests create Unix users: they must run as root")
    with unix_users(USERS) as users:
        if user_python(USERS[0]) is None:
            pytest.skip("no Python this test's venv runs on is executable by another user")
        yield users


@pytest.fixture(scope="session")
def node_store(tenant_users: tuple[str, str]) -> Iterator[dict[str, Any]]:
    """A store of our own (SeaweedFS) with an admin and one identity per tenant, behind a
    proxy that can make shard GETs slow (``proxy.delay``)."""
    root = tempfile.mkdtemp(prefix="ffnode-s3-")
    keys = {u: (f"key{u}", f"secret-{u}-{os.urandom(6).hex()}") for u in tenant_users}
    alice, bob = tenant_users
    identities = [
        {"name": alice, "credentials": [{"accessKey": keys[alice][0], "secretKey": keys[alice][1]}],
         "actions": [f"Read:{ALPHA}", f"List:{ALPHA}", f"Read:{SHARED}", f"List:{SHARED}"]},
        {"name": bob, "credentials": [{"accessKey": keys[bob][0], "secretKey": keys[bob][1]}],
         "actions": [f"Read:{SHARED}", f"List:{SHARED}"]},
    ]  # fmt: skip
    store = EmbeddedStore(os.path.join(root, "s3"), port=0, identities=identities)
    proxy = None
    try:
        store.start()
        for bucket in (ALPHA, SHARED):
            store.make_bucket(bucket)
        proxy = SlowProxy(("127.0.0.1", store.info.s3_port), delay_if=is_shard_get)
        admin = {**store.info.storage_options(), "endpoint_url": proxy.endpoint}
        yield {"store": store, "proxy": proxy, "admin": admin, "keys": keys, "root": root}
    finally:
        if proxy is not None:
            proxy.close()
        store.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def datasets(node_store: dict[str, Any]) -> dict[str, str]:
    """``alpha`` (alice only) and ``shared`` (both): 6 shards of 8 JPEG samples each."""
    admin = node_store["admin"]
    out = {}
    for name, bucket in (("alpha", ALPHA), ("shared", SHARED)):
        url = f"s3://{bucket}/{name}-{os.urandom(3).hex()}"
        make_image_dataset(url, [8] * 6, storage_options=admin)
        out[name] = url
    return out


class NodeProc(NodeServiceProc):
    """A node service run as a real process (root), with its config file."""

    def __init__(self, base: str, store: dict[str, Any], **config: Any) -> None:
        self.cache_dir = os.path.join(base, "cache")
        defaults = {"cache_dir": self.cache_dir, "capacity": "64MiB", "store": store["admin"],
                    "default_quota": "0", "tenants": {}}  # fmt: skip
        super().__init__(base, {**defaults, **config}, log_level="debug")

    def start(self, timeout: float = 20.0) -> None:
        super().start(timeout)

    def disk_bytes(self) -> int:
        """Bytes of the complete shards in the service's cache, their indexes included."""
        total = 0
        for f in self.store_files():
            total += os.stat(f).st_size
            if os.path.exists(f + ".idx"):
                total += os.stat(f + ".idx").st_size
        return total

    def store_files(self) -> list[str]:
        """Complete shard files in the service's cache (not indexes, not part files)."""
        out = []
        for dirpath, _, names in os.walk(os.path.join(self.cache_dir, "store")):
            if os.sep + "data" in dirpath:
                out += [os.path.join(dirpath, n) for n in names if n.endswith(".tar")]
        return sorted(out)


@pytest.fixture
def node(tmp_path: Path, node_store: dict[str, Any]) -> Iterator[NodeProc]:
    """A started node service with no tenant quotas yet (tests set them)."""
    base = tempfile.mkdtemp(prefix="ffnode-", dir="/tmp")
    proc = NodeProc(base, node_store)
    try:
        yield proc
    finally:
        proc.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def tenants(
    tenant_users: tuple[str, str], node_store: dict[str, Any], node: NodeProc
) -> Iterator[tuple[Tenant, Tenant]]:
    """alice and bob: each runs processes as its own Unix user with its own S3 keys."""
    made = [Tenant(u, node_store["keys"][u], node_store["proxy"].endpoint, node.socket)
            for u in tenant_users]  # fmt: skip
    try:
        yield made[0], made[1]
    finally:
        for t in made:
            t.kill_all()


@pytest.fixture
def make_node(node_store: dict[str, Any]) -> Iterator[Any]:
    """``make_node(base, **config)``: node services of their own (more than one node), each
    stopped after the test."""
    made: list[NodeProc] = []

    def make(base: str, **config: Any) -> NodeProc:
        made.append(NodeProc(base, node_store, **config))
        return made[-1]

    try:
        yield make
    finally:
        for proc in made:
            proc.stop()
