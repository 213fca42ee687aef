"""Text and JSON fields: what a caption or a JSON value becomes on its way through DALI.

The reader (in DALI's reader processes) checks each caption as UTF-8 (gunzipping ``.gz``
members) and picks each JSON value by its key, so a bad sample is named where it is read.
Without a tokenizer a caption travels as its UTF-8 bytes behind one marker byte (so a missing
optional caption, no bytes at all, differs from an empty one) and comes out as ``str``
(``None`` when missing). With ``tokenizer=`` (a ``tokenizer.json``, no hub access) it is
tokenized there into ``max_len`` ids and a mask:

- the tokenizer's own special tokens are added (its post-processor), then the ids are cut to
  the first ``max_len`` (the tokenizer's truncation, which keeps room for the special
  tokens), then padded on the right with ``pad_id`` up to ``max_len``;
- the mask (``<field>_mask``) is 1 for every id from the text, 0 for padding; a missing
  optional caption is all padding.

A JSON value travels as JSON bytes (nothing when missing) and comes out per batch as an
int64 tensor when every value is an integer, float64 when every value is a number, else a
list (``None`` where missing).
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from flashfeed.errors import CorruptShardError

from .fields import FieldSpec

__all__ = [
    "PAD_TOKENS",
    "TextEncoder",
    "collate_json",
    "collate_text",
    "decode_text",
    "field_columns",
    "json_bytes",
    "json_value",
    "load_tokenizer",
    "mask_name",
    "text_bytes",
]

#: the tokens tried, in order, for the padding id when the tokenizer sets none (else 0)
PAD_TOKENS = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")

_PRESENT = 1  # the marker byte before a caption's UTF-8 bytes


def mask_name(field: str) -> str:
    """The output holding a tokenized field's attention mask."""
    return f"{field}_mask"


def field_columns(specs: Sequence[FieldSpec], *, tokenized: bool) -> list[tuple[str, str]]:
    """``(name, dtype)`` of each column the reader hands DALI for ``specs``, in order: a
    label is int64, a tokenized caption int64 ids and an int64 mask, a video its bytes, its
    clip's first frame and start time (``loader/image/video.py``), the rest bytes."""
    out: list[tuple[str, str]] = []
    for s in specs:
        if s.is_label:
            out.append((s.name, "int64"))
        elif s.is_text and tokenized:
            out += [(s.name, "int64"), (mask_name(s.name), "int64")]
        elif s.is_video:  # the video's bytes, its clip's first frame and start time
            out += [(s.name, "uint8"), (f"{s.name}_start_frame", "int32"),
                    (f"{s.name}_start", "float")]  # fmt: skip
        else:
            out.append((s.name, "uint8"))
    return out


def decode_text(data: bytes | np.ndarray, ext: str, *, where: str) -> str:
    """A caption member as ``str``; not UTF-8 (or a broken ``.gz``) is a ``CorruptShardError``
    naming ``where`` and the first bad byte."""
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    if ext.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise CorruptShardError(f"{where}: caption .{ext} is not gzip ({exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptShardError(
            f"{where}: caption .{ext} is not UTF-8 (byte {exc.start} of {len(raw)}: "
            f"{raw[exc.start : exc.start + 1]!r})"
        ) from None


def json_value(data: bytes | np.ndarray, spec: FieldSpec, *, where: str) -> tuple[bool, Any]:
    """``(found, value)`` of ``spec``'s key in a JSON member. A member that is not JSON, or
    one without the key (unless the field is optional), is a ``CorruptShardError``."""
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    path = spec.json_key or ()
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptShardError(f"{where}: .json is not JSON ({exc})") from None
    for i, k in enumerate(path):
        if not isinstance(value, dict) or k not in value:
            if spec.optional:
                return False, None
            have = sorted(value) if isinstance(value, dict) else type(value).__name__
            raise CorruptShardError(
                f"{where}: .json has no key {'.'.join(path[: i + 1])!r} for field "
                f"{spec.name!r} (it has {have}); pass optional=[{spec.name!r}] to allow that"
            )
        value = value[k]
    return True, value


def load_tokenizer(tokenizer: str | os.PathLike[str] | Any) -> str:
    """A ``tokenizer.json`` path (or a ``tokenizers.Tokenizer``) as the JSON text every
    reader process rebuilds it from; a bad path is a ``ValueError`` naming it."""
    from tokenizers import Tokenizer

    if isinstance(tokenizer, Tokenizer):
        return str(tokenizer.to_str())
    if not isinstance(tokenizer, str | os.PathLike):
        raise ValueError(
            f"tokenizer must be a tokenizer.json path or a tokenizers.Tokenizer, got "
            f"{type(tokenizer).__name__}"
        )
    try:
        return str(Tokenizer.from_file(os.fspath(tokenizer)).to_str())
    except Exception as exc:  # the library raises plain Exception for a bad file
        raise ValueError(f"cannot load tokenizer {os.fspath(tokenizer)!r}: {exc}") from None


@dataclass(frozen=True)
class TextEncoder:
    """Captions -> ``(ids, mask)`` of ``max_len`` (see the module docstring for the rule).
    Picklable: it holds the tokenizer's JSON and builds the tokenizer once per process."""

    tokenizer_json: str
    max_len: int = 77

    def __post_init__(self) -> None:
        if isinstance(self.max_len, bool) or not isinstance(self.max_len, int):
            raise ValueError(f"max_len must be an integer >= 1, got {self.max_len!r}")
        if self.max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {self.max_len}")

    def _tokenizer(self) -> Any:
        tok = self.__dict__.get("_tok")
        if tok is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_str(self.tokenizer_json)
            pad = tok.padding["pad_id"] if tok.padding else None
            for name in PAD_TOKENS if pad is None else ():
                pad = tok.token_to_id(name)
                if pad is not None:
                    break
            tok.no_padding()
            tok.enable_truncation(self.max_len)
            object.__setattr__(self, "_pad", 0 if pad is None else int(pad))
            object.__setattr__(self, "_tok", tok)
        return tok

    def __getstate__(self) -> dict[str, Any]:
        return {"tokenizer_json": self.tokenizer_json, "max_len": self.max_len}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    @property
    def pad_id(self) -> int:
        """The tokenizer's padding id if it sets one, else the first of ``PAD_TOKENS`` it
        knows, else 0."""
        self._tokenizer()
        return int(self.__dict__["_pad"])

    def encode(self, texts: Sequence[str | None]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per caption: int64 ids and int64 mask, each of ``max_len``."""
        tok = self._tokenizer()
        pad = self.pad_id
        present = [t for t in texts if t is not None]
        encoded = iter(tok.encode_batch(present) if present else [])
        ids_out, mask_out = [], []
        for t in texts:
            ids = np.full(self.max_len, pad, np.int64)
            mask = np.zeros(self.max_len, np.int64)
            if t is not None:
                got = next(encoded).ids[: self.max_len]
                ids[: len(got)] = got
                mask[: len(got)] = 1
            ids_out.append(ids)
            mask_out.append(mask)
        return ids_out, mask_out


def text_bytes(text: str | None) -> np.ndarray:
    """A caption as it travels untokenized: marker byte + UTF-8, or nothing when missing."""
    if text is None:
        return np.zeros(0, np.uint8)
    return np.frombuffer(bytes([_PRESENT]) + text.encode("utf-8"), np.uint8)


def json_bytes(found: bool, value: Any) -> np.ndarray:
    """A JSON value as it travels: its JSON text, or nothing when missing."""
    if not found:
        return np.zeros(0, np.uint8)
    return np.frombuffer(json.dumps(value).encode("utf-8"), np.uint8)


def _samples(tl: Any) -> list[bytes]:
    cpu = tl.as_cpu() if hasattr(tl, "as_cpu") else tl
    return [np.asarray(cpu.at(i)).tobytes() for i in range(len(cpu))]


def collate_text(tl: Any) -> list[str | None]:
    """A caption output (``text_bytes`` per sample) as ``str`` per sample."""
    return [b[1:].decode("utf-8") if b else None for b in _samples(tl)]


def collate_json(tl: Any) -> Any:
    """A JSON output (``json_bytes`` per sample): int64 or float64 tensor when every value is
    an integer or a number, else a list (None where missing)."""
    import torch  # not in reader processes, which only encode

    values = [json.loads(b) if b else None for b in _samples(tl)]
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.int64)
    if values and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return torch.tensor(values, dtype=torch.float64)
    return values
