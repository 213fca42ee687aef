"""Which tar members feed which loader outputs: ``{"image": "jpg;png", "label": "cls;json"}``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .labels import LABEL_EXTS

__all__ = ["DEFAULT_FIELDS", "FieldSpec", "parse_fields"]

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp")
DEFAULT_FIELDS: dict[str, tuple[str, ...]] = {"image": IMAGE_EXTS, "label": LABEL_EXTS}


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
        if isinstance(exts, str):
            exts = exts.split(";")
        ext_t = tuple(e.strip().lstrip(".") for e in exts if e.strip())
        if not ext_t:
            raise ValueError(f"field {name!r} names no extension")
        out.append(FieldSpec(name, ext_t, name.endswith("label"), name in optional))
    return tuple(out)
