"""``flashfeed inspect``: what a committed dataset holds, as a dict or as readable text."""

from __future__ import annotations

from typing import Any

import numpy as np

from flashfeed.format.manifest import Manifest

from .units import format_size

__all__ = ["format_summary", "summarize"]


def summarize(manifest: Manifest, *, url: str, shards: bool = False) -> dict[str, Any]:
    """A JSON-ready summary: counts, sizes, schema, skips, provenance (and every shard if
    ``shards``)."""
    sizes = manifest.shard_bytes
    out: dict[str, Any] = {
        "url": url,
        "name": manifest.name,
        "format_version": manifest.format_version,
        "shard_format": manifest.shard_format,
        "shards": manifest.num_shards,
        "samples": manifest.num_samples,
        "bytes": manifest.num_bytes,
        "shard_bytes": {
            "min": int(sizes.min()) if len(sizes) else 0,
            "median": int(np.median(sizes)) if len(sizes) else 0,
            "max": int(sizes.max()) if len(sizes) else 0,
        },
        "indexed": manifest.table.num_indexed,
        "schema": dict(manifest.schema),
        "skipped": dict(manifest.skipped),
        "skipped_total": sum(manifest.skipped.values()),
        "classes": len(manifest.classes) if manifest.classes is not None else None,
        "source": manifest.source,
        "config": manifest.config,
    }
    if shards:
        out["shard_list"] = [
            {"path": s.path, "samples": s.samples, "bytes": s.bytes, "checksum": s.checksum}
            for s in manifest.shards
        ]
    return out


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as aligned text lines for a terminal."""
    sb = summary["shard_bytes"]
    lines = [
        f"dataset   {summary['name']}  ({summary['url']})",
        f"format    {summary['shard_format']} (manifest version {summary['format_version']})",
        f"shards    {summary['shards']}  ({summary['indexed']} with .idx; size min "
        f"{format_size(sb['min'])}, median {format_size(sb['median'])}, "
        f"max {format_size(sb['max'])})",
        f"samples   {summary['samples']}",
        f"bytes     {summary['bytes']}  ({format_size(summary['bytes'])})",
    ]
    if summary.get("classes") is not None:
        lines.append(f"classes   {summary['classes']}")
    lines.append("schema")
    width = max((len(k) for k in summary["schema"]), default=0)
    for field, kind in sorted(summary["schema"].items()):
        lines.append(f"  {field:<{width}}  {kind}")
    if summary["skipped"]:
        lines.append(f"skipped   {summary['skipped_total']}")
        for reason, n in sorted(summary["skipped"].items()):
            lines.append(f"  {reason}: {n}")
    else:
        lines.append("skipped   0")
    if summary["source"]:
        src = ", ".join(f"{k}={v}" for k, v in sorted(summary["source"].items()))
        lines.append(f"source    {src}")
    if summary.get("shard_list"):
        lines.append("shard list")
    for s in summary.get("shard_list", []):
        lines.append(f"  {s['path']}  {s['samples']} samples  {format_size(s['bytes'])}")
    return "\n".join(lines)
