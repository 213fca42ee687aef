"""TFRecord framing and ``tf.train.Example`` parsing, without TensorFlow.

A record is ``uint64 length | uint32 masked_crc32c(length) | data | uint32
masked_crc32c(data)``, little-endian. ``Example`` is a small protobuf: features -> map of
name -> one of bytes_list / float_list / int64_list.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

__all__ = [
    "crc32c",
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


def _crc32c_py(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    table = _TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:  # the C implementation when installed; same results, much faster
    from crc32c import crc32c as _crc32c_c  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    _crc32c_c = None


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``."""
    if _crc32c_c is not None:
        return int(_crc32c_c(data))
    return _crc32c_py(data)


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def iter_records(data: bytes, *, source: str) -> Iterator[tuple[int, int, bool]]:
    """``(data_offset, length, data_crc_ok)`` of every record. A bad length CRC or a
    truncated record breaks the framing: ``ValueError`` naming the file and offset."""
    pos, end = 0, len(data)
    while pos < end:
        if pos + 12 > end:
            raise ValueError(f"{source}: truncated record header at byte {pos}")
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if masked_crc32c(header) != length_crc:
            raise ValueError(f"{source}: length CRC mismatch at byte {pos}; file corrupt")
        start = pos + 12
        if start + length + 4 > end:
            raise ValueError(f"{source}: record at byte {pos} is truncated")
        (data_crc,) = struct.unpack("<I", data[start + length : start + length + 4])
        ok = masked_crc32c(data[start : start + length]) == data_crc
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
