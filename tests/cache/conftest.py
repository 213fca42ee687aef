"""Fixtures of the cluster tier's tests: the cluster token, simulated nodes (each a process
on its own 127.0.0.N with its own counting store proxy) and a store proxy of the test's own."""

from __future__ import annotations

import pytest

from benchmarks.harness.peercluster import SimNode, start_node
from benchmarks.harness.slowproxy import SlowProxy

from support.cache_data import PEER_TOKEN


@pytest.fixture
def token(monkeypatch):
    monkeypatch.setenv("FLASHFEED_PEER_TOKEN", PEER_TOKEN.decode())
    return PEER_TOKEN


@pytest.fixture
def nodes(tmp_path, s3_store, token):
    started: list[SimNode] = []

    def start(name: str, n: int, **kw) -> SimNode:
        node = start_node(name, f"127.0.0.{n}", str(tmp_path / name), s3_store.info.s3_port, **kw)
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()


@pytest.fixture
def proxy(s3_store):
    p = SlowProxy(("127.0.0.1", s3_store.info.s3_port))
    yield p
    p.close()
