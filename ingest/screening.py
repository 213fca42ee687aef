"""Screening before shards are assigned: exact duplicates across the whole source, then the
quality filter and near-duplicate removal, each as Ray tasks; what they reject is counted."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from .config import IngestConfig
from .neardup import screen
from .raysetup import ray_map
from .sources import Item, Reject, RejectInfo, SourceScan, StorageContext, open_reader
from .taskerrors import in_stage
from .tokenize import text_field
from .transforms import TransformOptions, content_hash, output_fields

__all__ = ["exact_duplicates", "screen_text"]


def _hash_items(
    items: list[Item], *, fmt: str, shared: dict[str, Any], ctx: StorageContext
) -> list[str | None]:
    reader = open_reader(fmt, shared)
    out: list[str | None] = []
    try:
        for item in items:
            try:
                with in_stage("dedup", item.source):
                    out.append(content_hash(reader.read(item, ctx)))
            except Reject:
                out.append(None)
    finally:
        reader.close()
    return out


def exact_duplicates(scan: SourceScan, ctx: StorageContext) -> tuple[list[Item], list[RejectInfo]]:
    """Stage 2 of ``run`` (``dedup=True``): exact duplicates across the whole source, decided on the
    driver: the first occurrence in source order stays, later ones are rejected."""
    chunks = [scan.items[i : i + 256] for i in range(0, len(scan.items), 256)]
    fn = partial(_hash_items, fmt=scan.format, shared=scan.shared, ctx=ctx)
    hashes = [h for chunk in ray_map(fn, chunks, stage="dedup") for h in chunk]
    first: dict[str, Item] = {}
    kept, rejects = [], []
    for item, h in zip(scan.items, hashes, strict=True):
        if h is not None and h in first:
            rejects.append(
                RejectInfo(
                    item.index, item.source, "duplicate", f"same content as {first[h].source}"
                )
            )
            continue
        if h is not None:
            first[h] = item
        kept.append(item)
    return kept, rejects


def screen_text(
    config: IngestConfig,
    scan: SourceScan,
    items: Sequence[Item],
    rejects: list[RejectInfo],
    ctx: StorageContext,
    phases: dict[str, float],
    transform: TransformOptions,
) -> tuple[list[Item], dict[str, Any]]:
    """Stage 2b of ``run``: the quality filter and near-duplicate removal, as Ray tasks
    (``ingest.neardup``); their rejects join ``rejects``, their steps' times ``phases``;
    returns the items kept and what the manifest records."""
    fields = output_fields(scan.fields, transform)
    try:
        field_name = text_field(fields)
    except ValueError:
        raise ValueError(
            "near-duplicate removal and quality filters work on one text field (txt); the "
            f"source has {sorted(fields)}: map one with --field txt=COLUMN"
        ) from None
    found = screen(
        items,
        fmt=scan.format,
        shared=scan.shared,
        ctx=ctx,
        kinds=scan.fields,
        transform=transform,
        text_field=field_name,
        near_dup=config.near_dup_options(),
        quality_filter=config.quality_function(),
    )
    rejects += found.rejects
    phases.update({f"neardup_{k}": v for k, v in found.timings.items()})
    return found.kept, {"field": field_name, "docs_in": len(items), **found.stats}
