"""What the journey tests share: torchrun on a node, waiting on a run,
and the keys each rank logged (tests/support/journey_train.py writes them)."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from support import SUPPORT
from support.cluster import MARKER, Node, SimCluster

__all__ = ["TRAIN", "keys_of", "logs", "manifest_gets", "torchrun", "wait_for"]

#: the training script torchrun starts on every node
TRAIN = SUPPORT / "journey_train.py"


def torchrun(
    cluster: SimCluster, node: Node, *, nnodes: int, port: int, phase: str, args: list[str]
) -> subprocess.Popen[bytes]:
    """``torchrun`` of the training script on ``node``, 2 ranks, logging to ``<phase>-node<i>``."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes)]
    argv += ["--nproc-per-node", "2", "--node-rank", str(node.index)]
    argv += ["--master-addr", cluster.nodes[0].address, "--master-port", str(port)]
    argv += [str(TRAIN), *args]
    log = os.path.join(cluster.root, f"{phase}-node{node.index}.log")
    marker = f"{cluster.tag}:node{node.index}:{phase}"
    return cluster.popen(node, argv, log=log, env={MARKER: marker})


def logs(cluster: SimCluster, phase: str) -> str:
    """The tail of every log of ``phase``, for a failure's message."""
    out = []
    for name in sorted(os.listdir(cluster.root)):
        if name.startswith(phase):
            text = Path(cluster.root, name).read_text(errors="replace")
            out.append(f"--- {name}\n{text[-4000:]}")
    return "\n".join(out)


def wait_for(cond: Callable[[], bool], procs: list[subprocess.Popen[bytes]], what: str) -> None:
    """Until ``cond()``; fails at once when a process of ``procs`` has ended instead. The
    deadline only stops a hung run (pytest-timeout would too), it judges nothing."""
    deadline = time.monotonic() + 300
    while not cond():
        ended = [p.args for p in procs if p.poll() is not None]
        if ended or time.monotonic() > deadline:
            raise AssertionError(f"{what}: ended early {ended}" if ended else f"{what}: hung")
        time.sleep(0.3)


def keys_of(keys_dir: str) -> list[tuple[str, int, int, int, str]]:
    """(run, node, step, epoch, key) for every sample a rank received."""
    out = []
    for path in sorted(glob.glob(os.path.join(keys_dir, "*.log"))):
        m = re.fullmatch(r"(ws\d+-from\d+)-node(\d+)-rank\d+\.log", os.path.basename(path))
        assert m, path
        with open(path, encoding="utf-8") as f:
            for line in f:
                step, epoch, key = line.split(" ", 2)
                out.append((m.group(1), int(m.group(2)), int(step), int(epoch), key.strip()))
    return out


def manifest_gets(requests) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """GETs of the manifest header and of its shard table among ``requests``."""
    gets = [r.path for r in requests if r.method == "GET"]
    headers = sum(p.endswith("/manifest.json") for p in gets)
    tables = sum("/manifest-" in p and p.endswith(".arrow") for p in gets)
    return headers, tables


def kill_node_run(cluster: SimCluster, runs: list[subprocess.Popen[bytes]], node: int) -> None:
    """SIGKILL every rank of ``node``'s torchrun; the other nodes' runs end with it (their
    ranks fail their next collective), and no process of the killed run may outlive it."""
    ranks = cluster.children(runs[node].pid)
    assert len(ranks) == 2, cluster.survivors()
    for pid in ranks:
        os.kill(pid, signal.SIGKILL)
    for proc in runs:
        proc.wait(timeout=120)
    assert [p.returncode for p in runs] != [0] * len(runs)
    left = cluster.wait_gone(":train1", timeout=10)
    assert not left, f"processes of the killed run outlived it: {left}"
