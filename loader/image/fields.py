"""Which tar members feed which loader outputs: ``{"image": "jpg;png", "label": "cls;json"}``.

A field named ``label`` (or ending in ``label``) is parsed to int64; a field whose members are
all text (``txt``, ``text``, ``caption``, any of them ``.gz``-compressed) is a text field (a
caption); ``"json:KEY"`` (``"json:meta.width"`` for a nested key) is one value of a JSON
member; anything else is encoded bytes handed to DALI.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashfeed.format.media import LOADER_IMAGE_EXTS
from flashfeed.format.video import VIDEO_EXTS

from .labels import LABEL_EXTS

__all__ = [
    "DEFAULT_FIELDS",
    "KEY",
    "TEXT_EXTS",
    "FieldSpec",
    "key_bytes",
    "key_column",
    "key_strings",
    "parse_fields",
]

#: the batch entry naming each sample, ``<shard path>/<sample key>``, read with the sample
KEY = "__key__"

DEFAULT_FIELDS: dict[str, tuple[str, ...]] = {"image": LOADER_IMAGE_EXTS, "label": LABEL_EXTS}

#: member extensions that hold text (a ``.gz`` suffix on any of them is decompressed)
TEXT_EXTS = ("txt", "text", "caption")


@dataclass(frozen=True)
class FieldSpec:
    """One output: its name, the member extensions that may hold it (first found wins),
    and whether it is a label (parsed to int64), text, one key of a JSON member
    (``json_key``: the path of keys), or encoded bytes handed to DALI."""

    name: str
    exts: tuple[str, ...]
    is_label: bool
    optional: bool = False
    json_key: tuple[str, ...] | None = None

    @property
    def is_text(self) -> bool:
        """Every member this field may come from holds text (``txt``, ``txt.gz``...)."""
        return (
            not self.is_label
            and self.json_key is None
            and all(e.removesuffix(".gz") in TEXT_EXTS for e in self.exts)
        )

    @property
    def is_video(self) -> bool:
        """Every member this field may come from holds a video (``mp4``, ``webm``...)."""
        return not self.is_label and all(e in VIDEO_EXTS for e in self.exts)

    @property
    def is_bytes(self) -> bool:
        """Encoded bytes handed to DALI as they are (images, anything not parsed here)."""
        return not (self.is_label or self.is_text or self.json_key is not None)

    def pick(self, members: Mapping[str, object]) -> str | None:
        for ext in self.exts:
            if ext in members:
                return ext
        return None


def parse_fields(
    fields: Mapping[str, str | Sequence[str]] | None, *, optional: Sequence[str] = ()
) -> tuple[FieldSpec, ...]:
    """Normalise the ``fields=`` option; a field called ``label`` (or ending in ``label``)
    is parsed into int64; ``optional`` names fields a sample may lack."""
    raw = DEFAULT_FIELDS if fields is None else fields
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(f"fields must be a non-empty mapping of name -> extensions, got {raw!r}")
    out = []
    unknown = sorted(set(optional) - set(raw))
    if isinstance(optional, str) or unknown:
        raise ValueError(f"optional must name fields of fields= ({sorted(raw)}), got {optional!r}")
    for name, exts in raw.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"field names must be identifiers, got {name!r}")
        if name == KEY:
            raise ValueError(f"{KEY!r} is not a field: every batch carries it already")
        if isinstance(exts, str):
            exts = exts.split(";")
        ext_t = tuple(e.strip().lstrip(".") for e in exts if e.strip())
        if not ext_t:
            raise ValueError(f"field {name!r} names no extension")
        json_key = _json_key(name, ext_t)
        if json_key is not None:
            ext_t = (ext_t[0].partition(":")[0],)
        is_label = name.endswith("label") and json_key is None
        out.append(FieldSpec(name, ext_t, is_label, name in optional, json_key))
    return tuple(out)


def _json_key(name: str, exts: tuple[str, ...]) -> tuple[str, ...] | None:
    """The key path of a ``"json:KEY"`` field (``"json:a.b"`` -> ``("a", "b")``; another
    JSON member: ``"mp4.json:fps"``), else None."""
    keyed = [e for e in exts if ":" in e and e.split(":", 1)[0].endswith("json")]
    if not keyed:
        return None
    key = keyed[0].partition(":")[2]
    path = tuple(key.split("."))
    if len(exts) > 1 or not all(path):
        raise ValueError(
            f"field {name!r}: a JSON value is one 'json:KEY' (or 'json:a.b' for a nested key), "
            f"got {';'.join(exts)!r}"
        )
    return path


def key_bytes(shard: str, key: str) -> np.ndarray:
    """``<shard>/<key>`` as uint8: the form in which a sample's key travels through DALI."""
    return np.frombuffer(f"{shard}/{key}".encode("utf-8", "surrogateescape"), np.uint8)


def key_column(keys: Sequence[np.ndarray]) -> np.ndarray:
    """A batch's ``key_bytes`` as one uint8 array, a row per sample padded with NUL bytes
    (which neither a tar member's name nor a path holds): DALI takes it whole, where a list
    costs it a conversion per sample, and hands it back as one dense tensor."""
    out = np.zeros((len(keys), max((len(k) for k in keys), default=0)), np.uint8)
    for row, key in zip(out, keys, strict=True):
        row[: len(key)] = key
    return out


def key_strings(samples: Sequence[Any] | np.ndarray) -> list[str]:
    """``key_bytes`` of a batch (uint8 arrays, or the rows of a ``key_column``) back to
    strings."""
    return [
        np.asarray(s).tobytes().rstrip(b"\0").decode("utf-8", "surrogateescape") for s in samples
    ]
