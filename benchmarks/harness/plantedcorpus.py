"""A seeded text corpus with planted near-duplicates: the ground truth that near-duplicate
removal is tested and benchmarked against.

Base documents are random word sequences over a Zipf-distributed vocabulary (unrelated to
each other); a planted copy replaces a fraction of a base's words so that its word-shingle
Jaccard similarity to the base lands near a target. The exact similarity of every planted
pair is measured and returned with it.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass

import numpy as np

from flashfeed.ingest.minhash import jaccard, shingles

__all__ = ["PlantedCorpus", "PlantedPair", "make_planted_corpus", "write_jsonl"]


@dataclass(frozen=True)
class PlantedPair:
    """Document ``copy`` is an edited ``base``; ``jaccard`` is their measured similarity."""

    base: int
    copy: int
    target: float
    jaccard: float


@dataclass(frozen=True)
class PlantedCorpus:
    docs: list[str]
    pairs: list[PlantedPair]


def _replace_fraction(target: float, size: int) -> float:
    """Share of words to replace so ~``target`` of the shingles survive in Jaccard terms:
    a kept shingle needs all its ``size`` words intact, and J = q / (2 - q)."""
    q = 2 * target / (1 + target)
    return float(1 - q ** (1 / size))


def make_planted_corpus(
    *,
    bases: int,
    copies_above: tuple[float, ...] = (0.85, 0.9, 0.95),
    copies_below: tuple[float, ...] = (0.3, 0.5),
    planted_share: float = 0.5,
    words: tuple[int, int] = (150, 600),
    vocab: int = 30_000,
    shingle_size: int = 5,
    seed: int = 0,
) -> PlantedCorpus:
    """``bases`` random documents; ``planted_share`` of them get one edited copy per target
    in ``copies_above`` and ``copies_below``. Documents come shuffled (seeded)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, vocab + 1) ** 1.05
    weights /= weights.sum()
    base_words = [
        rng.choice(vocab, size=int(rng.integers(words[0], words[1] + 1)), p=weights)
        for _ in range(bases)
    ]
    texts: list[tuple[str, int, float]] = [(_text(w), -1, 1.0) for w in base_words]
    for b in range(bases):
        if rng.random() >= planted_share:
            continue
        for target in (*copies_above, *copies_below):
            w = base_words[b].copy()
            hit = rng.random(len(w)) < _replace_fraction(target, shingle_size)
            w[hit] = rng.integers(vocab, 2 * vocab, int(hit.sum()))  # words no base uses
            texts.append((_text(w), b, target))
    order = rng.permutation(len(texts))
    position = {int(old): new for new, old in enumerate(order)}
    docs = [texts[i][0] for i in order]
    pairs = []
    for old, (text, b, target) in enumerate(texts):
        if b < 0:
            continue
        a, c = position[b], position[old]
        j = jaccard(shingles(docs[a], size=shingle_size), shingles(text, size=shingle_size))
        pairs.append(PlantedPair(min(a, c), max(a, c), target, j))
    return PlantedCorpus(docs, sorted(pairs, key=lambda p: (p.base, p.copy)))


def _text(ids: np.ndarray) -> str:
    return " ".join(f"w{int(i):x}" for i in ids)


def write_jsonl(docs: list[str], path: str, *, column: str = "text") -> None:
    """One JSON object per line (gzip-compressed for a ``.gz`` path)."""
    body = "".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(docs)).encode()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        f.write(gzip.compress(body, mtime=0) if path.endswith(".gz") else body)
