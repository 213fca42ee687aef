"""Per-document coverage of a token dataset from delivered row keys.

A token dataset's row holds pieces (segments) of documents; its ``doc_ids``, ``doc_starts``
and ``doc_lens`` columns say which. ``drop_last`` drops whole rows, and with them pieces of
documents. Given the ledger's delivered keys, ``document_coverage`` says per epoch how many
documents arrived whole (every piece), partly, or not at all; ``check_exactly_once`` and
``check_mixture`` report it when given ``documents=`` (``token_documents``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from flashfeed import storage
from flashfeed.dataset import Dataset
from flashfeed.format.arrowshard import open_arrow

from .ledger import key_hash

__all__ = ["DocumentCoverage", "TokenDocuments", "document_coverage", "token_documents"]

#: row key (``<shard>/<row>``) -> its segments ``(doc_id, doc_start, doc_len)``
TokenDocuments = Mapping[str, list[tuple[int, int, int]]]


@dataclass(frozen=True)
class DocumentCoverage:
    """Documents of a token dataset in one epoch: whole, partial (some pieces missing),
    missing (no piece delivered); a few ids of each incomplete kind."""

    documents: int
    whole: int
    partial: int
    missing: int
    tokens: int  # tokens of all documents
    tokens_delivered: int  # of those, in delivered pieces (each piece counted once)
    partial_ids: tuple[int, ...] = ()
    missing_ids: tuple[int, ...] = ()

    @property
    def complete(self) -> bool:
        return self.whole == self.documents

    def __str__(self) -> str:
        text = (
            f"{self.documents} documents: {self.whole} whole, {self.partial} partial, "
            f"{self.missing} missing; {self.tokens_delivered} of {self.tokens} tokens"
        )
        if self.partial_ids:
            text += f"; partial e.g. {list(self.partial_ids)}"
        if self.missing_ids:
            text += f"; missing e.g. {list(self.missing_ids)}"
        return text


def token_documents(
    url: str, *, storage_options: dict[str, Any] | None = None, prefix: str = ""
) -> dict[str, list[tuple[int, int, int]]]:
    """Every row key of a token dataset with its segments, read from its shards' document
    columns. ``prefix`` goes before each key (``"<source>:"`` for a mixture source). Keys
    are ``<shard>/<row number>`` as ``TokenLoader`` delivers them for shards without a
    ``__key__`` column (ingest writes none), else ``<shard>/<__key__>``."""
    ds = Dataset.open(url, storage_options=storage_options)
    out: dict[str, list[tuple[int, int, int]]] = {}
    for i, info in enumerate(ds.shards):
        data = storage.read_bytes(ds.shard_url(i), storage_options=storage_options)
        table = open_arrow(data, name=info.path)
        missing = {"doc_ids", "doc_starts", "doc_lens"} - set(table.column_names)
        if missing:
            raise ValueError(f"{info.path} has no document columns {sorted(missing)}")
        keys = (
            [str(k) for k in table.column("__key__").to_pylist()]
            if "__key__" in table.column_names
            else [str(r) for r in range(table.num_rows)]
        )
        ids = table.column("doc_ids").to_pylist()
        starts = table.column("doc_starts").to_pylist()
        lens = table.column("doc_lens").to_pylist()
        for k, d, s, n in zip(keys, ids, starts, lens, strict=True):
            out[f"{prefix}{info.path}/{k}"] = list(zip(d, s, n, strict=True))
    return out


def document_coverage(delivered: Iterable[str], documents: TokenDocuments) -> DocumentCoverage:
    """Coverage of ``documents`` by the ``delivered`` key hashes (``key_hash`` of row keys,
    as the ledger records them) of one epoch."""
    seen = Counter(delivered)
    total: Counter[int] = Counter()
    got: Counter[int] = Counter()
    pieces: Counter[int] = Counter()
    got_pieces: Counter[int] = Counter()
    for key, segments in documents.items():
        hit = key_hash(key) in seen
        for doc, _, n in segments:
            total[doc] += n
            pieces[doc] += 1
            if hit:
                got[doc] += n
                got_pieces[doc] += 1
    whole = [d for d in pieces if got_pieces[d] == pieces[d]]
    partial = sorted(d for d in pieces if 0 < got_pieces[d] < pieces[d])
    missing = sorted(d for d in pieces if got_pieces[d] == 0)
    return DocumentCoverage(
        documents=len(pieces),
        whole=len(whole),
        partial=len(partial),
        missing=len(missing),
        tokens=sum(total.values()),
        tokens_delivered=sum(got.values()),
        partial_ids=tuple(partial[:5]),
        missing_ids=tuple(missing[:5]),
    )
