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

__all__ = [
    "MAX_ANNOUNCEMENT",
    "MAX_SHARDS",
    "encode_held",
    "encoded_size",
    "unique_shards",
    "unpack_held",
]

#: the most bytes of one announcement a node reads (a larger one is refused)
MAX_ANNOUNCEMENT = 16 << 20

#: the most shards a dataset may count: shard numbers are 32-bit
MAX_SHARDS = 1 << 32

#: the longest varint read: 35 bits, beyond any gap between shard numbers
_MAX_VARINT = 5


def _varints(values: np.ndarray) -> bytes:
    """LEB128 of each value (non-negative, under 2**35), vectorized: 7 bits a byte, low first."""
    v = np.asarray(values, dtype=np.uint64)
    if not len(v):
        return b""
    width = np.ones(len(v), dtype=np.int64)
    for i in range(1, _MAX_VARINT):
        width += v >= np.uint64(1 << (7 * i))
    starts = np.cumsum(width) - width
    place = np.arange(int(width.sum())) - np.repeat(starts, width)
    out = (np.repeat(v, width) >> (7 * place).astype(np.uint64)) & np.uint64(0x7F)
    out = out.astype(np.uint8)
    out[place < np.repeat(width - 1, width)] |= 0x80
    return out.tobytes()


def _unvarints(data: bytes) -> np.ndarray:
    """The values ``_varints`` wrote; ValueError on a cut or over-long varint."""
    b = np.frombuffer(data, dtype=np.uint8)
    if not len(b):
        return np.zeros(0, dtype=np.int64)
    if b[-1] & 0x80:
        raise ValueError("announcement: a varint is cut short")
    ends = np.flatnonzero(b < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    width = ends - starts + 1
    if int(width.max()) > _MAX_VARINT:
        raise ValueError(f"announcement: a varint over {_MAX_VARINT} bytes")
    place = np.arange(len(b)) - np.repeat(starts, width)
    return np.add.reduceat((b & 0x7F).astype(np.int64) << (7 * place), starts)


def unique_shards(shards: Iterable[int], count: int) -> np.ndarray:
    """``shards`` sorted, each once (int64); ValueError when one is outside ``[0, count)``."""
    held = np.unique(np.fromiter((int(s) for s in shards), dtype=np.int64))
    if len(held) and (held[0] < 0 or held[-1] >= count):
        raise ValueError(f"shard numbers must be in [0, {count}), got {held[0]}..{held[-1]}")
    return held


def encode_held(shards: Iterable[int], count: int) -> bytes:
    """The blob announcing ``shards`` (numbers in ``[0, count)``)."""
    if not 0 <= count <= MAX_SHARDS:
        raise ValueError(f"a dataset counts 0 to {MAX_SHARDS} shards, got {count}")
    held = unique_shards(shards, count)
    bits = np.zeros(count, dtype=np.uint8)
    bits[held] = 1
    dense = b"B" + zlib.compress(np.packbits(bits).tobytes(), 9)
    gaps = np.diff(held, prepend=-1) - 1 if len(held) else held
    sparse = b"D" + zlib.compress(_varints(gaps), 9)
    return dense if len(dense) < len(sparse) else sparse


def unpack_held(blob: bytes, count: int) -> tuple[bool, np.ndarray]:
    """What ``blob`` announces as sent: ``(True, packed bitmap)`` (bits past ``count`` clear)
    or ``(False, sorted shard numbers)``; ValueError on anything malformed."""
    if not blob or blob[:1] not in (b"B", b"D"):
        raise ValueError("announcement: unknown encoding")
    if not 0 <= count <= MAX_SHARDS:
        raise ValueError(f"announcement: a dataset of {count} shards")
    d = zlib.decompressobj()
    body = d.decompress(blob[1:], (count // 8 + 1) * 10 + 64)  # bounded: no zip bomb
    if d.unconsumed_tail:
        raise ValueError("announcement: larger than its dataset allows")
    if blob[:1] == b"B":
        if len(body) != -(-count // 8):
            raise ValueError(f"announcement: bitmap of {len(body)} bytes for {count} shards")
        bits = np.frombuffer(body, dtype=np.uint8).copy()
        if count % 8:
            bits[-1] &= 0xFF << (8 - count % 8) & 0xFF
        return True, bits
    held = np.cumsum(_unvarints(body) + 1) - 1
    if len(held) and held[-1] >= count:
        raise ValueError(f"announcement: shard {held[-1]} beyond the dataset's {count}")
    return False, held


def encoded_size(shards: Iterable[int], count: int) -> int:
    """Bytes of the announcement of ``shards`` as sent (base64 in JSON)."""
    return len(base64.b64encode(encode_held(shards, count)))
