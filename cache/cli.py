"""``flashfeed cache warm|status|verify|evict``: the cache from the command line."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from flashfeed.dataset import Dataset
from flashfeed.units import format_size, parse_size

from . import admin
from .shardcache import ShardCache
from .warm import NodeShare, warm

__all__ = ["register"]

_RAW = argparse.RawDescriptionHelpFormatter

WARM_EPILOG = """\
examples:
  # before a 4-node run with 8 GPUs per node, on node 2:
  flashfeed cache warm s3://flashfeed/photos-v1 --cache-dir /nvme/ff-cache \\
      --node-rank 2 --num-nodes 4 --ranks-per-node 8 --epochs 3 --seed 0 --capacity 500GiB
  # every node of a Ray cluster at once, one task per node:
  flashfeed cache warm s3://flashfeed/photos-v1 --cache-dir /nvme/ff-cache \\
      --ranks-per-node 8 --ray-address auto
"""
STATUS_EPILOG = """\
examples:
  flashfeed cache status /nvme/ff-cache
  flashfeed cache status /nvme/ff-cache --dataset s3://flashfeed/photos-v1 \\
      --node-rank 2 --num-nodes 4 --ranks-per-node 8 --epochs 3
"""
VERIFY_EPILOG = """\
example:
  flashfeed cache verify /nvme/ff-cache     # exit 1 if a corrupt shard was found (and removed)
"""
EVICT_EPILOG = """\
examples:
  flashfeed cache evict /nvme/ff-cache --dataset s3://flashfeed/photos-v1
  flashfeed cache evict /nvme/ff-cache --all
"""


def _plan_options(p: argparse.ArgumentParser, *, defaults: bool) -> None:
    g = p.add_argument_group("the run's plan (the same values the loader gets)")

    def dflt(value: int) -> int | None:  # status: None means "not given", use the last plan
        return value if defaults else None

    g.add_argument("--node-rank", type=int, default=dflt(0), metavar="R", help="this node (0)")
    g.add_argument("--num-nodes", type=int, default=dflt(1), metavar="N", help="nodes (1)")
    g.add_argument(
        "--ranks-per-node", type=int, default=dflt(1), metavar="K", help="ranks per node (1)"
    )
    g.add_argument("--epochs", type=int, default=dflt(1), metavar="E", help="epochs to cover (1)")
    g.add_argument("--seed", type=int, default=dflt(0), metavar="S", help="the plan's seed (0)")


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
        formatter_class=_RAW,
    )
    w.add_argument("dataset", metavar="DATASET", help="dataset URL (s3://..., local path)")
    w.add_argument("--cache-dir", required=True, metavar="DIR")
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
    w.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="warm every node of this Ray cluster, one task per node",
    )
    w.add_argument("--no-progress", action="store_true", help="no progress bar")
    w.add_argument("--json", action="store_true", help="print the summary as JSON")
    _plan_options(w, defaults=True)
    w.set_defaults(func=_warm)

    s = sub.add_parser(
        "status",
        help="what the cache holds, whether a share fits, counters",
        description="Capacity and use, whether each dataset's share for this node fits,\n"
        "hit/miss/byte counters, throttling events, and the next shards to fetch.",
        epilog=STATUS_EPILOG,
        formatter_class=_RAW,
    )
    s.add_argument("dir", metavar="DIR")
    s.add_argument("--dataset", metavar="URL")
    s.add_argument("--json", action="store_true", help="print JSON")
    _plan_options(s, defaults=False)
    s.set_defaults(func=_status)

    v = sub.add_parser(
        "verify",
        help="check every cached shard's checksum",
        description="Check every cached shard against its manifest checksum; corrupt\n"
        "shards are removed (they are fetched again on next use).",
        epilog=VERIFY_EPILOG,
        formatter_class=_RAW,
    )
    v.add_argument("dir", metavar="DIR")
    v.set_defaults(func=_verify)

    e = sub.add_parser(
        "evict",
        help="remove cached shards",
        description="Remove the cached shards of one dataset or of all; pinned shards and\n"
        "shards in use by a process are kept.",
        epilog=EVICT_EPILOG,
        formatter_class=_RAW,
    )
    e.add_argument("dir", metavar="DIR")
    which = e.add_mutually_exclusive_group(required=True)
    which.add_argument("--dataset", metavar="URL")
    which.add_argument("--all", action="store_true")
    e.set_defaults(func=_evict)


def _warm(args: argparse.Namespace) -> int:
    # None: each node's cache keeps its recorded capacity (a new one sizes itself to its disk)
    capacity = parse_size(args.capacity, name="--capacity") if args.capacity else None
    kwargs: dict[str, Any] = {
        "capacity": capacity,
        "concurrency": args.concurrency,
        "part_size": args.part_size,
    }
    if args.ray_address:
        from .cluster import warm_cluster

        results = warm_cluster(
            args.dataset,
            args.cache_dir,
            address=args.ray_address,
            seed=args.seed,
            epochs=args.epochs,
            ranks_per_node=args.ranks_per_node,
            cache_kwargs=kwargs,
        )
    else:
        share = NodeShare(
            args.node_rank, args.num_nodes, args.ranks_per_node, args.seed, args.epochs
        )
        dataset = Dataset.open(args.dataset)
        with ShardCache(args.cache_dir, **kwargs) as cache:
            result = warm(
                cache,
                dataset,
                share.order(dataset),
                node_rank=args.node_rank,
                progress=not args.no_progress,
            )
        results = [result.to_dict()]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            rate = r["bytes_fetched"] / r["seconds"] / 1e9 if r["seconds"] else 0.0
            print(
                f"node {r['node_rank']}{' (' + r['host'] + ')' if r.get('host') else ''}: "
                f"{r['fetched']} fetched, {r['already']} already cached, "
                f"{r['over_capacity']} over capacity, {len(r['failed'])} failed; "
                f"{format_size(r['bytes_fetched'])} in {r['seconds']:.1f}s ({rate:.2f} GB/s), "
                f"throttle events {r['throttle_events']}"
            )
    failed = [(r["node_rank"], path, err) for r in results for path, err in r["failed"].items()]
    for node, path, err in failed:
        print(f"flashfeed cache warm: node {node}: shard {path} failed: {err}", file=sys.stderr)
    if failed:
        names = ", ".join(sorted({p for _, p, _ in failed}))
        print(
            f"flashfeed cache warm: {len(failed)} shards failed: {names} (re-run to retry them)",
            file=sys.stderr,
        )
        return 1
    return 0


def _share_from(args: argparse.Namespace) -> NodeShare | None:
    given = [args.node_rank, args.num_nodes, args.ranks_per_node, args.epochs, args.seed]
    if all(v is None for v in given):
        return None
    return NodeShare(
        node_rank=args.node_rank or 0,
        num_nodes=args.num_nodes or 1,
        ranks_per_node=args.ranks_per_node or 1,
        seed=args.seed or 0,
        epochs=args.epochs or 1,
    )


def _status(args: argparse.Namespace) -> int:
    report = admin.status(args.dir, url=args.dataset, share=_share_from(args))
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    cap = report["capacity"]
    print(
        f"cache {report['root']}: {format_size(report['used_bytes'])} used of "
        f"{format_size(cap) if cap else 'unknown capacity'}"
    )
    c = report["counters"]
    lookups = c["hits"] + c["misses"]
    rate = c["bytes_fetched"] / c["fetch_seconds"] / 1e9 if c["fetch_seconds"] else 0.0
    print(
        f"  hits {c['hits']}, misses {c['misses']} (hit rate "
        f"{c['hits'] / lookups if lookups else 0:.1%}), waited on another process "
        f"{c['shared_waits']}, fetched {format_size(c['bytes_fetched'])} "
        f"({rate:.2f} GB/s per fill)"
    )
    g = c.get("gauges", {})
    print(
        f"  throttle events {c['throttle_events']}, retries {c['retries']}, concurrency now "
        f"{g.get('concurrency', '-')} (lowest {g.get('concurrency_lowest', '-')}), evictions "
        f"{c['evictions']} ({format_size(c['evicted_bytes'])}), corrupt refetched "
        f"{c['corrupt_refetches']}, failed fills {c['failures']}"
    )
    for d in report["datasets"]:
        print(
            f"dataset {d['url']}: {d['cached_shards']}/{d['shards']} shards cached "
            f"({format_size(d['cached_bytes'])} of {format_size(d['dataset_bytes'])})"
            f"{', ' + str(d['pinned']) + ' pinned' if d.get('pinned') else ''}"
        )
        share = d.get("share")
        if share:
            verdict = "fits" if share["fits"] else "does NOT fit"
            beyond = share.get("over_capacity")
            print(
                f"  this node's share ({share['source']}): {share['shards']} shards, "
                f"{format_size(share['bytes'])}: {verdict} in the capacity; "
                f"{share['cached']} cached" + (f", {beyond} beyond the capacity" if beyond else "")
            )
        if d.get("next"):
            print(f"  next to fetch: {', '.join(d['next'])}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    report = admin.verify(args.dir)
    print(f"checked {report['checked']} shards in {args.dir}: {len(report['corrupt'])} corrupt")
    for path in report["corrupt"]:
        kept = " (in use: not removed)" if path in report["not_removed_in_use"] else " (removed)"
        print(f"  corrupt: {path}{kept}")
    return 1 if report["corrupt"] else 0


def _evict(args: argparse.Namespace) -> int:
    report = admin.evict(args.dir, url=None if args.all else args.dataset)
    print(
        f"evicted {report['evicted']} shards ({format_size(report['bytes'])}); kept "
        f"{report['kept_pinned_or_in_use']} pinned or in use"
    )
    return 0
