"""Tokenisation into Arrow token datasets: documents joined with EOS, packed into rows of
exactly ``seq_len`` tokens (the tail that does not fill a row is dropped and counted)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["EOS_CANDIDATES", "TokenPacker", "text_field"]

EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|eos|>", "[SEP]", "<|end_of_text|>")


def text_field(fields: dict[str, str]) -> str:
    """The field to tokenize: ``txt`` or ``text`` if present, else the only text field."""
    for name in ("txt", "text"):
        if fields.get(name) == "text":
            return name
    texts = [n for n, k in fields.items() if k == "text"]
    if len(texts) != 1:
        raise ValueError(
            f"tokenization needs one text field (txt); the source has {sorted(fields)}: "
            "map one with --field txt=COLUMN"
        )
    return texts[0]


class TokenPacker:
    """Load a ``tokenizer.json`` (no hub access) and pack documents into fixed rows."""

    def __init__(self, path: str, *, seq_len: int, eos_token: str | None = None) -> None:
        from tokenizers import Tokenizer

        if seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len}")
        try:
            self.tokenizer = Tokenizer.from_file(path)
        except Exception as exc:
            raise ValueError(f"cannot load tokenizer {path}: {exc}") from None
        self.seq_len = seq_len
        self.eos_id = self._eos(eos_token, path)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.dtype = np.uint16 if self.vocab_size <= 1 << 16 else np.uint32

    def _eos(self, eos_token: str | None, path: str) -> int:
        names = (eos_token,) if eos_token else EOS_CANDIDATES
        for name in names:
            tid = self.tokenizer.token_to_id(name)
            if tid is not None:
                return int(tid)
        raise ValueError(f"tokenizer {path} has no EOS token among {list(names)}; pass --eos-token")

    @property
    def arrow_type(self) -> pa.DataType:
        value = pa.uint16() if self.dtype == np.uint16 else pa.uint32()
        return pa.list_(value, self.seq_len)

    def pack(self, documents: Iterable[str]) -> tuple[pa.Table, dict[str, Any]]:
        """``(table, stats)``: one ``tokens`` column of fixed-size rows."""
        docs = list(documents)
        encoded = self.tokenizer.encode_batch(docs, add_special_tokens=False) if docs else []
        parts = []
        for enc in encoded:
            parts.append(np.asarray(enc.ids, dtype=np.int64))
            parts.append(np.asarray([self.eos_id], dtype=np.int64))
        stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        rows = len(stream) // self.seq_len
        used = stream[: rows * self.seq_len].astype(self.dtype)
        flat = pa.array(used, type=self.arrow_type.value_type)
        column = pa.FixedSizeListArray.from_arrays(flat, self.seq_len)
        table = pa.table({"tokens": column})
        stats = {
            "documents": len(docs),
            "tokens": len(stream),
            "tokens_dropped": int(len(stream) - rows * self.seq_len),
        }
        return table, stats
