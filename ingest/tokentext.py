"""What the tokenizer makes of a document's text: special tokens spelled out in it, and
texts it cannot take at all.

A document that spells ``<|endoftext|>`` would, by default in ``tokenizers``, get the EOS
id in its middle, and a model trained on it learns to stop there. With ``special_tokens=
"text"`` (ingest's default) such spellings are encoded as the ordinary text they are
(``Tokenizer.encode_special_tokens``); ``"special"`` keeps them as their control ids.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

__all__ = ["SPECIAL_TOKEN_MODES", "SpecialTokens", "unencodable"]

#: how a special token spelled in a document is encoded: as text, or as its control id
SPECIAL_TOKEN_MODES = ("text", "special")


class SpecialTokens:
    """A tokenizer's special tokens: set how their spellings in text encode, and find the
    documents that hold one."""

    def __init__(self, tokenizer: Any, mode: str) -> None:
        if mode not in SPECIAL_TOKEN_MODES:
            raise ValueError(f"special_tokens must be one of {SPECIAL_TOKEN_MODES}, got {mode!r}")
        self.mode = mode
        tokenizer.encode_special_tokens = mode == "text"
        names = sorted(
            {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special},
            key=lambda s: (-len(s), s),
        )
        self.names = tuple(n for n in names if n)
        self._pattern = re.compile("|".join(map(re.escape, self.names))) if self.names else None

    def documents_with(self, documents: Sequence[str]) -> int:
        """How many of ``documents`` spell at least one special token."""
        if self._pattern is None:
            return 0
        search = self._pattern.search
        return sum(1 for d in documents if search(d) is not None)


def unencodable(tokenizer: Any, documents: Sequence[Any]) -> dict[int, str]:
    """The positions of the documents the tokenizer refuses, each with why (one line)."""
    bad: dict[int, str] = {}
    for i, doc in enumerate(documents):
        try:
            tokenizer.encode(doc, add_special_tokens=False)
        except Exception as exc:  # the Rust side raises plain TypeError / Exception
            text = " ".join(str(exc).split())[:200]
            bad[i] = f"{type(exc).__name__}: {text}"
    return bad
