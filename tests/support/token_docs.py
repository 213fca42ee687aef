"""Token datasets of real text: a byte-level BPE trained in the test (decodes back to the
exact text, no hub), a corpus with a realistic length mix, and a dataset packed from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flashfeed import storage
from flashfeed.format.arrowshard import write_arrow
from flashfeed.format.manifest import Manifest, ShardInfo, commit_manifest
from flashfeed.ingest.tokenize import TOKEN_FEATURE, TokenPacker
from flashfeed.shardio import shard_name

__all__ = ["byte_bpe", "make_doc_token_dataset", "mixed_documents"]

_WORDS = [
    *[
        "the",
        "of",
        "and",
        "to",
        "in",
        "data",
        "loader",
        "shard",
        "token",
        "batch",
        "epoch",
        "résumé",
        "naïve",
        "東京",
        "données",
    ],
    *[
        "attention,",
        "kernel;",
        "model:",
        "(packed)",
        '"quoted"',
        "it's",
        "42",
        "3.14",
        "e-mail\t",
        "tab",
    ],
]


def mixed_documents(
    n: int, *, seed: int = 0, long_every: int = 9, long_words: int = 300
) -> list[str]:
    """``n`` documents, most a few to a few dozen words, every ``long_every``-th one long
    (``long_words``), with punctuation, non-ASCII text, newlines and repeated spaces."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        words = long_words if i % long_every == long_every - 1 else int(rng.integers(1, 40))
        picked = rng.choice(_WORDS, words)
        seps = rng.choice([" ", " ", " ", "\n", "  ", ". "], words)
        docs.append("".join(w + s for w, s in zip(picked, seps, strict=True)).strip() or "x")
    return docs


def byte_bpe(path: Path, texts: list[str], *, vocab: int = 400) -> str:
    """A byte-level BPE ``tokenizer.json`` with ``<|endoftext|>`` and ``<pad>``: decoding
    its ids gives the exact text back."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<|endoftext|>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    tok.save(str(path))
    return str(path)


def make_doc_token_dataset(
    prefix: str,
    docs: list[str],
    tokenizer: str,
    *,
    seq_len: int,
    packing: str = "concat",
    docs_per_shard: int = 50,
    chunk_rows: int = 8192,
    layout: bool = True,
) -> Manifest:
    """Shards packed by ``TokenPacker`` straight from ``docs`` (document ``i`` has id ``i``),
    record batches of ``chunk_rows`` (their layout recorded unless ``layout=False``),
    committed as ingest commits them (format version 3)."""
    packer = TokenPacker(tokenizer, seq_len=seq_len, packing=packing)
    infos = []
    for n, first in enumerate(range(0, len(docs), docs_per_shard)):
        part = docs[first : first + docs_per_shard]
        table, _ = packer.pack(part, list(range(first, first + len(part))))
        if layout:
            data = write_arrow(table, max_chunksize=chunk_rows)
        else:
            data = write_arrow(table, max_chunksize=chunk_rows, batch_bytes=None)
        path = shard_name(n, "arrow")
        storage.write_bytes(storage.join(prefix, path), data)
        infos.append(ShardInfo(path, table.num_rows, len(data), storage.checksum(data)))
    manifest = Manifest(
        name="doc-tokens",
        shard_format="arrow",
        schema=packer.schema,
        shards=tuple(infos),
        extra={"tokens": {"seq_len": seq_len, "eos_id": packer.eos_id, "pad_id": packer.pad_id}},
        requires=(TOKEN_FEATURE,),
    )
    commit_manifest(prefix, manifest)
    return manifest


def ingested_pieces(url: str) -> dict[int, dict[int, list[int]]]:
    """The pieces of every document of an ingested token dataset, read from its shards'
    segment columns: document id -> {token the piece starts at: its tokens}; fails on a
    piece placed twice."""
    import pyarrow as pa

    from flashfeed.dataset import Dataset

    ds = Dataset.open(url)
    pieces: dict[int, dict[int, list[int]]] = {}
    for i in range(len(ds.shards)):
        table = pa.ipc.open_file(pa.BufferReader(storage.read_bytes(ds.shard_url(i)))).read_all()
        for row, lens, ids, starts in zip(
            table["tokens"].to_pylist(), table["doc_lens"].to_pylist(),
            table["doc_ids"].to_pylist(), table["doc_starts"].to_pylist(), strict=True,
        ):  # fmt: skip
            at = 0
            for n, d, s in zip(lens, ids, starts, strict=True):
                assert s not in pieces.setdefault(d, {}), f"document {d}: token {s} twice"
                pieces[d][s] = row[at : at + n]
                at += n
    return pieces
