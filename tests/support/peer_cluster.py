"""Simulated nodes of the cluster tier on one machine: each a ``peer_node.py`` process on
its own loopback address (127.0.0.N) with its own counting proxy in front of the store, so a
test (or a benchmark) reads per node which shard bytes the store served it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashfeed.runtime.lifeline import popen

from support.slowproxy import SlowProxy

__all__ = ["SimNode", "start_node"]

WORKER = Path(__file__).with_name("peer_node.py")


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
) -> SimNode:
    """A node process listening on ``host`` whose store requests pass a proxy of its own
    (or ``proxy``, shared: one store bandwidth for every node; ``stop`` leaves it open)."""
    own = proxy is None
    proxy = proxy or SlowProxy(("127.0.0.1", store_port), rate=store_rate)
    args = [sys.executable, str(WORKER), cache_dir, host, proxy.endpoint]
    args += ["--rate", str(serve_rate), "--part-size", part_size]
    proc = popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    node = SimNode(name, proc, proxy, cache_dir, own_proxy=own)
    node.address = node.answer()["address"]
    return node
