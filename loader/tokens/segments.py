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

All of them in one compiled pass per batch (``docrows.py``), written into buffers the
caller gives, so a pooled or pinned buffer is filled in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from flashfeed.errors import CorruptShardError

if TYPE_CHECKING:
    from flashfeed.dataset import Dataset

    from ..mixsource import MixtureDataset
    from .arrowcols import ArrowShardView

__all__ = [
    "DOC_OUTPUTS",
    "IGNORE_INDEX",
    "check_outputs",
    "check_shared_offsets",
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
