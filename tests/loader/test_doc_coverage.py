"""Per-document coverage from the ledger: ``drop_last=True`` (the default) drops whole packed
rows, and with them pieces of documents; ``drop_last=False`` delivers every document whole.
The ledger's and ``check_mixture``'s coverage is checked against the delivered
``document_ids`` output, token by token."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from flashfeed.dataset import Dataset
from flashfeed.loader import TokenLoader
from flashfeed.loader.telemetry.doccoverage import document_coverage, token_documents
from flashfeed.loader.telemetry.ledger import check_exactly_once, key_hash
from flashfeed.loader.telemetry.mixledger import check_mixture

from support.token_docs import byte_bpe, make_doc_token_dataset, mixed_documents

SEQ = 32


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[str], int]:
    root = tmp_path_factory.mktemp("cov")
    docs = mixed_documents(90, seed=5)
    tok = byte_bpe(root / "tok.json", docs)
    prefix = str(root / "ds")
    manifest = make_doc_token_dataset(prefix, docs, tok, seq_len=SEQ, docs_per_shard=30)
    rows = manifest.num_samples
    batch = next(b for b in (7, 6, 5, 9, 11) if rows % b)  # a last batch that is short
    return prefix, docs, batch


def _epoch(prefix: str, batch: int, ledger: Path, cache: Path, drop_last: bool) -> Counter[int]:
    """Tokens delivered per document id in one epoch (from the batches' document_ids)."""
    loader = TokenLoader(
        prefix, batch_size=batch, seed=3, drop_last=drop_last, device="cpu",
        outputs=("document_ids",), ledger_dir=str(ledger), cache_dir=str(cache),
    )  # fmt: skip
    got: Counter[int] = Counter()
    for b in loader:
        got.update(d for d in b["document_ids"].numpy().ravel().tolist() if d >= 0)
    return got


@pytest.mark.parametrize("drop_last", [True, False])
def test_ledger_reports_documents_whole_partial_missing(
    corpus: tuple[str, list[str], int], tmp_path: Path, drop_last: bool
) -> None:
    prefix, docs, batch = corpus
    ledger = tmp_path / "ledger"
    tokens = _epoch(prefix, batch, ledger, tmp_path / "cache", drop_last)
    documents = token_documents(prefix)
    assert len(documents) == Dataset.open(prefix).manifest.num_samples
    (check,) = check_exactly_once(str(ledger), list(documents), documents=documents).values()
    assert check.ok, str(check)
    cov = check.coverage
    assert cov is not None and cov.documents == len(docs)
    # the same numbers, token by token, from what the batches delivered
    length: Counter[int] = Counter()
    for segments in documents.values():
        for d, _, n in segments:
            length[d] += n
    whole = sum(1 for d, n in length.items() if tokens[d] == n)
    missing = sum(1 for d in length if tokens[d] == 0)
    assert (cov.whole, cov.missing, cov.partial) == (whole, missing, len(docs) - whole - missing)
    assert cov.tokens == sum(length.values()) and cov.tokens_delivered == sum(tokens.values())
    if drop_last:  # the short last batch's rows are gone, and pieces of documents with them
        assert check.dropped > 0 and not cov.complete and cov.partial + cov.missing > 0
        assert str(cov.partial_ids[0] if cov.partial_ids else cov.missing_ids[0]) in str(cov)
    else:  # every row once: every document whole
        assert check.dropped == 0 and cov.complete and cov.tokens_delivered == cov.tokens


def test_check_mixture_reports_coverage_per_source(corpus: tuple[str, list[str], int]) -> None:
    prefix, docs, _ = corpus
    documents = token_documents(prefix, prefix="web:")
    assert len({d for segs in documents.values() for d, _, _ in segs}) == len(docs)
    keys = list(documents)
    kept = keys[:-3]  # the last three rows never delivered
    checks = check_mixture({0: [key_hash(k) for k in kept]}, {"web": keys}, {"web": 1.0},
                           documents={"web": documents})[0]  # fmt: skip
    web = checks["web"]
    assert web.coverage is not None and web.missing == 3
    alone = document_coverage([key_hash(k) for k in kept], documents)
    assert web.coverage == alone and not alone.complete
    last = {d for d, _, _ in documents[keys[-1]]}
    assert last & (set(alone.partial_ids) | set(alone.missing_ids))
    assert "whole" in str(web)
    without = check_mixture({0: [key_hash(k) for k in kept]}, {"web": keys}, {"web": 1.0})[0]
    assert without["web"].coverage is None  # only when asked
