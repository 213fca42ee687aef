"""The manifest header's rules: versions, field checks and the shard-table record, checked
the same way for a version-1 manifest (shards inline) and a version-2 header."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flashfeed import storage
from flashfeed.errors import ManifestError
from flashfeed.format.shardtable import check_relative_path

if TYPE_CHECKING:
    from flashfeed.format.manifest import Manifest

__all__ = [
    "FEATURES",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "READ_VERSIONS",
    "SHARD_FORMATS",
    "TABLE_FORMAT",
]

#: the version writers write; readers read every version in ``READ_VERSIONS``. Version 3 is
#: a version-2 header that lists in ``requires`` what a reader must understand to read the
#: shards right (a reader of versions 1-2 refuses it instead of misreading the data)
FORMAT_VERSION = 2
READ_VERSIONS = (1, 2, 3)
#: the ``requires`` entries this flashfeed understands
FEATURES = ("token-documents", "in-place")
MANIFEST_NAME = "manifest.json"
#: ``parquet`` and ``jsonl``: units of files indexed in place (``flashfeed.format.inplace``), which
#: a manifest marks with ``requires: ["in-place"]``
SHARD_FORMATS = ("webdataset", "arrow", "parquet", "jsonl")
TABLE_FORMAT = "arrow-ipc"
TABLE_PREFIX = "manifest-"


def canonical_json(d: dict[str, Any]) -> str:
    return json.dumps(d, indent=2, sort_keys=True) + "\n"


def parse_json(text: str | bytes, source: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ManifestError(f"{source}: not valid JSON ({str(exc)[:200]})") from None


def header_version(d: Any, source: str) -> int:
    if not isinstance(d, dict):
        raise ManifestError(f"{source}: a manifest must be a JSON object")
    version = d.get("format_version")
    if "format_version" not in d:
        raise ManifestError(
            f"{source}: no format_version: not a flashfeed manifest, or a damaged one; "
            "re-create it (`flashfeed index PREFIX` for shards written by other tools)"
        )
    if type(version) is not int or version not in READ_VERSIONS:
        raise ManifestError(
            f"{source}: manifest format version {version!r:.40} is not supported; "
            f"this flashfeed reads versions {', '.join(map(str, READ_VERSIONS))} "
            "(upgrade flashfeed to read it)"
        )
    return version


def header_requires(d: dict[str, Any], version: int, source: str) -> tuple[str, ...]:
    """Version 3's ``requires``: a non-empty list of features, each one this reader knows."""
    if version < 3:
        return ()
    req = d.get("requires")
    if not isinstance(req, list) or not req or not all(isinstance(r, str) for r in req):
        raise ManifestError(
            f"{source}: manifest format version 3 needs 'requires', a non-empty list of "
            f"feature names, got {req!r:.80}"
        )
    unknown = sorted(set(req) - set(FEATURES))
    if unknown:
        raise ManifestError(
            f"{source}: the dataset requires {unknown}, which this flashfeed does not know "
            f"(it knows {list(FEATURES)}; upgrade flashfeed to read it)"
        )
    return tuple(sorted(set(req)))


def header_kwargs(d: dict[str, Any], source: str) -> dict[str, Any]:
    """The fields both versions share, checked."""
    for k in ("name", "shard_format", "schema"):
        if k not in d:
            raise ManifestError(f"{source}: manifest lacks {k!r}")
    if d["shard_format"] not in SHARD_FORMATS:
        raise ManifestError(
            f"{source}: shard_format must be one of {SHARD_FORMATS}, got {d['shard_format']!r:.80}"
        )
    if not isinstance(d["schema"], dict):
        raise ManifestError(f"{source}: 'schema' must be an object")
    if not isinstance(d["name"], str):
        raise ManifestError(f"{source}: 'name' must be a string, got {d['name']!r:.80}")
    for k in ("source", "config", "extra"):
        if not isinstance(d.get(k) or {}, dict):
            raise ManifestError(f"{source}: {k!r} must be an object")
    skipped = d.get("skipped") or {}
    if not isinstance(skipped, dict) or not all(
        type(v) is int and v >= 0 for v in skipped.values()
    ):
        raise ManifestError(f"{source}: 'skipped' must map reasons to counts")
    classes = d.get("classes")
    if classes is not None and (
        not isinstance(classes, list) or not all(isinstance(c, str) for c in classes)
    ):
        raise ManifestError(f"{source}: 'classes' must be a list of strings")
    return {
        "name": d["name"],
        "shard_format": d["shard_format"],
        "schema": {str(k): str(v) for k, v in d["schema"].items()},
        "skipped": dict(skipped),
        "source": d.get("source") or {},
        "config": d.get("config") or {},
        "classes": tuple(classes) if classes is not None else None,
        "extra": d.get("extra") or {},
    }


def check_totals(m: Manifest, d: dict[str, Any], source: str) -> None:
    totals = d.get("totals")
    if totals is None:
        return
    if not isinstance(totals, dict):
        raise ManifestError(f"{source}: 'totals' must be an object")
    actual = m.totals()
    for k, v in totals.items():
        if k in actual and v != actual[k]:
            raise ManifestError(
                f"{source}: totals.{k} is {v!r:.40} but the shards add up to {actual[k]}; "
                "the manifest was edited or truncated"
            )


def table_ref(d: dict[str, Any], source: str) -> dict[str, Any]:
    """The header's ``shard_table`` record: where the table is, its size, rows, checksum."""
    ref = d.get("shard_table")
    if not isinstance(ref, dict):
        raise ManifestError(f"{source}: a version-2 manifest needs a 'shard_table' object")
    check_relative_path(ref.get("path"), what="shard_table.path", source=source)
    if ref.get("format") != TABLE_FORMAT:
        raise ManifestError(
            f"{source}: shard_table.format must be {TABLE_FORMAT!r}, got {ref.get('format')!r:.40}"
        )
    for k in ("rows", "bytes"):
        v = ref.get(k)
        if type(v) is not int or v < 0:
            raise ManifestError(f"{source}: shard_table.{k} must be an integer >= 0")
    ck = ref.get("checksum")
    if not isinstance(ck, str) or not ck.startswith(storage.CHECKSUM_PREFIX):
        raise ManifestError(
            f"{source}: shard_table.checksum must look like '{storage.CHECKSUM_PREFIX}<hex>'"
        )
    return ref
