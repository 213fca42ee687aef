"""The dataset manifest: ``<prefix>/manifest.json``, written last; its presence is the commit.

See docs/FORMAT.md for the field-by-field description.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import asdict, dataclass, field
from typing import Any

from . import storage
from .errors import DatasetExistsError, ManifestError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SHARD_FORMATS",
    "Manifest",
    "ShardInfo",
    "commit_manifest",
    "read_manifest",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SHARD_FORMATS = ("webdataset", "arrow")


def check_relative_path(path: Any, *, what: str, source: str) -> str:
    """A path inside the dataset prefix: relative, no ``..``, no scheme."""
    if not isinstance(path, str) or not path:
        raise ManifestError(f"{source}: {what} must be a non-empty string, got {path!r}")
    norm = posixpath.normpath(path)
    if (
        path.startswith("/")
        or "://" in path
        or "\\" in path
        or norm.startswith("..")
        or ".." in path.split("/")
    ):
        raise ManifestError(f"{source}: {what} {path!r} escapes the dataset prefix")
    return path


@dataclass(frozen=True)
class ShardInfo:
    """One shard: where it is, what it holds, and the checksum of its bytes."""

    path: str
    samples: int
    bytes: int
    checksum: str
    index: str | None = None

    @classmethod
    def from_dict(cls, d: Any, *, source: str, i: int) -> ShardInfo:
        where = f"shards[{i}]"
        if not isinstance(d, dict):
            raise ManifestError(f"{source}: {where} must be an object")
        missing = {"path", "samples", "bytes", "checksum"} - d.keys()
        if missing:
            raise ManifestError(f"{source}: {where} lacks {sorted(missing)}")
        for k in ("samples", "bytes"):
            if not isinstance(d[k], int) or isinstance(d[k], bool) or d[k] < 0:
                raise ManifestError(f"{source}: {where}.{k} must be an integer >= 0")
        if not isinstance(d["checksum"], str) or not d["checksum"].startswith(
            storage.CHECKSUM_PREFIX
        ):
            raise ManifestError(
                f"{source}: {where}.checksum must look like '{storage.CHECKSUM_PREFIX}<hex>'"
            )
        index = d.get("index")
        if index is not None:
            check_relative_path(index, what=f"{where}.index", source=source)
        return cls(
            path=check_relative_path(d["path"], what=f"{where}.path", source=source),
            samples=d["samples"],
            bytes=d["bytes"],
            checksum=d["checksum"],
            index=index,
        )


@dataclass(frozen=True)
class Manifest:
    """What a committed dataset holds. Immutable; a new version is a new prefix."""

    name: str
    shard_format: str
    schema: dict[str, str]
    shards: tuple[ShardInfo, ...]
    skipped: dict[str, int] = field(default_factory=dict)
    source: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    classes: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.shard_format not in SHARD_FORMATS:
            raise ManifestError(
                f"shard_format must be one of {SHARD_FORMATS}, got {self.shard_format!r}"
            )

    @property
    def num_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    def totals(self) -> dict[str, int]:
        return {
            "shards": len(self.shards),
            "samples": self.num_samples,
            "bytes": self.num_bytes,
            "skipped": sum(self.skipped.values()),
        }

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format_version": self.format_version,
            "name": self.name,
            "shard_format": self.shard_format,
            "schema": dict(self.schema),
            "totals": self.totals(),
            "shards": [asdict(s) for s in self.shards],
            "skipped": dict(self.skipped),
            "source": self.source,
            "config": self.config,
        }
        if self.classes is not None:
            d["classes"] = list(self.classes)
        if self.extra:
            d["extra"] = self.extra
        return d

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, so identical datasets give identical manifests."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = MANIFEST_NAME) -> Manifest:
        try:
            d = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{source}: not valid JSON ({exc})") from None
        return cls.from_dict(d, source=source)

    @classmethod
    def from_dict(cls, d: Any, *, source: str = MANIFEST_NAME) -> Manifest:
        if not isinstance(d, dict):
            raise ManifestError(f"{source}: a manifest must be a JSON object")
        version = d.get("format_version")
        if type(version) is not int or version != FORMAT_VERSION:
            raise ManifestError(
                f"{source}: manifest format version {version!r} is not supported; "
                f"this flashfeed reads version {FORMAT_VERSION} (upgrade flashfeed to read it)"
            )
        for k in ("name", "shard_format", "schema", "shards"):
            if k not in d:
                raise ManifestError(f"{source}: manifest lacks {k!r}")
        if d["shard_format"] not in SHARD_FORMATS:
            raise ManifestError(
                f"{source}: shard_format must be one of {SHARD_FORMATS}, got {d['shard_format']!r}"
            )
        if not isinstance(d["schema"], dict) or not isinstance(d["shards"], list):
            raise ManifestError(f"{source}: 'schema' must be an object and 'shards' a list")
        if not isinstance(d["name"], str):
            raise ManifestError(f"{source}: 'name' must be a string, got {d['name']!r:.80}")
        for k in ("source", "config", "extra"):
            if not isinstance(d.get(k) or {}, dict):
                raise ManifestError(f"{source}: {k!r} must be an object")
        shards = tuple(
            ShardInfo.from_dict(s, source=source, i=i) for i, s in enumerate(d["shards"])
        )
        if len({s.path for s in shards}) != len(shards):
            raise ManifestError(f"{source}: two shards share one path")
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
        m = cls(
            name=str(d["name"]),
            shard_format=d["shard_format"],
            schema={str(k): str(v) for k, v in d["schema"].items()},
            shards=shards,
            skipped=dict(skipped),
            source=d.get("source") or {},
            config=d.get("config") or {},
            classes=tuple(classes) if classes is not None else None,
            extra=d.get("extra") or {},
        )
        totals = d.get("totals")
        if totals is not None:
            actual = m.totals()
            if not isinstance(totals, dict):
                raise ManifestError(f"{source}: 'totals' must be an object")
            for k, v in totals.items():
                if k in actual and v != actual[k]:
                    raise ManifestError(
                        f"{source}: totals.{k} is {v} but the shards add up to {actual[k]}; "
                        "the manifest was edited or truncated"
                    )
        return m


def manifest_url(prefix: str) -> str:
    return storage.join(prefix, MANIFEST_NAME)


def read_manifest(prefix: str, *, storage_options: dict[str, Any] | None = None) -> Manifest:
    """Read and validate the manifest of the dataset at ``prefix``."""
    url = manifest_url(prefix)
    try:
        text = storage.read_bytes(url, storage_options=storage_options)
    except FileNotFoundError:
        raise ManifestError(
            f"no dataset at {prefix}: {url} does not exist (not committed yet, or a wrong "
            "prefix; `flashfeed index PREFIX` builds one for shards written by other tools)"
        ) from None
    return Manifest.from_json(text, source=url)


def commit_manifest(
    prefix: str,
    manifest: Manifest,
    *,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
) -> str:
    """Write the manifest (the commit). Refuses to replace a committed one unless told to."""
    url = manifest_url(prefix)
    if not overwrite and storage.exists(url, storage_options=storage_options):
        raise DatasetExistsError(
            f"a committed dataset already exists at {prefix}; datasets are immutable: "
            "write to a new prefix, or pass overwrite=True (--overwrite)"
        )
    storage.write_bytes(url, manifest.to_json().encode(), storage_options=storage_options)
    return url
