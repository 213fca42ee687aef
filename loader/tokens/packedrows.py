"""What a packed batch carries beside its tokens, from the segments of its rows, and the
tokenizer a text column is read with."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..image.text import load_tokenizer
from .segments import IGNORE_INDEX

__all__ = ["EOS_CANDIDATES", "batch_outputs", "tokenizer_eos"]

#: the tokens tried, in order, for the end of a document (as ingest tries them)
EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|eos|>", "[SEP]", "<|end_of_text|>")


def batch_outputs(
    tokens: np.ndarray,
    lengths: Sequence[int],
    docs: Sequence[int],
    offsets: Sequence[int],
    outputs: Sequence[str],
) -> dict[str, Any]:
    """The document outputs of a packed batch (``segments.py`` says what each one holds)
    from its segments, which lie back to back from its first token: segment ``k`` holds
    ``lengths[k]`` tokens of document ``docs[k]`` from its token ``offsets[k]``; the rest of
    the batch is padding (one sequence per row). Numpy steps per batch, none per segment."""
    B, L = tokens.shape
    n = np.asarray(lengths, np.int64)
    filled = int(n.sum())
    first = np.cumsum(n) - n  # each segment's first token in the flattened batch
    ramp = np.arange(filled, dtype=np.int64) - np.repeat(first, n)
    tail = B * L - filled  # padding: the rest of the last row begun, then whole rows
    part = (L - filled % L) % L
    pad_lens = ([part] if part else []) + [L] * ((tail - part) // L)
    pad_ramp = np.concatenate([np.arange(k, dtype=np.int64) for k in pad_lens] or [ramp[:0]])
    every: dict[str, Any] = {}
    if "position_ids" in outputs:
        every["position_ids"] = np.concatenate([ramp, pad_ramp]).reshape(B, L)
    if "document_ids" in outputs:
        got = np.full(B * L, -1, np.int64)
        got[:filled] = np.repeat(np.asarray(docs, np.int64), n)
        every["document_ids"] = got.reshape(B, L)
    if "document_offsets" in outputs:
        got = np.full(B * L, -1, np.int64)
        got[:filled] = np.repeat(np.asarray(offsets, np.int64), n) + ramp
        every["document_offsets"] = got.reshape(B, L)
    if "labels" in outputs:
        got = np.full(B * L, IGNORE_INDEX, np.int64)
        got[:filled] = tokens.reshape(-1)[:filled]
        got[first[n > 0]] = IGNORE_INDEX  # a sequence's first token predicts nothing
        every["labels"] = got.reshape(B, L)
    lens = np.concatenate([n, np.asarray(pad_lens, np.int64)])
    out: dict[str, Any] = {}
    for name in outputs:
        if name == "max_seqlen":
            out[name] = int(lens.max()) if len(lens) else 0
        elif name == "cu_seqlens":
            cu = np.zeros(len(lens) + 1, np.int32)
            np.cumsum(lens, out=cu[1:])
            out[name] = torch.from_numpy(cu)
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
