"""What attention kernels take, from each row's recorded document segments.

A token dataset written with document columns (docs/FORMAT.md) says, per row, the length
and document of each segment; padding fills a row after its last segment. From those,
per batch of ``B`` rows of ``L`` tokens:

- ``position_ids`` (B, L) int64: 0, 1, 2... restarting at each segment (and at the padding);
- ``document_ids`` (B, L) int64: the document of each token, ``-1`` on padding;
- ``cu_seqlens`` (S + 1,) int32: flash-attention's varlen offsets over the flattened batch,
  one sequence per segment, each row's padding one more sequence (so
  ``cu_seqlens[-1] == B * L`` and ``tokens.view(-1)`` needs no unpadding);
- ``max_seqlen`` int: the longest of those sequences;
- ``labels`` (B, L) int64: the tokens, ``-100`` (ignored by ``cross_entropy``) on padding and
  on the first token of each segment, so no token is trained to follow another document;
- ``document_offsets`` (B, L) int64: each token's place in its whole document (a piece of a
  split document continues where the previous piece stopped), ``-1`` on padding.

All of them in one compiled pass per row (``docfill.py``), written into buffers the
caller gives, so a pooled or pinned buffer is filled in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from flashfeed.errors import CorruptShardError

if TYPE_CHECKING:
    from flashfeed.dataset import Dataset

    from .arrowcols import ArrowShardView
    from .mixsource import MixtureDataset

__all__ = [
    "DOC_OUTPUTS",
    "IGNORE_INDEX",
    "MappedRows",
    "Segments",
    "check_outputs",
    "check_shared_offsets",
    "document_outputs",
    "mapped_rows",
]

DOC_OUTPUTS = (
    "position_ids",
    "document_ids",
    "cu_seqlens",
    "max_seqlen",
    "labels",
    "document_offsets",
)
IGNORE_INDEX = -100
#: the (B, L) outputs, one pooled buffer each
_ROW_OUTPUTS = ("position_ids", "document_ids", "labels", "document_offsets")


@dataclass(frozen=True)
class Segments:
    """A batch's segments, row after row: ``counts[r]`` segments in row ``r``, their
    ``lengths``, documents ``ids`` and where in their document they start (``starts``, when
    ``document_offsets`` is asked for)."""

    counts: np.ndarray
    lengths: np.ndarray
    ids: np.ndarray
    starts: np.ndarray | None = None


@dataclass(frozen=True)
class MappedRows:
    """A batch's token rows read where they lie (a mapped shard's rows, no gather into a
    buffer first): row ``r``'s items at address ``addresses[r]``, ``like`` a (0, L) array
    of their type. The arrays they lie in must stay alive while they are read."""

    addresses: np.ndarray
    like: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.addresses), self.like.shape[1]


def mapped_rows(
    arrays: dict[int, list[np.ndarray]], at: list[tuple[int, int, int]]
) -> MappedRows | None:
    """The rows ``at`` (shard, record batch, row) of ``arrays`` (per shard, a (rows, L)
    array per record batch) by address; None when one of them is not C-contiguous."""
    chunks: dict[tuple[int, int], tuple[int, int, int]] = {}
    addresses = []
    for s, c, i in at:
        got = chunks.get((s, c))
        if got is None:
            a = arrays[s][c]
            if not a.flags.c_contiguous:
                return None
            got = chunks[(s, c)] = (a.ctypes.data, a.strides[0], len(a))
        if not 0 <= i < got[2]:
            raise IndexError(f"row {i} of a record batch of {got[2]}")
        addresses.append(got[0] + i * got[1])
    first = next(iter(arrays.values()))[0]
    return MappedRows(np.array(addresses, np.int64), np.empty((0, *first.shape[1:]), first.dtype))


def document_outputs(
    seg: Segments,
    seq_len: int,
    tokens: np.ndarray | MappedRows,
    outputs: tuple[str, ...],
    alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray],
    *,
    where: str = "batch",
    tokens_out: np.ndarray | None = None,
) -> dict[str, np.ndarray | int]:
    """``outputs`` (names from ``DOC_OUTPUTS``) of a batch whose rows are ``tokens``;
    ``alloc(shape, dtype)`` gives each (B, L) output's buffer, written in place. With
    ``tokens_out``, the tokens are widened into it in the same pass (``docfill.py``: one
    pass per row writes every output while the row is in cache)."""
    from .docfill import fill_documents  # numba: imported (and compiled) on first use

    B, L = len(seg.counts), seq_len
    if tokens.shape != (B, L):
        raise ValueError(f"{where}: tokens of shape {tokens.shape} for {B} rows of {L}")
    bufs = {n: alloc((B, L), np.dtype(np.int64)) for n in _ROW_OUTPUTS if n in outputs}
    if tokens_out is not None:
        bufs["tokens"] = tokens_out
    cu, longest, bad = fill_documents(tokens, seg.counts, seg.lengths, seg.ids, seg.starts, bufs)
    if bad >= 0:
        raise CorruptShardError(
            f"{where}: the document columns do not fit the rows (segments of {bad} tokens "
            f"in a row of {L}, or an empty segment)"
        )
    out: dict[str, np.ndarray | int] = {}
    if "cu_seqlens" in outputs:  # small, and its length changes: not from the pools
        out["cu_seqlens"] = cu.astype(np.int32)
    if "max_seqlen" in outputs:
        out["max_seqlen"] = longest
    for name in DOC_OUTPUTS:
        if name in bufs:
            out[name] = bufs[name]
    return out


def check_outputs(
    outputs: Sequence[str], columns: tuple[str, ...], ds: Dataset | MixtureDataset
) -> tuple[str, ...]:
    """``outputs`` checked (names from ``DOC_OUTPUTS``, the ``tokens`` column read, a dataset
    with document columns) and put in ``DOC_OUTPUTS`` order."""
    if isinstance(outputs, str):
        raise ValueError(f"outputs must be a sequence of names, got {outputs!r}")
    unknown = [o for o in outputs if o not in DOC_OUTPUTS]
    if unknown:
        raise ValueError(f"outputs must be names from {list(DOC_OUTPUTS)}, got {unknown}")
    if not outputs:
        return ()
    if "tokens" not in columns:
        raise ValueError(f"outputs={list(outputs)} need the 'tokens' column in columns")
    if not {"doc_lens", "doc_ids", "doc_starts"} <= set(ds.manifest.schema):
        raise ValueError(
            f"dataset {ds.url} has no document boundaries (no doc_lens/doc_ids/doc_starts "
            "columns: "
            f"written before format version 3?): re-ingest it with --tokenizer, or read it "
            f"without outputs={list(outputs)}"
        )
    return tuple(o for o in DOC_OUTPUTS if o in outputs)


def check_shared_offsets(view: ArrowShardView) -> None:
    """The document columns of a shard hold one entry per segment each: the same offsets
    (the gather indexes them all with one index)."""
    lists = view.lists or {}
    lens = lists.get("doc_lens", [])
    for name, other in lists.items():
        for a, b in zip(lens, other, strict=True):
            if a.offsets is not b.offsets and not np.array_equal(a.offsets, b.offsets):
                raise CorruptShardError(
                    f"shard {view.name}: column {name!r} does not hold one entry per segment "
                    "of 'doc_lens' (their row lengths differ)"
                )
