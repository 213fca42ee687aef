"""The in-place mixture journey: a Hugging Face-style Parquet corpus on S3 indexed in place
(the manifest under another prefix) mixed with a JSONL corpus ingested on Ray to an Arrow
dataset of documents on S3; the mixture file warmed on two nodes' caches, trained on 2
ranks, stopped after a few steps, resumed on 3 ranks from every rank's state. The ledger
and the delivered tokens prove it per source: the source read whole delivered once (but for
what the new split cannot share, named dropped), the other never twice, and every
delivered document decodes back to its source text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from flashfeed.cache import ShardCache
from flashfeed.cli.app import main as flashfeed
from flashfeed.dataset import Dataset
from flashfeed.loader import DOC_OUTPUTS, PackedLoader

from support.packed_mix import all_keys, documents_by_key, ingest_documents, proof, source_texts
from support.parquet_corpus import corpus_texts, write_parquet_corpus
from support.token_docs import byte_bpe

WEB = corpus_texts(150, seed=11)
BOOKS = ["book " + t for t in corpus_texts(96, seed=12)]
SEQ, BATCH, STEPS = 48, 3, 5


def test_inplace_and_ingested_mixture_warmed_trained_resumed_elsewhere(
    s3_prefix: str, tmp_path: Path, ray_session: None
) -> None:
    src, index = f"{s3_prefix}/hf-corpus", f"{s3_prefix}/index"
    write_parquet_corpus(src, {"text": WEB}, files=3, row_group_size=25)
    assert flashfeed(["index", src, "--manifest-prefix", index, "--no-progress"]) == 0
    books = ingest_documents(f"{s3_prefix}/raw", f"{s3_prefix}/books", BOOKS, per_shard=24)
    web = Dataset.open(index)
    mixture = tmp_path / "mix.json"  # the web corpus as a prefix, the books read whole
    mixture.write_text(json.dumps({
        "sources": [{"url": index, "weight": 1, "name": "web"},
                    {"url": books.url, "weight": 1, "name": "books"}],
        "until": "books"}))  # fmt: skip
    tok_path = byte_bpe(tmp_path / "tok.json", WEB + BOOKS)
    ledger = str(tmp_path / "ledger")
    kw: dict[str, Any] = dict(batch_size=BATCH, seq_len=SEQ, tokenizer=tok_path, seed=21,
                              column={"web": "text", "books": "txt"}, outputs=DOC_OUTPUTS,
                              drop_last=False, ledger_dir=ledger)  # fmt: skip
    caches = [str(tmp_path / f"node{n}") for n in range(2)]
    for node, cache in enumerate(caches):  # one rank per node, each node warms its share
        argv = ["cache", "warm", str(mixture), "--cache-dir", cache, "--node-rank", str(node),
                "--num-nodes", "2", "--seed", "21", "--no-progress"]  # fmt: skip
        assert flashfeed(argv) == 0
    batches, states = [], []
    for rank, cache in enumerate(caches):
        with ShardCache(cache) as sc:
            loader = PackedLoader(str(mixture), rank=rank, world_size=2, ranks_per_node=1,
                                  cache=sc, **kw)  # fmt: skip
            it = iter(loader)
            batches += [next(it) for _ in range(STEPS)]
            states.append(loader.state_dict())  # the checkpoint, gathered from every rank
            stats = loader.stats()["source"]["sources"]
            assert all(s["misses"] == 0 for s in stats.values()), stats  # all of it warmed
            it.close()
    assert len({s["deal"]["consumed"] for s in states}) == 2  # the ranks stopped apart
    for rank in range(3):  # three fresh nodes, cold caches: the first epoch streams
        with ShardCache(str(tmp_path / f"new{rank}")) as sc:
            loader = PackedLoader(str(mixture), rank=rank, world_size=3, ranks_per_node=1,
                                  cache=sc, **kw)  # fmt: skip
            loader.load_state_dict(states)
            batches += list(loader)
    keys = {"web": all_keys("web", web), "books": all_keys("books", books)}
    got = proof(ledger, keys)  # per source, from the ledger of delivered keys
    (n_web, web_twice, _), (n_books, books_twice, books_dropped) = got["web"], got["books"]
    assert web_twice == books_twice == 0, got
    assert n_books + books_dropped == len(BOOKS) and books_dropped < 3, got
    assert len(BOOKS) // 2 < n_web < len(WEB), got  # a prefix of the web corpus
    texts = {**source_texts("web", web, column="text"),
             **source_texts("books", books, column="txt")}  # fmt: skip
    delivered = documents_by_key(batches, Tokenizer.from_file(tok_path))
    assert len(delivered) == n_web + n_books
    assert {k: texts[k] for k in delivered} == delivered  # each decodes to its source text
