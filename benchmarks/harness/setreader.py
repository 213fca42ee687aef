"""The cluster tier's reader as it was before ``ShardSet``: each peer's holdings as frozensets
of ints, blobs decoded with a Python loop per varint byte. ``benchmarks.stages.peerheld``
runs it beside ``flashfeed.cache.peer.holdings.apply`` on the same answers."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SetHeld", "apply_sets"]


@dataclass(frozen=True)
class SetHeld:
    """One peer's dataset as the reader kept it: frozensets of shard numbers."""

    complete: frozenset[int]
    filling: frozenset[int]
    count: int = 0


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


def _decode(blob: bytes, count: int) -> np.ndarray:
    if not blob or blob[:1] not in (b"B", b"D"):
        raise ValueError("announcement: unknown encoding")
    d = zlib.decompressobj()
    body = d.decompress(blob[1:], (count // 8 + 1) * 10 + 64)
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


def _unblob(text: str, count: int) -> frozenset[int]:
    return frozenset(_decode(base64.b64decode(text, validate=True), count).tolist())


def apply_sets(
    known: tuple[str, int, dict[str, SetHeld]] | None, data: Mapping[str, Any]
) -> tuple[str, int, dict[str, SetHeld]]:
    """``holdings.apply`` as it was: the same answers, frozensets kept."""
    instance, version = str(data["instance"]), int(data["version"])
    if data.get("full"):
        out = {}
        for key, e in data["datasets"].items():
            count = int(e["count"])
            filling = frozenset(int(s) for s in e["filling"] if 0 <= int(s) < count)
            out[str(key)] = SetHeld(_unblob(e["held"], count), filling, count)
        return instance, version, out
    if known is None or known[0] != instance or known[1] != int(data["since"]):
        raise ValueError("announcement: a delta from another version than the one asked for")
    out = {k: SetHeld(h.complete, frozenset(), h.count) for k, h in known[2].items()}
    for key in data.get("gone", ()):
        out.pop(str(key), None)
    for key, e in data["datasets"].items():
        count = int(e["count"])
        filling = frozenset(int(s) for s in e["filling"] if 0 <= int(s) < count)
        if "held" in e:
            complete = _unblob(e["held"], count)
        else:
            before = out.get(str(key))
            base = before.complete if before is not None and before.count == count else frozenset()
            complete = (base | _unblob(e["added"], count)) - _unblob(e["removed"], count)
        out[str(key)] = SetHeld(complete, filling, count)
    return instance, version, out
