"""Per-sample cleaning and conversion: text normalisation, image checks and re-encoding,
content hashes for dedup, and the output field names these imply. Each raises ``Reject``
to skip a sample under a counted reason."""

from __future__ import annotations

import io
import json
import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash
from PIL import Image

from flashfeed.format.video import probe_video

from .sources.base import Record, Reject
from .sources.textcheck import LONE_SURROGATE, lone_surrogate

__all__ = [
    "TransformOptions",
    "clean_text",
    "content_hash",
    "empty_field",
    "output_fields",
    "reencoded_name",
    "table_texts",
    "transform_record",
]


@dataclass(frozen=True, kw_only=True)
class TransformOptions:
    validate: bool = False
    max_pixels: int = 89_478_485
    max_image_side: int | None = None
    jpeg_quality: int | None = None
    keep_original_size: bool = False
    normalize_text: bool = True

    @property
    def reencode(self) -> bool:
        return self.max_image_side is not None or self.jpeg_quality is not None


def reencoded_name(name: str) -> str:
    """``png`` -> ``jpg``, ``left.png`` -> ``left.jpg``: re-encoded images are JPEGs."""
    head, _, _ = name.rpartition(".")
    return f"{head}.jpg" if head else "jpg"


def output_fields(kinds: dict[str, str], opts: TransformOptions) -> dict[str, str]:
    """The fields (name -> kind) samples have after transforms, sorted by name."""
    out: dict[str, str] = {}
    for name, kind in kinds.items():
        if kind == "image" and opts.reencode:
            out[reencoded_name(name)] = "image"
            if opts.keep_original_size:
                out["orig_size"] = "text"
        elif kind == "video":  # the video and what its probe found, beside it
            out[name] = "video"
            out[f"{name}.json"] = "json"
        else:
            out[name] = kind
    return dict(sorted(out.items()))


def content_hash(record: Record) -> str:
    """Exact-duplicate identity: every field's bytes but the label (one image filed under
    two classes is still one image)."""
    h = xxhash.xxh3_128()
    for name in sorted(record):
        if name == "cls":
            continue
        value = record[name]
        if value is None:
            continue
        h.update(name.encode() + b"\0")
        if isinstance(value, bytes | bytearray | memoryview):
            h.update(value)
        elif isinstance(value, str):  # a lone surrogate hashes too (the shard task skips it)
            h.update(value.encode("utf-8", "surrogatepass"))
        else:
            h.update(json.dumps(value, sort_keys=True).encode())
        h.update(b"\0\0")
    return h.hexdigest()


def _open_image(data: bytes, name: str, max_pixels: int) -> Image.Image:
    """Open without decoding and refuse decompression bombs from the header alone."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise Reject("too_many_pixels", f"{name}: {exc}") from None
    except Exception as exc:
        raise Reject("undecodable", f"{name}: {type(exc).__name__}: {exc}") from None
    w, h = img.size
    if w * h > max_pixels:
        raise Reject("too_many_pixels", f"{name}: {w}x{h} exceeds the {max_pixels} pixel limit")
    return img


def _decode(img: Image.Image, name: str, *, check_only: bool = False) -> Image.Image:
    """Decode the pixels, or refuse the image. ``check_only``: a JPEG decodes at 1/8 scale
    (``draft``), a third cheaper: every entropy-coded bit is still read, so it refuses
    exactly what a full decode refuses, but the pixels are not kept for anything."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if check_only:
                img.draft(img.mode, (1, 1))
            img.load()
    except Exception as exc:
        raise Reject("undecodable", f"{name}: {type(exc).__name__}: {exc}") from None
    return img


def _reencode(img: Image.Image, opts: TransformOptions) -> tuple[bytes, tuple[int, int]]:
    if img.mode not in ("RGB", "L"):
        img = img.convert("RGB")
    side = opts.max_image_side
    if side is not None and max(img.size) > side:
        w, h = img.size
        scale = side / max(w, h)
        img = img.resize(
            (max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.LANCZOS
        )
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=opts.jpeg_quality or 90, optimize=False)
    return out.getvalue(), img.size


def transform_record(
    record: Record,
    kinds: dict[str, str],
    opts: TransformOptions,
    *,
    sizes: dict[str, tuple[int, int]] | None = None,
) -> Record:
    """The sample after cleaning, or ``Reject``. ``kinds`` are the source's field kinds; a
    string no UTF-8 encoder takes (a lone surrogate) is a ``lone_surrogate`` reject, whatever
    its field. ``sizes``, when given, receives ``(width, height)`` of every output image field the
    transform opened (checked or re-encoded), so that a shard's size table need not parse
    those images again."""
    out: Record = {}
    has_text = has_content = False
    for name, value in record.items():
        if value is None:
            continue
        kind = kinds.get(name, "bytes")
        if isinstance(value, str) and (bad := lone_surrogate(value)) is not None:
            raise Reject(LONE_SURROGATE, f"{name}: {bad}")
        if kind == "text":
            has_text = True
            text = str(value)
            if opts.normalize_text:
                text = unicodedata.normalize("NFC", text).strip()
            if text:
                out[name] = text
        elif kind == "image":
            has_content = True
            if not isinstance(value, bytes | bytearray):
                raise Reject("bad_value", f"{name}: image field holds {type(value).__name__}")
            out.update(_image(name, bytes(value), opts, sizes))
        elif kind == "video":
            has_content = True
            out.update(_video(name, value))
        else:
            if kind in ("bytes", "json"):
                has_content = True
            out[name] = value
    if has_text and not has_content and not any(kinds.get(n) == "text" for n in out):
        raise Reject("empty_text", "every text field is empty after normalisation")
    return out


def clean_text(name: str, value: Any, opts: TransformOptions) -> str | None:
    """What ``transform_record`` makes of a record whose one field ``name`` is text: the
    text, None for no value (nothing out), or the same ``Reject``; one call per document
    where a shard's documents are taken straight from their rows."""
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    if (bad := lone_surrogate(text)) is not None:
        raise Reject(LONE_SURROGATE, f"{name}: {bad}")
    if opts.normalize_text:
        text = unicodedata.normalize("NFC", text).strip()
    if not text:
        raise Reject("empty_text", "every text field is empty after normalisation")
    return text


def _video(name: str, value: Any) -> dict[str, Any]:
    """The video and ``<name>.json``: its codec, frames, fps, width, height and duration,
    probed from its container. Unreadable or frameless videos are counted rejects."""
    if not isinstance(value, bytes | bytearray):
        raise Reject("bad_value", f"{name}: video field holds {type(value).__name__}")
    try:
        probe = probe_video(bytes(value))
    except ValueError as exc:
        raise Reject("undecodable_video", f"{name}: {exc}") from None
    if probe.frames == 0:
        raise Reject("empty_video", f"{name}: the video has no frames")
    return {name: bytes(value), f"{name}.json": json.dumps(probe.to_dict(), sort_keys=True)}


def _image(
    name: str, data: bytes, opts: TransformOptions, sizes: dict[str, tuple[int, int]] | None
) -> dict[str, Any]:
    if not (opts.validate or opts.reencode):
        return {name: data}
    img = _open_image(data, name, opts.max_pixels)
    size = img.size
    img = _decode(img, name, check_only=not opts.reencode)
    if not opts.reencode:
        if sizes is not None:
            sizes[name] = (int(size[0]), int(size[1]))
        return {name: data}
    encoded, new_size = _reencode(img, opts)
    out: dict[str, Any] = {reencoded_name(name): encoded}
    if sizes is not None:
        sizes[reencoded_name(name)] = (int(new_size[0]), int(new_size[1]))
    if opts.keep_original_size:
        out["orig_size"] = f"{size[0]}x{size[1]}"
    return out


def empty_field(index: int, source: str, name: str) -> dict[str, Any]:
    """The reject of a sample whose field ``name`` is left empty."""
    return {"index": index, "source": source, "reason": "empty_text",
            "detail": f"field {name!r} is empty"}  # fmt: skip


def table_texts(
    rows: Sequence[tuple[Any, ...]], name: str, opts: TransformOptions
) -> tuple[list[str], list[int], list[dict[str, Any]], int]:
    """``(texts, ids, rejects, bytes read)`` of items ``rows`` (``item_rows``) of a table whose
    one field ``name`` is text: what ``read_table_item`` then ``transform_record`` make of
    each, and the same rejects, without a record per item."""
    texts: list[str] = []
    ids: list[int] = []
    rejects: list[dict[str, Any]] = []
    nbytes = 0
    for index, source, _, ref in rows:
        value = ref["values"].get(name)
        if value is not None:
            nbytes += len(value if isinstance(value, str) else str(value))
        try:
            text = clean_text(name, value, opts)
        except Reject as r:
            rejects.append({"index": index, "source": source, "reason": r.reason,
                            "detail": r.detail})  # fmt: skip
            continue
        if text is None:
            rejects.append(empty_field(index, source, name))
            continue
        texts.append(text)
        ids.append(index)
    return texts, ids, rejects, nbytes
