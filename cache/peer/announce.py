"""What a node holds, as it announces it: per dataset, the shard numbers in a small blob.

A node's shards of one dataset are encoded two ways and the shorter is sent (first byte
says which): ``B`` a bitmap over the dataset's shard numbers, zlib-compressed (dense
holdings), or ``D`` the gaps between held numbers as LEB128 varints, zlib-compressed
(sparse holdings). Either costs about the entropy of the set: a node holding k of n shards
announces about ``k * log2(n / k)`` bits plus a few bytes (docs/CACHE.md, "Cluster tier").
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Iterable

import numpy as np

__all__ = ["MAX_ANNOUNCEMENT", "decode_held", "encode_held", "encoded_size"]

#: the most bytes of one announcement a node reads (a larger one is refused)
MAX_ANNOUNCEMENT = 16 << 20


def _varints(values: np.ndarray) -> bytes:
    out = bytearray()
    for v in values.tolist():
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _unvarints(data: bytes) -> list[int]:
    out, value, shift = [], 0, 0
    for b in data:
        value |= (b & 0x7F) << shift
        if b & 0x80:
            shift += 7
            continue
        out.append(value)
        value, shift = 0, 0
    if shift:
        raise ValueError("announcement: a varint is cut short")
    return out


def encode_held(shards: Iterable[int], count: int) -> bytes:
    """The blob announcing ``shards`` (numbers in ``[0, count)``)."""
    held = np.unique(np.fromiter((int(s) for s in shards), dtype=np.int64))
    if len(held) and (held[0] < 0 or held[-1] >= count):
        raise ValueError(f"shard numbers must be in [0, {count}), got {held[0]}..{held[-1]}")
    bits = np.zeros(count, dtype=np.uint8)
    bits[held] = 1
    dense = b"B" + zlib.compress(np.packbits(bits).tobytes(), 9)
    gaps = np.diff(held, prepend=-1) - 1 if len(held) else held
    sparse = b"D" + zlib.compress(_varints(gaps), 9)
    return dense if len(dense) < len(sparse) else sparse


def decode_held(blob: bytes, count: int) -> np.ndarray:
    """The sorted shard numbers ``blob`` announces; ValueError on anything malformed."""
    if not blob or blob[:1] not in (b"B", b"D"):
        raise ValueError("announcement: unknown encoding")
    d = zlib.decompressobj()
    body = d.decompress(blob[1:], (count // 8 + 1) * 10 + 64)  # bounded: no zip bomb
    if d.unconsumed_tail:
        raise ValueError("announcement: larger than its dataset allows")
    if blob[:1] == b"B":
        if len(body) != -(-count // 8):
            raise ValueError(f"announcement: bitmap of {len(body)} bytes for {count} shards")
        return np.flatnonzero(np.unpackbits(np.frombuffer(body, dtype=np.uint8))[:count])
    held = np.cumsum(np.asarray(_unvarints(body), dtype=np.int64) + 1) - 1
    if len(held) and held[-1] >= count:
        raise ValueError(f"announcement: shard {held[-1]} beyond the dataset's {count}")
    return held


def encoded_size(shards: Iterable[int], count: int) -> int:
    """Bytes of the announcement of ``shards`` as sent (base64 in JSON)."""
    return len(base64.b64encode(encode_held(shards, count)))
