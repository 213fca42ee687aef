"""``IngestConfig``: every option of one ingest run, validated once, frozen."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import xxhash

from flashfeed.crypto import ENV_KEY, ENV_KEY_FILE, EncryptionKey, load_key
from flashfeed.units import parse_size

from .neardup import NearDupOptions, QualityFilter, load_quality_filter
from .packing import PackOptions
from .sources import FORMATS, check_source_options
from .tokentext import SPECIAL_TOKEN_MODES

__all__ = ["OUTPUT_FORMATS", "SOURCE_FORMATS", "IngestConfig"]

OUTPUT_FORMATS = ("webdataset", "arrow")
SOURCE_FORMATS = ("auto", *FORMATS)
DEFAULT_MAX_PIXELS = 89_478_485  # Pillow's own bomb threshold
_FIELD_RE = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")

#: Options that change where or how fast a run goes, never the bytes it writes.
_RUNTIME_ONLY = frozenset(
    {
        "source",
        "dest",
        "ray_address",
        "num_cpus",
        "overwrite",
        "storage_options",
        "progress",
        "encrypt_key_file",
    }
)


@dataclass(frozen=True, kw_only=True)
class IngestConfig:
    """One ingest run: SOURCE -> DEST. Keyword-only; a bad value is a ``ValueError`` naming it.

    >>> IngestConfig(source="./photos", dest="s3://bucket/photos-v1", shard_size="64MiB")
    ... # doctest: +ELLIPSIS
    IngestConfig(...)
    """

    source: str
    dest: str
    format: str = "webdataset"
    source_format: str = "auto"
    shard_size: int | str = "256MiB"
    samples_per_shard: int | None = None
    seed: int = 0
    shuffle: bool = True
    validate: bool = False
    max_pixels: int = DEFAULT_MAX_PIXELS
    dedup: bool = False
    max_image_side: int | None = None
    jpeg_quality: int | None = None
    keep_original_size: bool = False
    normalize_text: bool = True
    fields: dict[str, str] = field(default_factory=dict)
    source_options: dict[str, dict[str, str]] = field(default_factory=dict)
    near_dup_threshold: float | None = None
    near_dup_shingle_size: int = 5
    near_dup_shingle_unit: str = "word"
    near_dup_num_perm: int = 128
    near_dup_backend: str = "rensa"
    quality_filter: str | Callable[[str], str | None] | None = None
    tokenizer: str | None = None
    seq_len: int | None = None
    eos_token: str | None = None
    packing: str = "concat"
    pack_window: int = 4096
    #: a special token spelled in a document: encoded as text, or as its control id
    special_tokens: str = "text"
    encrypt: bool = False
    encrypt_key_file: str | None = None
    name: str | None = None
    ray_address: str | None = None
    num_cpus: int | None = None
    overwrite: bool = False
    storage_options: dict[str, Any] | None = None
    progress: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError(f"source must be a path or URL, got {self.source!r}")
        if not isinstance(self.dest, str) or not self.dest.strip():
            raise ValueError(f"dest must be a path or URL, got {self.dest!r}")
        if self.format not in OUTPUT_FORMATS:
            raise ValueError(f"format must be one of {OUTPUT_FORMATS}, got {self.format!r}")
        if self.source_format not in SOURCE_FORMATS:
            raise ValueError(
                f"source_format must be one of {SOURCE_FORMATS}, got {self.source_format!r}"
            )
        object.__setattr__(self, "shard_size", parse_size(self.shard_size, name="shard_size"))
        if self.samples_per_shard is not None:
            _positive("samples_per_shard", self.samples_per_shard)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        _positive("max_pixels", self.max_pixels)
        if self.max_image_side is not None:
            _positive("max_image_side", self.max_image_side)
        if self.jpeg_quality is not None and not (
            isinstance(self.jpeg_quality, int) and 1 <= self.jpeg_quality <= 100
        ):
            raise ValueError(
                f"jpeg_quality must be an integer in 1..100, got {self.jpeg_quality!r}"
            )
        if not isinstance(self.source_options, dict) or not all(
            isinstance(v, dict) for v in self.source_options.values()
        ):
            raise ValueError(
                "source_options must map a source format to its options, e.g. "
                f"{{'lmdb': {{'decoder': 'json'}}}}, got {self.source_options!r}"
            )
        object.__setattr__(self, "source_options", check_source_options(self.source_options))
        for name, column in self.fields.items():
            if not _FIELD_RE.match(name) or not isinstance(column, str) or not column:
                raise ValueError(
                    f"fields must map NAME (letters, digits, '_', '-', '.') to a COLUMN, "
                    f"got {name!r}={column!r}"
                )
        self.near_dup_options()  # a bad near-dup option fails here, named
        if self.quality_filter is not None:
            self.quality_function()  # so does a quality filter that cannot be loaded
        if self.special_tokens not in SPECIAL_TOKEN_MODES:
            raise ValueError(
                f"special_tokens must be one of {SPECIAL_TOKEN_MODES}, got {self.special_tokens!r}"
            )
        if (self.tokenizer is None) != (self.seq_len is None):
            raise ValueError("tokenizer and seq_len go together: give both or neither")
        if self.tokenizer is not None:
            if self.format != "arrow":
                raise ValueError("tokenization writes Arrow token datasets: use format='arrow'")
            _positive("seq_len", self.seq_len)
            _positive("pack_window", self.pack_window)
            PackOptions(seq_len=self.seq_len or 1, mode=self.packing, window=self.pack_window)
            if not os.path.isfile(self.tokenizer):
                raise ValueError(f"tokenizer file {self.tokenizer!r} does not exist")
        if self.num_cpus is not None:
            _positive("num_cpus", self.num_cpus)
        if self.encrypt_key_file is not None and not self.encrypt:
            raise ValueError("encrypt_key_file is the key of encrypt=True: set encrypt=True too")
        if self.encrypt:
            self.encryption_key()  # a missing or malformed key fails here, before any work
        if self.progress not in ("auto", "bar", "lines", "none"):
            raise ValueError(
                f"progress must be one of auto, bar, lines, none, got {self.progress!r}"
            )

    @property
    def shard_bytes(self) -> int:
        # normalised to an int in __post_init__; parse_size of an int returns it unchanged
        return parse_size(self.shard_size, name="shard_size")

    @property
    def reencode(self) -> bool:
        return self.max_image_side is not None or self.jpeg_quality is not None

    def near_dup_options(self) -> NearDupOptions | None:
        """The MinHash LSH options, or None when near-duplicate removal is off (no
        ``near_dup_threshold``); the seed is the run's."""
        opts = NearDupOptions(
            threshold=0.8 if self.near_dup_threshold is None else self.near_dup_threshold,
            shingle_size=self.near_dup_shingle_size,
            shingle_unit=self.near_dup_shingle_unit,
            num_perm=self.near_dup_num_perm,
            seed=self.seed,
            backend=self.near_dup_backend,
        )
        return None if self.near_dup_threshold is None else opts

    def quality_function(self) -> QualityFilter | None:
        """The quality filter as a function (a ``"module:function"`` string is imported)."""
        qf = self.quality_filter
        if qf is None or callable(qf):
            return qf
        if isinstance(qf, str):
            return load_quality_filter(qf)
        raise ValueError(f"quality_filter must be a function or 'module:function', got {qf!r}")

    def encryption_key(self) -> EncryptionKey | None:
        """The key shards are sealed with (``encrypt=True``), read from ``encrypt_key_file``
        or the environment; None without encryption."""
        if not self.encrypt:
            return None
        key = load_key(key_file=self.encrypt_key_file)
        if key is None:
            raise ValueError(
                f"encrypt=True needs a key: set ${ENV_KEY} (64 hex characters or base64 of "
                f"32 bytes) or ${ENV_KEY_FILE}, or give encrypt_key_file"
            )
        return key

    def provenance(self) -> dict[str, Any]:
        """The options that determine the output bytes: recorded in the manifest and in
        each shard's done-record (a resumed run with other values rebuilds the shard)."""
        d = {k: v for k, v in asdict(self).items() if k not in _RUNTIME_ONLY}
        qf = self.quality_filter
        if qf is not None and not isinstance(qf, str):
            d["quality_filter"] = f"{qf.__module__}:{getattr(qf, '__qualname__', repr(qf))}"
        if self.tokenizer is not None:
            with open(self.tokenizer, "rb") as f:
                d["tokenizer"] = "xxh3_128:" + xxhash.xxh3_128_hexdigest(f.read())
        key = self.encryption_key()
        if key is not None:
            d["encrypt"] = key.key_id  # the key's public id: never the key or its file
        return d


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be an integer > 0, got {value!r}")
