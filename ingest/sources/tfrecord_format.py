"""TFRecord framing and ``tf.train.Example`` parsing, without TensorFlow.

A record is ``uint64 length | uint32 masked_crc32c(length) | data | uint32
masked_crc32c(data)``, little-endian. ``Example`` is a small protobuf: features -> map of
name -> one of bytes_list / float_list / int64_list.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "CRC32C_BACKENDS",
    "crc32c",
    "crc32c_backend",
    "crc32c_python",
    "encode_example",
    "frame_record",
    "iter_records",
    "masked_crc32c",
    "parse_example",
]

_POLY = 0x82F63B78


def _table() -> list[int]:
    out = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        out.append(c)
    return out


_TABLE = _table()


def crc32c_python(data: bytes) -> int:
    """CRC-32C in pure Python: the fallback when no crc32c package is installed
    (about 1,000x slower than the packages: a few MB/s)."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _google_crc32c() -> Callable[[bytes], int]:
    import google_crc32c  # type: ignore[import-not-found]

    return google_crc32c.value  # type: ignore[no-any-return]


def _crc32c_package() -> Callable[[bytes], int]:
    import crc32c as package  # type: ignore[import-not-found]

    return package.crc32c  # type: ignore[no-any-return]


# name -> loader, fastest first (benchmarks/stages/tfrecordcrc.py measures them): the first that
# imports serves every check; the pure-Python loop is the last resort.
CRC32C_BACKENDS: dict[str, Callable[[], Callable[[bytes], int]]] = {
    "google-crc32c": _google_crc32c,
    "crc32c": _crc32c_package,
    "python": lambda: crc32c_python,
}


def crc32c_backend(name: str | None = None) -> tuple[str, Callable[[bytes], int]]:
    """``(name, function)`` of the CRC-32C implementation ``name``, or of the first one
    installed when ``name`` is None. An unknown or missing ``name`` is a ``ValueError``
    (unknown) or ``ImportError`` (not installed) naming it."""
    if name is not None:
        if name not in CRC32C_BACKENDS:
            raise ValueError(
                f"unknown crc32c backend {name!r}; expected one of {sorted(CRC32C_BACKENDS)}"
            )
        return name, CRC32C_BACKENDS[name]()
    for candidate, load in CRC32C_BACKENDS.items():
        try:
            return candidate, load()
        except ImportError:
            continue
    raise AssertionError("unreachable: the pure-Python backend always loads")


_CRC_NAME, _CRC = crc32c_backend()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, through the fastest installed backend."""
    return int(_CRC(data))


def _masked(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    return _masked(crc32c(data))


def iter_records(
    data: bytes, *, source: str, crc: Callable[[bytes], int] | None = None
) -> Iterator[tuple[int, int, bool]]:
    """``(data_offset, length, data_crc_ok)`` of every record. A bad length CRC or a
    truncated record breaks the framing: ``ValueError`` naming the file and offset.
    ``crc`` is the CRC-32C function to check with (default: the fastest installed)."""
    check = crc or _CRC
    pos, end = 0, len(data)
    while pos < end:
        if pos + 12 > end:
            raise ValueError(f"{source}: truncated record header at byte {pos}")
        (length, length_crc) = struct.unpack_from("<QI", data, pos)
        if _masked(check(data[pos : pos + 8])) != length_crc:
            raise ValueError(f"{source}: length CRC mismatch at byte {pos}; file corrupt")
        start = pos + 12
        if start + length + 4 > end:
            raise ValueError(f"{source}: record at byte {pos} is truncated")
        (data_crc,) = struct.unpack_from("<I", data, start + length)
        ok = _masked(check(data[start : start + length])) == data_crc
        yield start, length, ok
        pos = start + length + 4


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, Any]]:
    """``(field_number, wire_type, value)`` of a protobuf message."""
    pos = 0
    while pos < len(buf):
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        value: Any
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > len(buf):
                raise ValueError("truncated length-delimited field")
            value, pos = buf[pos : pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        yield number, wire, value


def _int64s(wire: int, value: Any) -> list[int]:
    if wire == 0:
        vals = [value]
    else:
        vals, pos = [], 0
        while pos < len(value):
            v, pos = _varint(value, pos)
            vals.append(v)
    return [v - (1 << 64) if v >= 1 << 63 else v for v in vals]


def _floats(wire: int, value: bytes) -> list[float]:
    if len(value) % 4:
        raise ValueError("float list length is not a multiple of 4")
    return list(struct.unpack(f"<{len(value) // 4}f", value))


def _feature(buf: bytes) -> tuple[str, list[Any]]:
    for number, _, value in _fields(buf):
        out: list[Any] = []
        if number == 1:
            out = [v for n, _, v in _fields(value) if n == 1]
            return "bytes", [bytes(v) for v in out]
        if number == 2:
            for n, w, v in _fields(value):
                if n == 1:
                    out += _floats(w, v) if w == 2 else list(struct.unpack("<f", v))
            return "float", out
        if number == 3:
            for n, w, v in _fields(value):
                if n == 1:
                    out += _int64s(w, v)
            return "int", out
    return "bytes", []


def parse_example(buf: bytes) -> dict[str, tuple[str, list[Any]]]:
    """``{feature_name: (type, values)}`` with type ``bytes`` | ``float`` | ``int``."""
    out: dict[str, tuple[str, list[Any]]] = {}
    for number, wire, features in _fields(buf):
        if number != 1 or wire != 2:
            continue
        for n, _, entry in _fields(features):
            if n != 1:
                continue
            key, feature = "", b""
            for en, _, ev in _fields(entry):
                if en == 1:
                    key = bytes(ev).decode("utf-8")
                elif en == 2:
                    feature = ev
            out[key] = _feature(feature)
    return out


def _key(n: int, wire: int) -> bytes:
    return _encode_varint(n << 3 | wire)


def _encode_varint(v: int) -> bytes:
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(n: int, payload: bytes) -> bytes:
    return _key(n, 2) + _encode_varint(len(payload)) + payload


def encode_example(features: dict[str, bytes | int | float | list[Any]]) -> bytes:
    """A serialized ``tf.train.Example`` (for writing test corpora and round trips)."""
    entries = b""
    for name, value in features.items():
        vals: list[Any] = value if isinstance(value, list) else [value]
        if all(isinstance(v, bytes) for v in vals):
            inner = _len_field(1, b"".join(_len_field(1, bytes(v)) for v in vals))
        elif all(isinstance(v, int) for v in vals):
            inner = _len_field(3, _len_field(1, b"".join(_encode_varint(int(v)) for v in vals)))
        else:
            packed = struct.pack(f"<{len(vals)}f", *vals)
            inner = _len_field(2, _len_field(1, packed))
        entry = _len_field(1, name.encode()) + _len_field(2, inner)
        entries += _len_field(1, entry)
    return _len_field(1, entries)


def frame_record(data: bytes) -> bytes:
    """One TFRecord frame around ``data``."""
    header = struct.pack("<Q", len(data))
    return (
        header
        + struct.pack("<I", masked_crc32c(header))
        + data
        + struct.pack("<I", masked_crc32c(data))
    )
