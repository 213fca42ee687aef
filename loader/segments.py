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

Vectorised over the batch (one ``np.repeat`` of the segments per output, no per-token
Python), written into buffers the caller gives, so a pooled or pinned buffer is filled in
place.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flashfeed.errors import CorruptShardError

__all__ = ["DOC_OUTPUTS", "IGNORE_INDEX", "Segments", "document_outputs"]

DOC_OUTPUTS = (
    "position_ids",
    "document_ids",
    "cu_seqlens",
    "max_seqlen",
    "labels",
    "document_offsets",
)
IGNORE_INDEX = -100


@dataclass(frozen=True)
class Segments:
    """A batch's segments, row after row: ``counts[r]`` segments in row ``r``, their
    ``lengths``, documents ``ids`` and where in their document they start (``starts``, when
    ``document_offsets`` is asked for)."""

    counts: np.ndarray
    lengths: np.ndarray
    ids: np.ndarray
    starts: np.ndarray | None = None


_RAMPS: dict[int, np.ndarray] = {}


def _ramp(n: int) -> np.ndarray:
    """``arange(n)``, made once per size and shared read-only."""
    r = _RAMPS.get(n)
    if r is None:
        r = np.arange(n, dtype=np.int64)
        r.flags.writeable = False
        _RAMPS.clear()  # one batch shape at a time (the last batch may be shorter)
        _RAMPS[n] = r
    return r


def _fill_padding(out: np.ndarray, pad: np.ndarray, value: int) -> None:
    """``value`` over the last ``pad[r]`` tokens of each row ``r``."""
    L = out.shape[1]
    padded = np.flatnonzero(pad)
    for r, n in zip(padded.tolist(), pad[padded].tolist(), strict=True):
        out[r, L - n :] = value


def document_outputs(
    seg: Segments,
    seq_len: int,
    tokens: np.ndarray,
    outputs: tuple[str, ...],
    alloc: Callable[[tuple[int, ...], np.dtype], np.ndarray],
    *,
    where: str = "batch",
    new_ok: bool = False,
) -> dict[str, np.ndarray | int]:
    """``outputs`` (names from ``DOC_OUTPUTS``) of a batch whose rows are ``tokens``;
    ``alloc(shape, dtype)`` gives each output's buffer. ``new_ok``: an output computed
    into a new array may be returned as it is rather than copied into ``alloc``'s buffer
    (one pass over the batch fewer; for buffers that need not be pinned)."""
    B, L = len(seg.counts), seq_len
    # tokens each row's segments use: differences of the running total at row ends
    total = np.zeros(len(seg.lengths) + 1, dtype=np.int64)
    np.cumsum(seg.lengths, out=total[1:])
    row_end = np.cumsum(seg.counts)
    used = total[row_end] - total[row_end - seg.counts]
    pad = L - used
    if (pad < 0).any() or (seg.lengths <= 0).any():
        raise CorruptShardError(
            f"{where}: the document columns do not fit the rows (segments of "
            f"{int(used.max())} tokens in a row of {L}, or an empty segment)"
        )
    # every row's segments, then its padding as one more segment where it has any
    has_pad = pad > 0
    n_all = seg.counts + has_pad
    ends = np.cumsum(n_all)
    is_pad = np.zeros(int(ends[-1]) if B else 0, dtype=bool)
    is_pad[(ends - 1)[has_pad]] = True
    lengths = np.empty(len(is_pad), dtype=np.int64)
    lengths[~is_pad] = seg.lengths
    lengths[is_pad] = pad[has_pad]
    cu = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    starts = cu[:-1]
    out: dict[str, np.ndarray | int] = {}
    if "cu_seqlens" in outputs:  # small, and its length changes: not from the pools
        out["cu_seqlens"] = cu.astype(np.int32)
    if "max_seqlen" in outputs:
        out["max_seqlen"] = int(lengths.max()) if len(lengths) else 0
    pos = None
    if "position_ids" in outputs or "document_offsets" in outputs:
        # each segment's positions are the start of one ramp 0..L-1 (cache-resident):
        # joined straight into the buffer, one write pass and no batch-sized temporary
        pos = alloc((B, L), np.dtype(np.int64))
        ramp = _ramp(L)
        # (measured slower, interleaved A/B by CPU time: the ramp less a block-wise repeat of
        # each token's segment start, 0.93-0.95x; document_ids repeated block-wise into a
        # pooled buffer instead of one new array, 0.86-0.88x)
        np.concatenate([ramp[:n] for n in lengths.tolist()], out=pos.reshape(-1))
        if "position_ids" in outputs:
            out["position_ids"] = pos
    if "document_ids" in outputs:
        ids = np.full(len(lengths), -1, dtype=np.int64)
        ids[~is_pad] = seg.ids
        made = np.repeat(ids, lengths).reshape(B, L)
        if new_ok:
            out["document_ids"] = made
        else:
            out["document_ids"] = doc = alloc((B, L), np.dtype(np.int64))
            np.copyto(doc, made)
    if "labels" in outputs:
        labels = alloc((B, L), np.dtype(np.int64))
        np.copyto(labels, tokens, casting="unsafe")
        flat = labels.reshape(-1)
        flat[starts[~is_pad]] = IGNORE_INDEX
        _fill_padding(labels, pad, IGNORE_INDEX)
        out["labels"] = labels
    if "document_offsets" in outputs and pos is not None:
        first = np.zeros(len(lengths), dtype=np.int64)
        first[~is_pad] = seg.starts if seg.starts is not None else 0
        made = np.repeat(first, lengths).reshape(B, L)
        offs = made if new_ok else alloc((B, L), np.dtype(np.int64))
        np.add(pos, made, out=offs)
        _fill_padding(offs, pad, -1)
        out["document_offsets"] = offs
    return out
