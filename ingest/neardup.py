"""Near-duplicate removal and the quality-filter hook, as Ray tasks over corpus chunks.

1. One *sign* task per chunk of documents (contiguous in source order): read, clean, run
   the user's quality filter, shingle, MinHash, and cut each signature into LSH band keys;
   plus one exact key per document (a hash of its text). The keys leave the task already
   split into ``buckets`` parts by key, so no process ever holds every signature.
2. One *bucket* task per bucket: sort its ``(band, key, doc)`` rows; the documents of a
   group are candidate pairs (all pairs of a group, up to ``GROUP_PAIRS`` per document).
3. One *check* task per chunk with candidates: each pair's shingle sets (the sign tasks'
   own objects, fetched by the task) give its exact Jaccard similarity
   (``ingest.shinglesets``); a pair below the threshold is no link (an LSH collision, which
   would chain unrelated clusters). The LSH is sized so that a pair at the threshold is a
   candidate with probability >= 0.99 (``minhash.lsh_for_recall``): the check, not the
   S-curve, draws the line. docs/INGEST.md has the measured removal curve.
4. On the driver, a union-find over the checked pairs: each connected cluster keeps its
   smallest document id (so the kept set depends only on the corpus and the options), the
   rest are skipped as ``duplicate`` (an identical text came first) or ``near_duplicate``.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from .minhash import BACKENDS, UNITS, band_keys, lsh_for_recall, shingle_hashes, signatures
from .nearpairs import candidate_pairs, checked_pairs
from .shinglesets import Shingled, shingled
from .sources import Item, Reject, RejectInfo, StorageContext, open_reader
from .taskerrors import StageError, cause_line, get, in_stage, where_items
from .transforms import TransformOptions, transform_record

__all__ = [
    "NearDupOptions",
    "QualityFilter",
    "ScreenResult",
    "chunk_items",
    "clusters",
    "load_quality_filter",
    "screen",
]

#: document text -> None to keep it, or the reason (a short name) to drop it
QualityFilter = Callable[[str], "str | None"]
_ROW = np.dtype([("key", np.uint64), ("band", np.int32), ("doc", np.int64)])


@dataclass(frozen=True, kw_only=True)
class NearDupOptions:
    """MinHash LSH options. ``bands x rows`` follow from ``threshold`` and ``num_perm``; a
    pair is a near-duplicate when its exact shingle Jaccard similarity is >= ``threshold``."""

    threshold: float = 0.8
    shingle_size: int = 5
    shingle_unit: str = "word"
    num_perm: int = 128
    seed: int = 0
    backend: str = "rensa"

    def __post_init__(self) -> None:
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 < t < 1.0:
            raise ValueError(f"near_dup_threshold must be a number in (0, 1), got {t!r}")
        for name in ("shingle_size", "num_perm"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"near_dup_{name} must be an integer > 0, got {v!r}")
        if self.num_perm < 2:
            raise ValueError(f"near_dup_num_perm must be >= 2, got {self.num_perm!r}")
        if self.shingle_unit not in UNITS:
            raise ValueError(
                f"near_dup_shingle_unit must be one of {UNITS}, got {self.shingle_unit!r}"
            )
        if self.backend not in BACKENDS:
            raise ValueError(f"near_dup_backend must be one of {BACKENDS}, got {self.backend!r}")

    @property
    def bands_rows(self) -> tuple[int, int]:
        return lsh_for_recall(float(self.threshold), self.num_perm)


def load_quality_filter(spec: str) -> QualityFilter:
    """``"package.module:function"`` -> the function; a clear error if it is not there."""
    mod, sep, name = spec.partition(":")
    if not sep or not mod or not name:
        raise ValueError(f"quality_filter must be 'module:function', got {spec!r}")
    try:
        fn = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"quality_filter {spec!r} cannot be loaded: {exc}") from None
    if not callable(fn):
        raise ValueError(f"quality_filter {spec!r} is not callable")
    return fn  # type: ignore[no-any-return]


@dataclass(frozen=True)
class _SignSpec:
    """What every sign task shares (put into Ray's object store once)."""

    fmt: str
    shared: dict[str, Any]
    ctx: StorageContext
    kinds: dict[str, str]
    transform: TransformOptions
    text_field: str
    near_dup: NearDupOptions | None
    quality_filter: QualityFilter | None
    buckets: int


@dataclass
class ScreenResult:
    """Documents kept (source order), documents dropped (with reasons), and counts."""

    kept: list[Item]
    rejects: list[RejectInfo]
    stats: dict[str, Any] = field(default_factory=dict)
    #: every removed duplicate's index -> the index of the document kept for its cluster
    kept_for: dict[int, int] = field(default_factory=dict)
    #: seconds of each step (sign tasks, bucket tasks, union-find on the driver)
    timings: dict[str, float] = field(default_factory=dict)


def chunk_items(
    items: Sequence[Item], *, max_docs: int = 4096, max_bytes: int = 32 << 20
) -> list[list[Item]]:
    """Contiguous runs of items (a text source's partitions stay together), each at most
    ``max_docs`` documents and about ``max_bytes``."""
    out: list[list[Item]] = []
    cur: list[Item] = []
    size = 0
    for it in items:
        if cur and (len(cur) >= max_docs or size + it.size > max_bytes):
            out.append(cur)
            cur, size = [], 0
        cur.append(it)
        size += it.size
    if cur:
        out.append(cur)
    return out


def _quality(fn: QualityFilter, text: str, item: Item) -> str | None:
    try:
        verdict = fn(text)
    except Exception as exc:
        raise StageError(
            "quality filter", item.source, f"quality_filter raised {cause_line(exc)}"
        ) from None
    if verdict is not None and (not isinstance(verdict, str) or not verdict):
        raise StageError(
            "quality filter",
            item.source,
            "quality_filter must return None (keep) or a reason string (drop), "
            f"got {verdict!r:.80}",
        )
    return verdict


def _sign(spec: _SignSpec, items: list[Item]) -> tuple[Any, ...]:
    """One chunk: ``(dropped, (doc ids, shingle hashes, offsets), bucket_0, ...,
    bucket_{n-1})`` (see the module docstring)."""
    reader = open_reader(spec.fmt, spec.shared)
    dropped: list[tuple[int, str, str, str]] = []
    docs: list[int] = []
    texts: list[str] = []
    try:
        for item in items:
            try:
                with in_stage("near-dup", item.source):
                    rec = transform_record(reader.read(item, spec.ctx), spec.kinds, spec.transform)
            except Reject as r:
                dropped.append((item.index, item.source, r.reason, r.detail))
                continue
            text = rec.get(spec.text_field)
            text = text if isinstance(text, str) else ""
            if spec.quality_filter is not None:
                reason = _quality(spec.quality_filter, text, item)
                if reason is not None:
                    dropped.append((item.index, item.source, f"quality:{reason}", ""))
                    continue
            docs.append(item.index)
            texts.append(text)
    finally:
        reader.close()
    empty = np.empty(0, dtype=_ROW)
    if spec.near_dup is None:
        return (dropped, None, *[empty] * spec.buckets)
    with in_stage("near-dup", where_items(items)):
        rows, signed = _rows(spec.near_dup, docs, texts)
    part = (rows["key"] % np.uint64(spec.buckets)).astype(np.int64)
    return (dropped, signed, *[rows[part == b] for b in range(spec.buckets)])


def _rows(opts: NearDupOptions, docs: list[int], texts: list[str]) -> tuple[np.ndarray, Shingled]:
    """Every ``(key, band, doc)`` of a chunk: ``bands`` LSH keys per document with at least
    one shingle, and band ``bands`` holding the exact-text key of every document with text
    (samples without text are never duplicates of each other); and those documents' ids
    with their shingle hashes, for the exact check."""
    bands, rows_per_band = opts.bands_rows
    hashes = [shingle_hashes(t, size=opts.shingle_size, unit=opts.shingle_unit) for t in texts]
    has = [i for i, h in enumerate(hashes) if len(h)]
    sigs = signatures(
        [hashes[i] for i in has], num_perm=opts.num_perm, seed=opts.seed, backend=opts.backend
    )
    keys = band_keys(sigs, bands=bands, rows=rows_per_band)
    doc_ids = np.asarray(docs, dtype=np.int64)
    lsh = np.empty(keys.size, dtype=_ROW)
    lsh["key"] = keys.ravel()
    lsh["band"] = np.tile(np.arange(bands, dtype=np.int32), len(has))
    lsh["doc"] = np.repeat(doc_ids[has], bands) if has else np.empty(0, dtype=np.int64)
    with_text = [i for i, t in enumerate(texts) if t]
    exact = np.empty(len(with_text), dtype=_ROW)
    exact["key"] = np.fromiter(
        (xxhash.xxh3_64_intdigest(texts[i]) for i in with_text),
        dtype=np.uint64,
        count=len(with_text),
    )
    exact["band"] = bands
    exact["doc"] = doc_ids[with_text]
    return np.concatenate([lsh, exact]), shingled(doc_ids[has], [hashes[i] for i in has])


def clusters(edges: np.ndarray) -> dict[int, int]:
    """Union-find over ``(a, b, ...)`` edges: every linked doc -> its cluster's smallest
    doc (itself for the kept one)."""
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        root = x
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(x, x) != root:
            parent[x], x = root, parent[x]
        return root

    for a, b in edges[:, :2].tolist():
        ra, rb = find(a), find(b)
        if ra != rb:
            lo, hi = (ra, rb) if ra < rb else (rb, ra)
            parent[hi] = lo
            parent.setdefault(lo, lo)
    return {x: find(x) for x in parent}


def screen(
    items: Sequence[Item],
    *,
    fmt: str,
    shared: dict[str, Any],
    ctx: StorageContext,
    kinds: dict[str, str],
    transform: TransformOptions,
    text_field: str,
    near_dup: NearDupOptions | None,
    quality_filter: QualityFilter | None = None,
    chunk_docs: int = 4096,
) -> ScreenResult:
    """Run the quality filter and near-duplicate removal over ``items`` on the current Ray."""
    import ray

    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    chunks = chunk_items(items, max_docs=chunk_docs)
    buckets = max(1, min(len(chunks), 64))
    spec = _SignSpec(
        fmt, shared, ctx, kinds, transform, text_field, near_dup, quality_filter, buckets
    )
    spec_ref = ray.put(spec)
    from flashfeed.errors import StorageError

    retry: Any = {"max_retries": 3, "retry_exceptions": [StorageError]}
    sign = ray.remote(num_returns=buckets + 2, **retry)(_sign)
    outs: list[Any] = [sign.remote(spec_ref, c) for c in chunks]
    by_index = {it.index: it for it in items}
    firsts = [o[0] for o in outs]
    firsts_done = get(firsts, stage="near-dup", where=lambda i: where_items(chunks[i]))
    dropped = [d for part in firsts_done for d in part]
    rejects = [RejectInfo(i, s, r, d) for i, s, r, d in dropped]
    if outs:
        ray.wait([o[-1] for o in outs], num_returns=len(outs))
    timings["sign"] = (t1 := time.perf_counter()) - t0
    stats: dict[str, Any] = {"chunks": len(chunks)}
    removed: dict[int, RejectInfo] = {}
    roots: dict[int, int] = {}
    if near_dup is not None:
        bands, rows = near_dup.bands_rows
        pair_task = ray.remote(max_retries=3)(candidate_pairs)
        pair_refs = [pair_task.remote(bands, *[o[b + 2] for o in outs]) for b in range(buckets)]
        found = [
            e
            for e in get(pair_refs, stage="near-dup buckets", where=lambda b: f"bucket {b}")
            if len(e)
        ]
        candidates = np.concatenate(found) if found else np.empty((0, 3), dtype=np.int64)
        candidates = np.unique(candidates, axis=0)  # a pair may share keys in two buckets
        timings["buckets"] = (t2 := time.perf_counter()) - t1
        edges = checked_pairs(candidates, near_dup.threshold, chunks, [o[1] for o in outs])
        timings["check"] = (t3 := time.perf_counter()) - t2
        exact = set(edges[edges[:, 2] == 1, 1].tolist())
        roots = clusters(edges)
        for doc, root in sorted(roots.items()):
            if doc == root:
                continue
            first = by_index[root].source
            reason, detail = (
                ("duplicate", f"same text as {first}")
                if doc in exact
                else ("near_duplicate", f"near-duplicate of {first}")
            )
            removed[doc] = RejectInfo(doc, by_index[doc].source, reason, detail)
        stats.update(
            threshold=near_dup.threshold,
            num_perm=near_dup.num_perm,
            bands=bands,
            rows=rows,
            shingle=f"{near_dup.shingle_size} {near_dup.shingle_unit}s",
            backend=near_dup.backend,
            buckets=buckets,
            check="exact jaccard",
            candidate_pairs=len(candidates),
            checked_below=len(candidates) - len(edges),
            candidate_edges=len(edges),
            clusters=len({r for d, r in roots.items() if d != r}),
        )
        timings["union_find"] = time.perf_counter() - t3
    dropped_ids = {r.index for r in rejects} | set(removed)
    kept = [it for it in items if it.index not in dropped_ids]
    all_rejects = sorted([*rejects, *removed.values()], key=lambda r: (r.index, r.source))
    kept_for = {d: roots[d] for d in removed}
    return ScreenResult(kept, all_rejects, stats, kept_for, timings)
