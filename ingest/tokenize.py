"""Tokenisation into Arrow token datasets whose rows keep their documents' boundaries.

Each document becomes its tokens plus EOS; ``packing.plan_packing`` places the documents in
rows of exactly ``seq_len`` tokens (``concat`` or ``best-fit``); each row records its
segments (``doc_lens``, ``doc_ids``, ``doc_starts``), so a reader never guesses boundaries
from EOS. Nothing is dropped: long documents are split (and the split recorded), a short
last row is padded (and the padding counted). docs/FORMAT.md has the layout.
"""

from __future__ import annotations

import array
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import pyarrow as pa

from .packing import PackOptions, PackPlan, plan_packing
from .tokentext import SpecialTokens, unencodable

__all__ = [
    "DOCUMENT_COLUMNS",
    "EOS_CANDIDATES",
    "PAD_CANDIDATES",
    "TOKEN_FEATURE",
    "TokenPacker",
    "load_tokenizer",
    "shared_packer",
    "text_field",
    "tokenizer_threads",
]

EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<eos>", "<|eos|>", "[SEP]", "<|end_of_text|>")
PAD_CANDIDATES = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")
#: the manifest's ``requires`` entry of a token dataset with document columns
TOKEN_FEATURE = "token-documents"
#: per row, one entry per segment: its length, its document, where in the document it starts
DOCUMENT_COLUMNS = {"doc_lens": pa.int32(), "doc_ids": pa.int64(), "doc_starts": pa.int64()}


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


def load_tokenizer(path: str) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` (no hub); one clear line if the
    file is missing, not JSON, or not a tokenizer."""
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as exc:  # the Rust side raises plain Exception with a long message
        why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot load tokenizer {path}: {why}") from None


_PARALLELISM = "TOKENIZERS_PARALLELISM"
#: the ``array`` type code of an unsigned 32-bit integer
_U32 = "I" if array.array("I").itemsize == 4 else "L"


@contextmanager
def tokenizer_threads(parallel: bool) -> Iterator[None]:
    """``tokenizers`` on every core (``parallel``) or on the calling thread alone, for the
    block: a Ray task holds one CPU, and a tokenizer that spreads over every core beside
    the other tasks costs more CPU for the same tokens. The variable is read at each call."""
    before = os.environ.get(_PARALLELISM)
    os.environ[_PARALLELISM] = "true" if parallel else "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_PARALLELISM, None)
        else:
            os.environ[_PARALLELISM] = before


#: characters of text per tokenizer call and thread: the call's encodings (a hundred bytes
#: or so per token) are read back while they are in the CPU's caches. One call over a shard
#: of 300-byte documents cost 12% more CPU than calls of this size, ids taken included.
CALL_CHARS = 1 << 16


def _parallel() -> bool:
    """Whether ``tokenizers`` may use every core now (its variable, read at each call)."""
    value = os.environ.get(_PARALLELISM, "true").strip().lower()
    return value not in ("", "false", "f", "off", "no", "n", "0")


def _batches(documents: list[str], chars: int) -> Iterator[list[str]]:
    """``documents`` in order, cut into runs of about ``chars`` characters."""
    start = total = 0
    for i, doc in enumerate(documents):
        total += len(doc)
        if total >= chars:
            yield documents[start : i + 1]
            start, total = i + 1, 0
    if start < len(documents):
        yield documents[start:]


#: packers loaded in this process, by file identity and options (see ``shared_packer``)
_PACKERS: dict[tuple[Any, ...], TokenPacker] = {}
_PACKERS_LOCK = threading.Lock()
_PACKERS_MAX = 4


def shared_packer(
    path: str,
    *,
    seq_len: int,
    eos_token: str | None = None,
    packing: str = "concat",
    window: int = 4096,
    special_tokens: str = "text",
) -> TokenPacker:
    """A ``TokenPacker`` loaded once per process: a Ray worker builds many shards, and a
    large vocabulary's ``tokenizer.json`` takes a tenth of a second to a second to load.
    Keyed by the file's size and modification time, so a changed file is loaded again."""
    try:
        st = os.stat(path)
        ident: Any = (st.st_size, st.st_mtime_ns, st.st_ino)
    except OSError:
        ident = None  # TokenPacker says why in one line
    key = (path, ident, seq_len, eos_token, packing, window, special_tokens)
    with _PACKERS_LOCK:
        packer = _PACKERS.get(key)
    if packer is not None:
        return packer
    packer = TokenPacker(
        path, seq_len=seq_len, eos_token=eos_token, packing=packing, window=window,
        special_tokens=special_tokens,
    )  # fmt: skip
    if ident is not None:
        with _PACKERS_LOCK:
            while len(_PACKERS) >= _PACKERS_MAX:
                _PACKERS.pop(next(iter(_PACKERS)))
            _PACKERS[key] = packer
    return packer


class TokenPacker:
    """Load a ``tokenizer.json`` and pack documents into fixed rows with their boundaries."""

    def __init__(
        self,
        path: str,
        *,
        seq_len: int,
        eos_token: str | None = None,
        packing: str = "concat",
        window: int = 4096,
        special_tokens: str = "text",
    ) -> None:
        if type(seq_len) is not int or seq_len <= 0:
            raise ValueError(f"seq_len must be > 0, got {seq_len!r}")
        self.options = PackOptions(seq_len=seq_len, mode=packing, window=window)
        self.tokenizer = load_tokenizer(path)
        # a special token spelled in a document is text ("text") or its control id ("special")
        self.specials = SpecialTokens(self.tokenizer, special_tokens)
        self.seq_len = seq_len
        self.eos_id = self._find(eos_token, path)
        pad = [self.tokenizer.token_to_id(n) for n in PAD_CANDIDATES]
        self.pad_id = next((int(p) for p in pad if p is not None), self.eos_id)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.dtype = np.uint16 if self.vocab_size <= 1 << 16 else np.uint32

    def _find(self, eos_token: str | None, path: str) -> int:
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

    @property
    def schema(self) -> dict[str, str]:
        """The manifest's schema of the tables ``pack`` makes."""
        return {
            "tokens": str(self.arrow_type),
            **{n: str(pa.list_(t)) for n, t in DOCUMENT_COLUMNS.items()},
        }

    def encode(self, documents: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(stream, lengths)``: every document's tokens and EOS, one after the other. The
        tokenizer is called on ``CALL_CHARS`` of text at a time (per thread it may use)."""
        flat = array.array(_U32)  # extend converts each list in C: no list of every token
        counts: list[int] = []
        threads = (os.cpu_count() or 1) if _parallel() else 1
        chars = CALL_CHARS * threads
        for batch in _batches(list(documents), chars):
            encoded = self.tokenizer.encode_batch_fast(batch, add_special_tokens=False)
            self._extend(encoded, flat, counts)
        return self._arrays(flat, counts)

    def _extend(self, encoded: Iterable[Any], flat: array.array, counts: list[int]) -> None:
        """Each encoding's ids, then EOS, onto ``flat``; its length onto ``counts``."""
        extend, append, eos = flat.extend, flat.append, self.eos_id
        for e in encoded:
            ids = e.ids
            extend(ids)
            append(eos)
            counts.append(len(ids))

    def _arrays(self, flat: array.array, counts: list[int]) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.array(counts, dtype=np.int64) + 1
        stream = np.frombuffer(flat, dtype=np.uint32)
        return (stream if self.dtype == np.uint32 else stream.astype(self.dtype)), lengths

    def pack(
        self,
        documents: Iterable[str],
        ids: Sequence[int] | None = None,
        *,
        on_skip: Callable[[int, str], None] | None = None,
    ) -> tuple[pa.Table, dict[str, Any]]:
        """``(table, stats)``: ``tokens`` rows and their segments. ``ids`` name the documents
        (default: their positions); empty documents are left out and counted. A document the
        tokenizer refuses goes to ``on_skip(id, why)`` (without it: a ``ValueError``)."""
        docs = list(documents)
        doc_ids = np.arange(len(docs)) if ids is None else np.asarray(ids, dtype=np.int64)
        if len(doc_ids) != len(docs):
            raise ValueError(f"{len(docs)} documents but {len(doc_ids)} ids")
        keep = [i for i, d in enumerate(docs) if d]
        empty = len(docs) - len(keep)
        try:
            stream, lengths = self.encode([docs[i] for i in keep])
        except Exception:  # one document the tokenizer refuses fails the whole batch
            taken = self._taken(docs, doc_ids, keep, on_skip)
            if taken is None:
                raise  # no document is refused alone: the failure is not the input's
            keep = taken
            stream, lengths = self.encode([docs[i] for i in keep])
        plan = plan_packing(lengths, self.options)
        table = self.table(stream, lengths, plan, doc_ids[keep])
        stats = {
            "documents": len(keep),
            "documents_empty": empty,
            "documents_split": plan.split_documents,
            "tokens": plan.tokens,
            "rows": plan.rows,
            "padding_tokens": plan.padding,
            "truncated_tokens": 0,
            "documents_with_special_tokens": self.specials.documents_with([docs[i] for i in keep]),
        }
        return table, stats

    def _taken(
        self,
        docs: list[str],
        doc_ids: np.ndarray,
        keep: list[int],
        on_skip: Callable[[int, str], None] | None,
    ) -> list[int] | None:
        """``keep`` without the documents the tokenizer refuses, each reported; None when
        it refuses none of them alone."""
        bad = unencodable(self.tokenizer, [docs[i] for i in keep])
        if not bad:
            return None
        for j, why in bad.items():
            if on_skip is None:
                raise ValueError(f"the tokenizer refuses document {int(doc_ids[keep[j]])}: {why}")
            on_skip(int(doc_ids[keep[j]]), why)
        return [i for j, i in enumerate(keep) if j not in bad]

    def table(
        self, stream: np.ndarray, lengths: np.ndarray, plan: PackPlan, ids: np.ndarray
    ) -> pa.Table:
        """Lay ``stream`` out as ``plan`` says: one gather, pad tokens after each row's last
        segment."""
        L = self.seq_len
        first = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        seg_first = np.concatenate([[0], np.cumsum(plan.length)[:-1]]).astype(np.int64)
        within = np.arange(plan.tokens, dtype=np.int64) - np.repeat(seg_first, plan.length)
        src = np.repeat(first[plan.doc] + plan.start, plan.length) + within
        dst = np.repeat(plan.row * L + plan.offset, plan.length) + within
        out = np.full(plan.rows * L, self.pad_id, dtype=self.dtype)
        out[dst] = stream[src]
        tokens = pa.FixedSizeListArray.from_arrays(pa.array(out), L)
        per_row = np.bincount(plan.row, minlength=plan.rows)
        offsets = pa.array(np.concatenate([[0], np.cumsum(per_row)]).astype(np.int32))
        values = {"doc_lens": plan.length, "doc_ids": ids[plan.doc], "doc_starts": plan.start}
        columns = {
            n: pa.ListArray.from_arrays(offsets, pa.array(values[n], type=t))
            for n, t in DOCUMENT_COLUMNS.items()
        }
        return pa.table({"tokens": tokens, **columns})
