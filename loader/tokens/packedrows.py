"""What a packed batch carries beside its tokens, from the segments of its rows, and the
tokenizer a text column is read with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..image.text import load_tokenizer
from .segments import IGNORE_INDEX

__all__ = ["EOS_CANDIDATES", "Segment", "batch_outputs", "tokenizer_eos"]

#: the tokens tried, in order, for the end of a document (as ingest tries them)
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|eos|>", "[SEP]", "<|end_of_text|>")
#: a row's segment: (row, first column, length, document id, offset in the document)
Segment = tuple[int, int, int, int, int]


def batch_outputs(
    tokens: np.ndarray, segs: Sequence[Segment], outputs: Sequence[str]
) -> dict[str, Any]:
    """The document outputs of a packed batch from its segments (``segments.py`` says
    what each one holds)."""
    B, L = tokens.shape
    pos = np.zeros((B, L), np.int64)
    docs = np.full((B, L), -1, np.int64)
    offs = np.full((B, L), -1, np.int64)
    labels = np.full((B, L), IGNORE_INDEX, np.int64)
    lens: list[int] = []
    ends = np.zeros(B, np.int64)
    by_row: list[list[int]] = [[] for _ in range(B)]
    for row, col, n, doc, off in segs:
        ramp = np.arange(n, dtype=np.int64)
        pos[row, col : col + n] = ramp
        docs[row, col : col + n] = doc
        offs[row, col : col + n] = off + ramp
        labels[row, col + 1 : col + n] = tokens[row, col + 1 : col + n]
        by_row[row].append(n)
        ends[row] = col + n
    for row in range(B):
        lens.extend(by_row[row])
        pad = L - int(ends[row])
        if pad:
            pos[row, int(ends[row]) :] = np.arange(pad)
            lens.append(pad)
    out: dict[str, Any] = {}
    cu = np.zeros(len(lens) + 1, np.int32)
    np.cumsum(lens, out=cu[1:])
    every = {
        "position_ids": pos,
        "document_ids": docs,
        "labels": labels,
        "document_offsets": offs,
        "cu_seqlens": cu,
    }
    for name in outputs:
        if name == "max_seqlen":
            out[name] = int(max(lens)) if lens else 0
        else:
            out[name] = torch.from_numpy(every[name])
    return out


def tokenizer_eos(path: str | None, eos_token: str | None) -> tuple[str | None, int | None]:
    """A ``tokenizer.json``'s text and its EOS id (None, None without a tokenizer)."""
    if path is None:
        return None, None
    from tokenizers import Tokenizer

    text = load_tokenizer(path)  # a bad path: one line naming it
    tok = Tokenizer.from_str(text)
    names = (eos_token,) if eos_token else EOS_CANDIDATES
    for name in names:
        tid = tok.token_to_id(name)
        if tid is not None:
            return text, int(tid)
    raise ValueError(f"tokenizer {path} has no EOS token among {list(names)}; pass eos_token=")
