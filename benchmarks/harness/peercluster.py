"""Simulated nodes of the cluster tier on one machine: each a ``peernode.py`` process on
its own loopback address (127.0.0.N) with its own counting proxy in front of the store, so a
test (or a benchmark) reads per node which shard bytes the store served it; or ``Cluster``:
nodes sharing one throttled proxy, the store's bandwidth as the bottleneck."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.harness.slowproxy import SlowProxy
from flashfeed.cache.peer.clusterwarm import cluster_placement, store_owners
from flashfeed.cache.warm.nodeshare import NodeShare
from flashfeed.dataset import Dataset
from flashfeed.runtime.lifeline import popen

__all__ = ["Cluster", "SimNode", "assign_owners", "start_node"]

WORKER = Path(__file__).with_name("peernode.py")


@dataclass
class SimNode:
    """One node: its process, its store proxy and its cache directory."""

    name: str
    proc: subprocess.Popen[str]
    proxy: SlowProxy
    cache_dir: str
    address: str = ""
    own_proxy: bool = True
    log: list[dict[str, Any]] = field(default_factory=list)

    def send(self, cmd: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"node {self.name} exited ({self.proc.wait()})")
        out = json.loads(line)
        self.log.append(out)
        if "error" in out:
            raise RuntimeError(f"node {self.name}: {out['error']}\n{out.get('trace', '')}")
        return out

    def call(self, cmd: dict[str, Any]) -> dict[str, Any]:
        self.send(cmd)
        return self.answer()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.own_proxy:
            self.proxy.close()


def start_node(
    name: str,
    host: str,
    cache_dir: str,
    store_port: int,
    *,
    store_rate: float = 0.0,
    serve_rate: float = 0.0,
    part_size: str = "256KiB",
    proxy: SlowProxy | None = None,
    capacity: int | None = None,
    loader: bool = False,
) -> SimNode:
    """A node process listening on ``host`` whose store requests pass a proxy of its own
    (or ``proxy``, shared: one store bandwidth for every node; ``stop`` leaves it open);
    ``loader``: it imports the training reader at start (for ``epoch`` commands)."""
    own = proxy is None
    proxy = proxy or SlowProxy(("127.0.0.1", store_port), rate=store_rate)
    args = [sys.executable, str(WORKER), cache_dir, host, proxy.endpoint]
    args += ["--rate", str(serve_rate), "--part-size", part_size]
    if capacity is not None:
        args += ["--capacity", str(capacity)]
    if loader:
        args += ["--loader", "1"]
    proc = popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    node = SimNode(name, proc, proxy, cache_dir, own_proxy=own)
    node.address = node.answer()["address"]
    return node


class Cluster:
    """Simulated nodes sharing one throttled store proxy."""

    def __init__(
        self, root: Path, store_port: int, proxy: SlowProxy, part_size: str, *, loader: bool = False
    ) -> None:
        self.root, self.store_port, self.proxy, self.part_size = root, store_port, proxy, part_size
        self.loader = loader  # its nodes import the training reader at start
        self.nodes: list[SimNode] = []
        self._n = 1

    def start(self, name: str | None = None) -> SimNode:
        """A node on the next 127.0.0.N; its cache is ``root/name`` (default: its host)."""
        self._n += 1
        name = name or f"127.0.0.{self._n}"
        node = start_node(
            name,
            f"127.0.0.{self._n}",
            str(self.root / name),
            self.store_port,
            part_size=self.part_size,
            proxy=self.proxy,
            loader=self.loader,
        )
        self.nodes.append(node)
        return node

    def connect(self, nodes: list[SimNode]) -> None:
        """Each of ``nodes`` learns all of them as its peers."""
        for node in nodes:
            node.call({"peers": [n.address for n in nodes]})

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []


def assign_owners(nodes: list[SimNode], ds: Dataset, shares: dict[str, NodeShare]) -> None:
    """Every node learns the placement's store reader of each shard (``PeerTier.assign``),
    planned from the nodes' shares (by address)."""
    owners = store_owners(cluster_placement(ds, shares, max_serving=2))
    for node in nodes:
        node.call({"assign": ds.url, "owners": {str(s): a for s, a in owners.items()}})
