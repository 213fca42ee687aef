"""``flashfeed cache warm|status|verify|evict``: the cache from the command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from flashfeed.plan.mixture import Mixture, is_mixture_file, load_mixture
from flashfeed.plan.plan import PlanOptions
from flashfeed.telemetry import CACHE_DIR_ENV, default_cache_dir
from flashfeed.units import parse_size

from ..node import cli as node_cli
from ..shardcache import ShardCache
from ..warm.nodeshare import NodeShare
from ..warm.warm import warm_share
from . import admin
from .cliprint import (
    evict_lines,
    status_lines,
    verify_lines,
    warm_errors,
    warm_summary,
)
from .options import (
    EVICT_EPILOG,
    RAW,
    STATUS_EPILOG,
    VERIFY_EPILOG,
    WARM_EPILOG,
    cluster_options,
    peer_options,
    peer_spec,
    plan_options,
    sweep_options,
)

__all__ = ["register"]


def _cache_dir(given: str | None, what: str, *, existing: bool) -> str:
    """The cache directory from the flag or the environment. ``existing``: it must already
    be one (status, verify and evict read a cache; only warm creates it)."""
    root = given or default_cache_dir()
    if os.path.exists(root) and not os.path.isdir(root):
        raise NotADirectoryError(
            f"{root} is a file, not a cache directory: pass a directory ({what})"
        )
    if existing and not os.path.isdir(root):
        raise FileNotFoundError(
            f"no cache directory at {root}: check the path (`flashfeed cache warm` creates one)"
        )
    return root


def _on_cache_dir(
    sub: Any, name: str, *, help: str, description: str, epilog: str
) -> argparse.ArgumentParser:
    """A command that reads an existing cache: its directory is the optional DIR."""
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=description, epilog=epilog, formatter_class=RAW
    )
    p.add_argument(
        "dir", metavar="DIR", nargs="?", help=f"default: ${CACHE_DIR_ENV}, else ~/.cache/flashfeed"
    )
    return p


def register(subparsers: Any) -> None:
    cache = subparsers.add_parser(
        "cache",
        help="node-local shard cache: warm, status, verify, evict",
        description="The node-local shard cache shared by every process on a node.",
    )
    sub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    w = sub.add_parser(
        "warm",
        help="fetch this node's shards before a run",
        description="Fetch the shards this node will read (from the loader's plan), in read\n"
        "order, until the capacity is reached. Re-running continues an interrupted warm.",
        epilog=WARM_EPILOG,
        formatter_class=RAW,
    )
    w.add_argument(
        "dataset",
        metavar="DATASET",
        nargs="?",
        help="dataset URL (s3://..., local path), or a mixture file (.json/.yaml); none "
        "with --sweep",
    )
    w.add_argument(
        "--cache-dir",
        metavar="DIR",
        help=f"the node's cache directory (default: ${CACHE_DIR_ENV}, else "
        "~/.cache/flashfeed, read on each node)",
    )
    w.add_argument(
        "--capacity",
        metavar="SIZE",
        help="e.g. 500GiB, recorded in DIR for every process that opens it (default: the "
        "capacity DIR records, else 80%% of its free disk plus what DIR holds)",
    )
    w.add_argument(
        "--concurrency",
        type=int,
        default=8,
        metavar="C",
        help="parallel GETs (adapts down on throttling); default 8",
    )
    w.add_argument(
        "--part-size",
        default="16MiB",
        metavar="SIZE",
        help="ranged GET size for large shards; default 16MiB",
    )
    w.add_argument("--no-progress", action="store_true", help="no progress bar")
    w.add_argument("--json", action="store_true", help="print the summary as JSON")
    w.add_argument(
        "--batch-size",
        type=int,
        default=1,
        metavar="B",
        help="a mixture's loader batch size: its epochs are whole batches (1)",
    )
    plan_options(w, defaults=True)
    cluster_options(w)
    peer_options(w)
    sweep_options(w)
    w.set_defaults(func=_warm)

    s = _on_cache_dir(
        sub,
        "status",
        help="what the cache holds, whether a share fits, counters",
        description="Capacity and use, whether each dataset's share for this node fits,\n"
        "hit/miss/byte counters, throttling events, and the next shards to fetch.",
        epilog=STATUS_EPILOG,
    )
    s.add_argument("--dataset", metavar="URL")
    s.add_argument("--json", action="store_true", help="print JSON")
    plan_options(s, defaults=False)
    s.set_defaults(func=_status)

    v = _on_cache_dir(
        sub,
        "verify",
        help="check every cached shard's checksum",
        description="Check every cached shard against its manifest checksum; corrupt\n"
        "shards are removed (they are fetched again on next use).",
        epilog=VERIFY_EPILOG,
    )
    v.set_defaults(func=_verify)

    e = _on_cache_dir(
        sub,
        "evict",
        help="remove cached shards",
        description="Release the warm pins of one dataset or of all and remove their cached\n"
        "shards; shards pinned by ShardCache.pin and shards in use by a process are kept.",
        epilog=EVICT_EPILOG,
    )
    which = e.add_mutually_exclusive_group(required=True)
    which.add_argument("--dataset", metavar="URL")
    which.add_argument("--all", action="store_true")
    e.set_defaults(func=_evict)


def _share(args: argparse.Namespace) -> NodeShare:
    """The node share of the plan flags (warm: every flag has its default)."""
    return NodeShare.build(
        node_rank=0 if args.node_rank is None else args.node_rank,
        num_nodes=args.num_nodes,
        world_size=args.world_size,
        ranks_per_node=args.ranks_per_node,
        epochs=args.epochs,
        seed=args.seed,
        shuffle=args.shuffle,
        window=args.window,
        drop_last=args.drop_last,
    )


def _say(message: str) -> None:
    print(f"flashfeed cache warm: warning: {message}", file=sys.stderr)


def _warm(args: argparse.Namespace) -> int:
    if args.sweep is not None or args.local:
        from .sweepcli import warm_sweep_command

        return warm_sweep_command(args)
    if args.dataset is None:
        raise ValueError("cache warm needs a DATASET (or --sweep FILE)")
    share = _share(args)  # every plan value checked before any I/O
    # None: each node's cache keeps its recorded capacity (a new one sizes itself to its disk)
    capacity = parse_size(args.capacity, name="--capacity") if args.capacity else None
    kwargs: dict[str, Any] = {
        "capacity": capacity,
        "concurrency": args.concurrency,
        "part_size": args.part_size,
    }
    spec = peer_spec(args)
    if spec is not None:
        kwargs["peers"] = spec
    if args.ray_address is None and (args.hosts or args.hostfile):
        raise ValueError("--hosts and --hostfile name the nodes of a cluster: add --ray-address")
    if node_cli.via_service(args.cache_dir) and args.ray_address is None:
        return node_cli.cache_warm(args, share)
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be >= 1, got {args.batch_size}")
    mixture = load_mixture(args.dataset) if is_mixture_file(args.dataset) else None
    if mixture is not None and spec is not None:
        raise ValueError("--peers warms one dataset; a mixture's sources: one at a time")
    if args.ray_address is not None:
        results = _warm_cluster(args, share, kwargs, mixture)
    else:
        root = _cache_dir(args.cache_dir, "--cache-dir", existing=False)
        if spec is not None:
            from ..peer.clusterwarm import with_peer_tier

            kwargs = with_peer_tier(kwargs)
        with ShardCache(root, **kwargs) as cache:
            # the manifest is kept in the cache for offline runs (a mixture's sources' too)
            target = mixture if mixture is not None else cache.open_dataset(args.dataset)
            result = warm_share(
                cache, target, share, progress=not args.no_progress, batch=args.batch_size
            )
        results = [{**result.to_dict(), "cache_dir": root}]
        if spec is not None:
            results[0]["peers"] = kwargs["peers"].stats()
    if mixture is not None:
        results = [{**r, "mixture": args.dataset} for r in results]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        _print(warm_summary(results))
    errors = warm_errors(results)
    _print(errors, file=sys.stderr)
    return 1 if errors else 0


def _warm_cluster(
    args: argparse.Namespace,
    share: NodeShare,
    kwargs: dict[str, Any],
    mixture: Mixture | None = None,
) -> list[dict[str, Any]]:
    from ..warm.cluster import parse_hostfile, parse_hosts, warm_cluster

    if args.node_rank is not None:
        raise ValueError(
            "--node-rank is for warming one node; a cluster warm ranks the nodes by their "
            "place in --hosts / --hostfile"
        )
    hosts = None
    if args.hosts:
        hosts = parse_hosts(args.hosts)
    elif args.hostfile:
        hosts = parse_hostfile(args.hostfile)
    given = args.num_nodes if args.world_size is None else share.num_nodes
    service = node_cli.cluster_service(args)
    return warm_cluster(
        args.dataset if mixture is None else mixture,
        args.cache_dir,  # None: each node's own FLASHFEED_CACHE_DIR
        address=args.ray_address,
        options=share.options,
        ranks_per_node=share.ranks_per_node,
        epochs=share.epochs,
        hosts=hosts,
        num_nodes=given,
        cache_kwargs=kwargs,
        warn=_say,
        batch=args.batch_size,
        service=service,
    )


def _share_from(args: argparse.Namespace) -> NodeShare | None:
    given = [
        args.node_rank, args.num_nodes, args.world_size, args.ranks_per_node, args.epochs,
        args.seed, args.shuffle, args.window, args.drop_last,
    ]  # fmt: skip
    if all(v is None for v in given):
        return None
    plan = PlanOptions()
    return NodeShare.build(
        node_rank=args.node_rank or 0,
        num_nodes=args.num_nodes,
        world_size=args.world_size,
        ranks_per_node=args.ranks_per_node or 1,
        epochs=args.epochs or 1,
        seed=plan.seed if args.seed is None else args.seed,
        shuffle=plan.shuffle if args.shuffle is None else args.shuffle,
        window=plan.window if args.window is None else args.window,
        drop_last=plan.drop_last if args.drop_last is None else args.drop_last,
    )


def _status(args: argparse.Namespace) -> int:
    if node_cli.via_service(args.dir):
        return node_cli.cache_status(args)
    root = _cache_dir(args.dir, "DIR", existing=True)
    if args.dataset is not None and is_mixture_file(args.dataset):
        report = _mixture_status(root, args)
    else:
        report = admin.status(root, url=args.dataset, share=_share_from(args))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        _print(status_lines(report))
    return 0


def _mixture_status(root: str, args: argparse.Namespace) -> dict[str, Any]:
    """``cache status --dataset MIXTURE``: the status of each source, named."""
    if _share_from(args) is not None:
        raise ValueError(
            f"--dataset {args.dataset} is a mixture: its node share is the mixture plan's, "
            "which cache status does not compute; drop the plan flags (cache warm "
            "reports the share it fetched)"
        )
    mixture = load_mixture(args.dataset)
    report: dict[str, Any] = {}
    datasets = []
    for s in mixture.sources:
        try:
            one = admin.status(root, url=s.url)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"mixture source {s.key!r} ({s.url}) cannot be opened: {exc}"
            ) from None
        datasets += [{**d, "source": s.key} for d in one["datasets"]]
        report = one
    return {**report, "mixture": args.dataset, "datasets": datasets}


def _verify(args: argparse.Namespace) -> int:
    if node_cli.via_service(args.dir):
        return node_cli.cache_verify(args)
    root = _cache_dir(args.dir, "DIR", existing=True)
    report = admin.verify(root)
    _print(verify_lines(root, report))
    return 1 if report["corrupt"] else 0


def _evict(args: argparse.Namespace) -> int:
    if node_cli.via_service(args.dir):
        return node_cli.cache_evict(args)
    root = _cache_dir(args.dir, "DIR", existing=True)
    _print(evict_lines(admin.evict(root, url=None if args.all else args.dataset)))
    return 0


def _print(lines: list[str], *, file: TextIO | None = None) -> None:
    for line in lines:
        print(line, file=file or sys.stdout)
