"""A sweep's warm, planned as one: several jobs of one dataset on different nodes.

A sweep file (JSON) names the dataset and each job's plan inputs and hosts, in node-rank
order::

    {"dataset": "s3://flashfeed/photos-v1", "max_serving": 4,
     "jobs": [{"name": "lr-1", "hosts": ["node01", "node02"], "ranks_per_node": 8,
               "seed": 0, "epochs": 1},
              {"name": "lr-2", "hosts": ["node03:7461"], "seed": 1}]}

A host is ``HOST`` or ``HOST:PORT`` (its peer server; without a port, ``--peer-port``).
``plan_sweep`` (pure) takes every node's share at once and places each shard's store read at
one node and every other copy, in waves capped at ``max_serving`` per source; each node's
``--peers`` spec then carries the store readers (``owners``) and its own sources.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flashfeed.dataset import Dataset

from ..warm.nodeshare import NodeShare
from .discovery import with_port
from .placement import Placement, place

__all__ = ["Sweep", "SweepJob", "SweepNode", "load_sweep", "parse_sweep", "plan_sweep"]

_JOB_KEYS = {
    "name",
    "hosts",
    "ranks_per_node",
    "epochs",
    "seed",
    "shuffle",
    "window",
    "drop_last",
}
_SWEEP_KEYS = {"dataset", "jobs", "max_serving", "seed"}


@dataclass(frozen=True)
class SweepJob:
    """One job of a sweep: its name, its hosts in node-rank order, its plan inputs."""

    name: str
    hosts: tuple[str, ...]
    ranks_per_node: int = 1
    epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    window: int = 4
    drop_last: bool = True

    def share(self, node_rank: int) -> NodeShare:
        return NodeShare.build(
            node_rank=node_rank,
            num_nodes=len(self.hosts),
            ranks_per_node=self.ranks_per_node,
            epochs=self.epochs,
            seed=self.seed,
            shuffle=self.shuffle,
            window=self.window,
            drop_last=self.drop_last,
        )


@dataclass(frozen=True)
class SweepNode:
    """One node of a sweep: its job, its host entry, its peer server, its share."""

    job: str
    host: str
    peer: str
    share: NodeShare

    @property
    def hostname(self) -> str:
        """The host without the peer port (what Ray's node list is matched against)."""
        if self.host.startswith("["):
            return self.host[1 : self.host.index("]")]
        return self.host.rsplit(":", 1)[0] if self.host.count(":") == 1 else self.host


@dataclass(frozen=True)
class Sweep:
    """A parsed sweep file."""

    dataset: str
    jobs: tuple[SweepJob, ...]
    max_serving: int = 4
    seed: int = 0

    def nodes(self, *, port: int = 7460) -> list[SweepNode]:
        """Every node of every job, job after job, each in node-rank order."""
        return [
            SweepNode(job.name, host, with_port(host, port), job.share(rank))
            for job in self.jobs
            for rank, host in enumerate(job.hosts)
        ]


def _int(where: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where} must be an integer >= {low}, got {value!r}")
    return value


def parse_sweep(data: Any, *, source: str = "the sweep") -> Sweep:
    """A ``Sweep`` from the decoded JSON; ValueError naming the bad entry."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{source}: must be a JSON object with 'dataset' and 'jobs'")
    unknown = sorted(set(data) - _SWEEP_KEYS)
    if unknown:
        raise ValueError(f"{source}: unknown keys {unknown} (known: {sorted(_SWEEP_KEYS)})")
    dataset = data.get("dataset")
    if not isinstance(dataset, str) or not dataset:
        raise ValueError(f"{source}: 'dataset' must be the dataset's URL, got {dataset!r}")
    raw_jobs = data.get("jobs")
    if not isinstance(raw_jobs, list) or not raw_jobs:
        raise ValueError(f"{source}: 'jobs' must be a non-empty list, got {raw_jobs!r}")
    jobs: list[SweepJob] = []
    seen: dict[str, str] = {}
    for n, raw in enumerate(raw_jobs):
        where = f"{source}: jobs[{n}]"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where} must be an object, got {raw!r}")
        unknown = sorted(set(raw) - _JOB_KEYS)
        if unknown:
            raise ValueError(f"{where}: unknown keys {unknown} (known: {sorted(_JOB_KEYS)})")
        name = raw.get("name", f"job{n}")
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: 'name' must be a non-empty string, got {name!r}")
        hosts = raw.get("hosts")
        if (
            not isinstance(hosts, list)
            or not hosts
            or not all(isinstance(h, str) and h and h == h.strip() for h in hosts)
        ):
            raise ValueError(f"{where}: 'hosts' must be a non-empty list of hosts, got {hosts!r}")
        for host in hosts:
            if host in seen:
                raise ValueError(
                    f"{where}: host {host!r} is already a node of job {seen[host]!r}: each "
                    "node warms for one job of a sweep"
                )
            seen[host] = name
        for flag in ("shuffle", "drop_last"):
            if flag in raw and not isinstance(raw[flag], bool):
                raise ValueError(f"{where}: {flag!r} must be true or false, got {raw[flag]!r}")
        job = SweepJob(
            name=name,
            hosts=tuple(hosts),
            ranks_per_node=_int(f"{where}: 'ranks_per_node'", raw.get("ranks_per_node", 1), 1),
            epochs=_int(f"{where}: 'epochs'", raw.get("epochs", 1), 1),
            seed=_int(f"{where}: 'seed'", raw.get("seed", 0), 0),
            shuffle=raw.get("shuffle", True),
            window=_int(f"{where}: 'window'", raw.get("window", 4), 1),
            drop_last=raw.get("drop_last", True),
        )
        job.share(0)  # the plan's own checks, before any I/O
        jobs.append(job)
    if len({j.name for j in jobs}) != len(jobs):
        raise ValueError(f"{source}: two jobs have the same name")
    return Sweep(
        dataset=dataset,
        jobs=tuple(jobs),
        max_serving=_int(f"{source}: 'max_serving'", data.get("max_serving", 4), 1),
        seed=_int(f"{source}: 'seed'", data.get("seed", 0), 0),
    )


def load_sweep(path: str) -> Sweep:
    """The sweep file at ``path``; ValueError (one line) when it cannot be read or is wrong."""
    try:
        with open(path) as f:
            data = json.load(f)
    except OSError as exc:
        raise ValueError(f"cannot read the sweep file {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"the sweep file {path} is not JSON: {exc}") from None
    return parse_sweep(data, source=path)


def plan_sweep(
    dataset: Dataset,
    nodes: Sequence[SweepNode],
    *,
    max_serving: int = 4,
    seed: int = 0,
) -> tuple[Placement, dict[str, dict[str, Any]]]:
    """The placement of every node's share at once, and each node's ``--peers`` spec:
    every peer server, its own (``self``), the store readers and its planned sources."""
    peers = [n.peer for n in nodes]
    if len(set(peers)) != len(peers):
        raise ValueError(f"two nodes of the sweep share a peer server: {peers}")
    placement = place(
        {n.peer: n.share.order(dataset) for n in nodes},
        max_serving=max_serving,
        seed=seed,
    )
    owners = {str(shard): str(node) for shard, node in placement.store.items()}
    sources: dict[str, dict[str, str]] = {p: {} for p in peers}
    for c in placement.copies:
        sources[str(c.target)][str(c.shard)] = str(c.source)
    specs = {p: {"peers": peers, "self": p, "owners": owners, "sources": sources[p]} for p in peers}
    return placement, specs
