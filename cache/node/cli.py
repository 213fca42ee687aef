"""``flashfeed node serve|status|metrics|warm|reload``: run the node service, and ask it."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from typing import Any

from flashfeed.units import format_size

__all__ = ["register"]


def _client(args: argparse.Namespace) -> Any:
    from .client import NodeClient

    return NodeClient(args.socket, job=getattr(args, "job", None), reconnect_timeout=args.wait)


def _serve(args: argparse.Namespace) -> int:
    from .server import NodeService

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    NodeService(args.config).serve_forever()
    return 0


def _status(args: argparse.Namespace) -> int:
    with _client(args) as client:
        body = client.status()
    if args.json:
        print(json.dumps(body, indent=2, sort_keys=True))
        return 0
    print(status_text(body))
    return 0


def status_text(body: dict[str, Any]) -> str:
    """The status as a table: one row per tenant and job (the asker's only, unless admin)."""
    lines = [f"tenant {body['tenant']} (job {body['job']}), quota {format_size(body['quota'])}"]
    if body.get("admin"):
        lines.append(f"node: {format_size(body['used'])} of {format_size(body['capacity'])} "
                     f"charged, {format_size(body['disk'])} on disk")  # fmt: skip
    head = ("tenant", "job", "resident", "pinned", "fetched", "hits", "misses", "evicted",
            "caused", "fill wait")  # fmt: skip
    lines.append("  ".join(f"{h:>10}" for h in head))
    report = body["report"]
    for r in [*report["rows"], {"tenant": "total", "job": "", **report["totals"]}]:
        cells = (r["tenant"], r["job"], format_size(r["resident_bytes"]),
                 format_size(r["pinned_bytes"]), format_size(r["fetched_bytes"]),
                 f"{r['hits']:.0f}", f"{r['misses']:.0f}", f"{r['evictions_suffered']:.0f}",
                 f"{r['evictions_caused']:.0f}", f"{r['fill_wait_seconds']:.2f}s")  # fmt: skip
        lines.append("  ".join(f"{c:>10}" for c in cells))
    for d in body["datasets"]:
        lines.append(f"dataset {d['url']}: {d['cached_shards']} of {d['shards']} shards "
                     f"({format_size(d['bytes'])})")  # fmt: skip
    return "\n".join(lines)


def _metrics(args: argparse.Namespace) -> int:
    with _client(args) as client:
        sys.stdout.write(client.metrics())
    return 0


def _warm(args: argparse.Namespace) -> int:
    from flashfeed.dataset import Dataset

    shards = _shard_list(args.shards)
    with _client(args) as client:
        if shards is None:
            shards = list(range(len(Dataset.open(args.dataset).shards)))
        reply = client.warm(args.dataset, shards, pin=not args.no_pin)
    print(f"warmed {reply['shards']} shards of {args.dataset} ({reply['bytes']}, "
          f"{reply['fetched']} fetched) for job {client.job}")  # fmt: skip
    return 0


def _reload(args: argparse.Namespace) -> int:
    with _client(args) as client:
        reply = client.reload()
    if reply.get("error_in_config"):
        print(f"flashfeed node reload: config kept: {reply['error_in_config']}", file=sys.stderr)
        return 1
    return 0


# -- `flashfeed cache warm|status|verify|evict` when $FLASHFEED_NODE_SOCKET selects a service --
def via_service(given_dir: str | None) -> bool:
    """Whether a ``flashfeed cache`` command goes to the node service: no directory given
    and ``$FLASHFEED_NODE_SOCKET`` set."""
    from .client import node_socket

    return given_dir is None and node_socket() is not None


def _service_client() -> Any:
    from .client import NodeClient

    return NodeClient(reconnect_timeout=5.0)


def cluster_service(args: argparse.Namespace) -> Any:
    """``cache warm --ray-address`` with ``$FLASHFEED_NODE_SOCKET`` set and no directory:
    each node warms through its own service (``ServiceWarm``); None otherwise."""
    from .client import JOB_ENV, node_socket

    sock = node_socket()
    if args.cache_dir is not None or sock is None:
        return None
    if getattr(args, "peers", None):
        raise ValueError(
            "--peers configures a warm's own cluster tier; through the node services, "
            "their peers section does: drop --peers"
        )
    from ..warm.service import ServiceWarm

    return ServiceWarm(socket=sock, job=os.environ.get(JOB_ENV) or "default")


def cache_warm(args: argparse.Namespace, share: Any) -> int:
    """``cache warm URL|MIXTURE.json``: this node's share (the plan's order; of a mixture,
    every source's shards), fetched and pinned by the service in one warm inside this
    tenant's quota (job ``$FLASHFEED_JOB``): over it, one line and no fetch."""
    from flashfeed.plan.mixture import is_mixture_file, load_mixture

    from ..warm.service import warm_through_service

    target = args.dataset
    if is_mixture_file(args.dataset):
        if args.batch_size < 1:
            raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
        target = load_mixture(args.dataset)
    with _service_client() as client:  # with this user's own credentials
        reply = warm_through_service(client, target, share, batch=args.batch_size)
    what = args.dataset
    if not isinstance(target, str):
        what = f"the {len(target.sources)} sources of {args.dataset}"
    print(f"warmed {reply['shards']} shards of {what} ({reply['bytes']}, {reply['fetched']} "
          f"fetched) through the node service for job {client.job}")  # fmt: skip
    return 0


def cache_status(args: argparse.Namespace) -> int:
    with _service_client() as client:
        body = client.status()
    print(json.dumps(body, indent=2, sort_keys=True) if args.json else status_text(body))
    return 0


def cache_verify(args: argparse.Namespace) -> int:
    with _service_client() as client:
        r = client.verify()
    print(f"node cache: {r['checked']} shards checked, {r['corrupt']} corrupt (removed, "
          f"fetched again on next use), {r['in_use']} corrupt ones in use kept")  # fmt: skip
    return 1 if r["corrupt"] else 0


def cache_evict(args: argparse.Namespace) -> int:
    with _service_client() as client:
        r = client.evict(None if args.all else args.dataset)
    print(f"node cache: {r['released_pins']} pins of this tenant released, {r['evicted']} "
          f"shards evicted ({format_size(r['bytes'])}), {r['kept']} kept (in use or pinned "
          "by another tenant)")  # fmt: skip
    return 0


def _shard_list(text: str | None) -> list[int] | None:
    if text is None:
        return None
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        try:
            out.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"--shards must look like 0-3,7, got {text!r}") from None
    return out


def register(subparsers: Any) -> None:
    node = subparsers.add_parser(
        "node",
        help="the node service: one cache per node, shared by tenants with quotas",
        description="The node service owns the node's cache directory; loaders and commands "
        "select it with FLASHFEED_NODE_SOCKET.",
    )
    sub = node.add_subparsers(dest="node_command", metavar="ACTION", required=True)
    s = sub.add_parser("serve", help="run the node service (as the cache's owner)")
    s.add_argument("config", metavar="CONFIG", help="the node config file (JSON)")
    s.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    s.set_defaults(func=_serve)
    for name, func, text in (
        ("status", _status, "this tenant's figures (every tenant's for an admin)"),
        ("metrics", _metrics, "the same figures as Prometheus text"),
        ("warm", _warm, "fetch and pin shards of a dataset inside this tenant's quota"),
        ("reload", _reload, "read the config file again (admins)"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--socket", default=None, help="the service's socket "
                       "(default: $FLASHFEED_NODE_SOCKET)")  # fmt: skip
        p.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the service")
        p.set_defaults(func=func)
        if name == "status":
            p.add_argument("--json", action="store_true")
        if name == "warm":
            p.add_argument("dataset", metavar="DATASET", help="dataset URL (s3://...)")
            p.add_argument("--shards", default=None, help="e.g. 0-3,7 (default: all)")
            p.add_argument("--job", default=None, help="the job the pins belong to")
            p.add_argument("--no-pin", action="store_true", help="fetch without pinning")
