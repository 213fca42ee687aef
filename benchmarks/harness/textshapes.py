"""Text corpora of a chosen shape, made on the fly from text already on the machine: every
document a run of real text (licences, package docs, Python sources) cut at a random place
to a length drawn log-normal around a median (300 B, 3 KB, 100 KB), so a benchmark sees
corpora it was not tuned on, of many small or a few large documents."""

from __future__ import annotations

import glob
import gzip
import os

import numpy as np

__all__ = ["DEFAULT_SHAPES", "SHAPES", "machine_text", "shaped_documents"]

#: the corpus shapes: name -> median document bytes
SHAPES = {"100B": 100, "300B": 300, "1KB": 1_000, "3KB": 3_000, "30KB": 30_000, "100KB": 100_000}
#: the shapes measured unless others are asked for
DEFAULT_SHAPES = ("300B", "3KB", "100KB")
_SOURCES = (
    "/usr/share/common-licenses/*",
    "/usr/share/doc/*/*",
    "/usr/lib/python3*/*.py",
    "/usr/lib/python3*/*/*.py",
)
_POOL_BYTES = 16 << 20


def machine_text(limit: int = _POOL_BYTES) -> str:
    """Up to ``limit`` bytes of UTF-8 text from files on this machine, files in sorted order."""
    parts: list[str] = []
    total = 0
    for pattern in _SOURCES:
        for f in sorted(glob.glob(pattern)):
            if total >= limit:
                break
            if not os.path.isfile(f) or os.path.islink(f):
                continue
            try:
                with gzip.open(f) if f.endswith(".gz") else open(f, "rb") as fh:
                    text = fh.read(1 << 20).decode("utf-8")
            except (OSError, UnicodeDecodeError, EOFError):
                continue
            parts.append(text)
            total += len(text)
    if total < 1 << 20:
        raise SystemExit(f"less than 1 MB of text found under {_SOURCES}")
    return "\n".join(parts)


def shaped_documents(
    pool: str, *, median: int, total_bytes: int, seed: int = 0, sigma: float = 0.8
) -> list[str]:
    """Documents of log-normal lengths (``median`` characters, spread ``sigma``, at least
    20, at most 16 x the median), each a slice of ``pool`` starting at a random line, until
    ``total_bytes`` of text."""
    if median <= 0 or total_bytes <= 0:
        raise ValueError(f"median and total_bytes must be > 0, got {median}, {total_bytes}")
    rng = np.random.default_rng(seed)
    docs: list[str] = []
    total = 0
    span = len(pool) - 16 * median - 1
    if span <= 0:
        raise ValueError(f"the text pool ({len(pool)} chars) is too small for median {median}")
    while total < total_bytes:
        n = int(min(max(rng.lognormal(np.log(median), sigma), 20), 16 * median))
        at = int(rng.integers(0, span))
        line = pool.find("\n", at, at + 4096)
        at = line + 1 if line >= 0 else at
        doc = pool[at : at + n].strip()
        if doc:
            docs.append(doc)
            total += len(doc.encode())
    return docs
