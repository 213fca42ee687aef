"""Warming through a node service: a node's share of a dataset or of every source of a
mixture, in the plan's order, fetched and pinned by the service as one warm (refused whole,
in one line, when it cannot fit in the tenant's quota). ``flashfeed cache warm`` runs it
here; a cluster warm (``cluster.py``) runs it on every node, at that node's service."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any

from flashfeed.dataset import Dataset
from flashfeed.errors import FlashfeedError
from flashfeed.plan.mixture import Mixture

from .nodeshare import NodeShare
from .units import share_units
from .warm import WarmResult

__all__ = ["ServiceWarm", "warm_node_service", "warm_through_service"]


@dataclass(frozen=True)
class ServiceWarm:
    """A cluster warm through each node's service: the socket a node's own environment
    names (``FLASHFEED_NODE_SOCKET`` where its Ray workers run), else the driver's
    ``socket``; the warm's pins belong to job ``job`` of the Unix user Ray runs as."""

    socket: str
    job: str


def warm_through_service(
    client: Any,
    target: str | Mixture,
    share: NodeShare,
    *,
    batch: int = 1,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``share`` of ``target`` (a dataset's URL, or a mixture: every source's shards) warmed
    by the service ``client`` (a ``NodeClient``) talks to, in the plan's order; its reply
    (``shards``, ``fetched``, ``fetched_bytes``, ``bytes``). ``batch``: the loader's batch
    size, for a mixture's plan."""
    what = (
        target
        if isinstance(target, Mixture)
        else Dataset.open(target, storage_options=storage_options)
    )
    units = share_units(what, share, batch=batch, storage_options=storage_options)
    return dict(client.warm_sources([d.url for d in units.datasets], units.first_needs()))


def warm_node_service(
    target: str | Mixture,
    share: NodeShare,
    storage_options: dict[str, Any] | None,
    batch: int,
    service: ServiceWarm,
) -> dict[str, Any]:
    """A cluster warm's task on one node: ``warm_through_service`` at this node's service,
    as the Unix user the task runs as; its result as ``warm_node``'s (a failure comes back
    as ``"error"``, one line)."""
    from ..node.client import NodeClient, node_socket

    sock = node_socket() or service.socket
    out = WarmResult(node_rank=share.node_rank, shards=0).to_dict()
    start = time.monotonic()
    try:
        with NodeClient(sock, job=service.job, storage_options=storage_options) as client:
            reply = warm_through_service(
                client, target, share, batch=batch, storage_options=storage_options
            )
        out.update(shards=reply["shards"], pinned=reply["shards"], fetched=reply["fetched"],
                   already=reply["shards"] - reply["fetched"],
                   bytes_fetched=reply["fetched_bytes"])  # fmt: skip
    except (FlashfeedError, ValueError, OSError) as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    out.update(seconds=time.monotonic() - start, host=socket.gethostname(), service=sock)
    return out
