"""What ``flashfeed cache`` prints: a warm's summary and errors, a cache's status, the
results of verify and evict, as lines of text.

The commands in ``cli.py`` parse flags and call the library; these functions only word
what came back, so the wording is found (and changed) in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flashfeed.units import format_size

from ..warm.nodeshare import describe_warm_record

__all__ = ["evict_lines", "status_lines", "verify_lines", "warm_errors", "warm_summary"]

_WARM = "flashfeed cache warm"


def _where(r: dict[str, Any]) -> str:
    place = [x for x in (r.get("host"), r.get("address")) if x]
    return f" ({', '.join(place)})" if place else ""


def warm_summary(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per node that warmed (nodes that could not are in ``warm_errors``)."""
    lines = []
    for r in results:
        if r.get("error"):
            continue
        rate = r["bytes_fetched"] / r["seconds"] / 1e9 if r["seconds"] else 0.0
        lines.append(
            f"node {r['node_rank']}{_where(r)}: "
            f"{r['fetched']} fetched, {r['already']} already cached, "
            f"{r['over_capacity']} over capacity, {len(r['failed'])} failed; "
            f"{format_size(r['bytes_fetched'])} in {r['seconds']:.1f}s ({rate:.2f} GB/s), "
            f"throttle events {r['throttle_events']}"
        )
    return lines


def warm_errors(results: Sequence[dict[str, Any]]) -> list[str]:
    """The nodes that could not warm and the shards that failed, with what to do; empty
    when the warm succeeded everywhere."""
    lines = [
        f"{_WARM}: node {r['node_rank']}{_where(r)}: error: {r['error']}"
        for r in results
        if r.get("error")
    ]
    failed = [(r["node_rank"], path, err) for r in results for path, err in r["failed"].items()]
    lines += [f"{_WARM}: node {node}: shard {path} failed: {err}" for node, path, err in failed]
    if failed:
        names = ", ".join(sorted({p for _, p, _ in failed}))
        lines.append(f"{_WARM}: {len(failed)} shards failed: {names} (re-run to retry them)")
    return lines


def status_lines(report: dict[str, Any]) -> list[str]:
    """``cache status`` in words: use, counters, and per dataset its share and warm record."""
    cap = report["capacity"]
    lines = [
        f"cache {report['root']}: {format_size(report['used_bytes'])} used of "
        f"{format_size(cap) if cap else 'unknown capacity'}"
    ]
    c = report["counters"]
    lookups = c["hits"] + c["misses"]
    rate = c["bytes_fetched"] / c["fetch_seconds"] / 1e9 if c["fetch_seconds"] else 0.0
    lines.append(
        f"  hits {c['hits']}, misses {c['misses']} (hit rate "
        f"{c['hits'] / lookups if lookups else 0:.1%}), waited on another process "
        f"{c['shared_waits']}, fetched {format_size(c['bytes_fetched'])} "
        f"({rate:.2f} GB/s per fill)"
    )
    g = c.get("gauges", {})
    lines.append(
        f"  throttle events {c['throttle_events']}, retries {c['retries']}, concurrency now "
        f"{g.get('concurrency', '-')} (lowest {g.get('concurrency_lowest', '-')}), evictions "
        f"{c['evictions']} ({format_size(c['evicted_bytes'])}), corrupt refetched "
        f"{c['corrupt_refetches']}, failed fills {c['failures']}, over capacity "
        f"{c.get('over_capacity', 0)}"
    )
    for d in report["datasets"]:
        lines += _dataset_lines(d)
    return lines


def _dataset_lines(d: dict[str, Any]) -> list[str]:
    lines = [
        f"dataset {d['url']}{' (source ' + str(d['source']) + ')' if d.get('source') else ''}: "
        f"{d['cached_shards']}/{d['shards']} shards cached "
        f"({format_size(d['cached_bytes'])} of {format_size(d['dataset_bytes'])})"
        f"{', ' + str(d['pinned']) + ' pinned' if d.get('pinned') else ''}"
    ]
    if d.get("version"):
        lines.append(f"  version {d['version']}")
    if d.get("pinned"):
        lines.append(
            f"  pinned: {d['pinned']} shards ({format_size(d.get('pinned_bytes', 0))}), "
            f"{d.get('warm_pinned', 0)} of them by its warm (kept whatever other datasets "
            "fill; `cache evict --dataset` releases them)"
        )
    if d.get("warm"):
        lines.append(f"  {describe_warm_record(d['warm'])}")
    if d.get("warm_mismatch"):
        lines.append(f"  warning: {d['warm_mismatch']}")
    share = d.get("share")
    if share:
        verdict = "fits" if share["fits"] else "does NOT fit"
        beyond = share.get("over_capacity")
        lines.append(
            f"  this node's share ({share['source']}): {share['shards']} shards, "
            f"{format_size(share['bytes'])}: {verdict} in the capacity; "
            f"{share['cached']} cached" + (f", {beyond} beyond the capacity" if beyond else "")
        )
    if d.get("next"):
        lines.append(f"  next to fetch: {', '.join(d['next'])}")
    return lines


def verify_lines(root: str, report: dict[str, Any]) -> list[str]:
    """How many shards were checked and each corrupt one, removed or (in use) kept."""
    lines = [f"checked {report['checked']} shards in {root}: {len(report['corrupt'])} corrupt"]
    for path in report["corrupt"]:
        kept = " (in use: not removed)" if path in report["not_removed_in_use"] else " (removed)"
        lines.append(f"  corrupt: {path}{kept}")
    return lines


def evict_lines(report: dict[str, Any]) -> list[str]:
    """What an eviction removed and what it had to keep."""
    return [
        f"evicted {report['evicted']} shards ({format_size(report['bytes'])}); released "
        f"{report.get('released_warm_pins', 0)} warm pins; kept "
        f"{report['kept_pinned_or_in_use']} pinned or in use"
    ]
