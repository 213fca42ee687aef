"""Which tar members feed which loader outputs: ``{"image": "jpg;png", "label": "cls;json"}``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashfeed.media import LOADER_IMAGE_EXTS

from .labels import LABEL_EXTS

__all__ = ["DEFAULT_FIELDS", "KEY", "FieldSpec", "key_bytes", "key_strings", "parse_fields"]

#: the batch entry naming each sample, ``<shard path>/<sample key>``, read with the sample
KEY = "__key__"

DEFAULT_FIELDS: dict[str, tuple[str, ...]] = {"image": LOADER_IMAGE_EXTS, "label": LABEL_EXTS}


@dataclass(frozen=True)
class FieldSpec:
    """One output: its name, the member extensions that may hold it (first found wins),
    and whether it is a label (parsed to int64) or encoded bytes handed to DALI."""

    name: str
    exts: tuple[str, ...]
    is_label: bool
    optional: bool = False

    def pick(self, members: Mapping[str, object]) -> str | None:
        for ext in self.exts:
            if ext in members:
                return ext
        return None


def parse_fields(
    fields: Mapping[str, str | Sequence[str]] | None, *, optional: Sequence[str] = ()
) -> tuple[FieldSpec, ...]:
    """Normalise the ``fields=`` option; a field called ``label`` (or ending in ``label``)
    is parsed into int64."""
    raw = DEFAULT_FIELDS if fields is None else fields
    if not isinstance(raw, Mapping) or not raw:
        raise ValueError(f"fields must be a non-empty mapping of name -> extensions, got {raw!r}")
    out = []
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
        out.append(FieldSpec(name, ext_t, name.endswith("label"), name in optional))
    return tuple(out)


def key_bytes(shard: str, key: str) -> np.ndarray:
    """``<shard>/<key>`` as uint8: the form in which a sample's key travels through DALI."""
    return np.frombuffer(f"{shard}/{key}".encode("utf-8", "surrogateescape"), np.uint8)


def key_strings(samples: Sequence[Any]) -> list[str]:
    """``key_bytes`` of a batch (any sequence of uint8 arrays) back to strings."""
    return [np.asarray(s).tobytes().decode("utf-8", "surrogateescape") for s in samples]
