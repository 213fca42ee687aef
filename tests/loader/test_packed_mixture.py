"""``PackedLoader`` over a mixture of a Parquet corpus indexed in place and an ingested Arrow
dataset of documents: proved from the delivered keys, tokens and ledger."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from flashfeed import Mixture, Source
from flashfeed.dataset import Dataset
from flashfeed.format.inplaceindex import index_in_place
from flashfeed.loader import DOC_OUTPUTS, PackedLoader, TokenLoader

from support.loader_helpers import make_image_dataset, make_token_dataset
from support.packed_mix import all_keys, documents_by_key, ingest_documents, proof, source_texts
from support.parquet_corpus import corpus_texts, write_jsonl_corpus, write_parquet_corpus
from support.token_docs import byte_bpe

WEB = corpus_texts(120, seed=1)
BOOKS = ["book " + t for t in corpus_texts(90, seed=2)]
COLUMNS = {"web": "text", "books": "txt"}  # ingest writes a text column as field txt


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("mix")
    write_parquet_corpus(str(root / "web"), {"text": WEB}, files=3, row_group_size=20)
    index_in_place(str(root / "web"))
    books = ingest_documents(str(root / "raw"), str(root / "books"), BOOKS, per_shard=30)
    web = Dataset.open(str(root / "web"))
    return {
        "root": root,
        "tok": byte_bpe(root / "tok.json", WEB + BOOKS),
        "keys": {"web": all_keys("web", web), "books": all_keys("books", books)},
        "texts": {**source_texts("web", web, column="text"),
                  **source_texts("books", books, column="txt")},
    }  # fmt: skip


def _mix(root: Path, **kw: Any) -> Mixture:
    weights = kw.pop("weights", (120, 90))  # one pass of each source per epoch
    return Mixture(
        sources=(Source(str(root / "web"), weights[0], "web"),
                 Source(str(root / "books"), weights[1], "books")), **kw,
    )  # fmt: skip


def _kw(corpora: dict[str, Any], **more: Any) -> dict[str, Any]:
    base = dict(batch_size=2, seq_len=48, tokenizer=corpora["tok"], column=COLUMNS,
                outputs=DOC_OUTPUTS, drop_last=False, seed=3)  # fmt: skip
    return base | more


def test_each_document_of_each_source_once_and_whole(corpora: dict[str, Any], tmp_path: Path):
    ledger = str(tmp_path / "ledger")
    batches = []
    for rank in range(2):
        loader = PackedLoader(_mix(corpora["root"]), rank=rank, world_size=2,
                              **_kw(corpora, ledger_dir=ledger))  # fmt: skip
        batches += list(loader)
    assert proof(ledger, corpora["keys"]) == {"web": (120, 0, 0), "books": (90, 0, 0)}
    got = documents_by_key(batches, Tokenizer.from_file(corpora["tok"]))
    assert got == corpora["texts"]  # every document of both sources, each its own text
    ids: dict[str, set[int]] = {}  # document_ids: one per document, unique across sources
    for b in batches:
        docs = b["document_ids"].numpy()
        for r, row_keys in enumerate(b["__key__"]):
            row = docs[r][docs[r] >= 0]
            firsts = row[np.r_[True, row[1:] != row[:-1]]] if len(row) else row
            for key, d in zip(row_keys, firsts.tolist(), strict=True):
                ids.setdefault(key, set()).add(d)
    assert all(len(v) == 1 for v in ids.values())
    assert len({d for v in ids.values() for d in v}) == 210


def test_an_in_place_jsonl_source_beside_parquet_and_arrow(
    corpora: dict[str, Any], tmp_path: Path
) -> None:
    """A third source, JSONL indexed in place: a plain file cut in blocks of lines and a
    zstd file that is one unit. Each document of each source once and whole, and a resume
    on the same world size continues with the same batches."""
    notes = [f"note {i}: " + t[: 40 + i] for i, t in enumerate(corpus_texts(70, seed=5))]
    where = str(tmp_path / "notes")
    write_jsonl_corpus(where, [{"body": t} for t in notes[:50]], files=1)
    write_jsonl_corpus(str(tmp_path / "z"), [{"body": t} for t in notes[50:]], files=1,
                       codec="zstd")  # fmt: skip
    Path(tmp_path / "z" / "part-000.jsonl.zst").rename(Path(where) / "part-001.jsonl.zst")
    index_in_place(where, block_bytes=1024)
    ds = Dataset.open(where)
    assert ds.manifest.shard_format == "jsonl" and len(ds.shards) > 3
    assert sum(".zst#" in info.path for info in ds.shards) == 1  # not splittable: one unit
    root = corpora["root"]
    mix = Mixture(sources=(Source(str(root / "web"), 120, "web"),
                           Source(str(root / "books"), 90, "books"),
                           Source(where, 70, "notes")))  # fmt: skip
    keys = {**corpora["keys"], "notes": all_keys("notes", ds)}
    ledger = str(tmp_path / "ledger")
    kw = _kw(corpora, column={**COLUMNS, "notes": "body"}, ledger_dir=ledger)
    batches = []
    for rank in range(2):
        batches += list(PackedLoader(mix, rank=rank, world_size=2, **kw))
    assert proof(ledger, keys) == {"web": (120, 0, 0), "books": (90, 0, 0), "notes": (70, 0, 0)}
    got = documents_by_key(batches, Tokenizer.from_file(corpora["tok"]))
    want = {**corpora["texts"], **source_texts("notes", ds, column="body")}
    assert got == want and sorted(want.values()) == sorted(WEB + BOOKS + notes)

    kw = _kw(corpora, column={**COLUMNS, "notes": "body"})
    whole = list(PackedLoader(mix, rank=0, world_size=2, **kw))
    first = PackedLoader(mix, rank=0, world_size=2, **kw)
    it = iter(first)
    head = [next(it) for _ in range(7)]
    state = first.state_dict()
    it.close()
    again = PackedLoader(mix, rank=0, world_size=2, **kw)
    again.load_state_dict(state)
    rest = list(again)
    assert [b["__key__"] for b in head + rest] == [b["__key__"] for b in whole]
    assert all(
        torch.equal(a["tokens"], b["tokens"]) for a, b in zip(head + rest, whole, strict=True)
    )


def test_resume_on_the_same_world_size_gives_the_same_batches(corpora: dict[str, Any]) -> None:
    mix = _mix(corpora["root"])
    whole = list(PackedLoader(mix, rank=1, world_size=2, **_kw(corpora)))
    first = PackedLoader(mix, rank=1, world_size=2, **_kw(corpora))
    it = iter(first)
    head = [next(it) for _ in range(5)]
    while first.doc_offset == 0:  # stop inside a document
        head.append(next(it))
    state = first.state_dict()
    it.close()
    assert state["kind"] == "packed" and state["plan"] == "mixture" and state["doc_offset"] > 0
    again = PackedLoader(mix, rank=1, world_size=2, **_kw(corpora, decode_ahead=0))
    again.load_state_dict(state)
    rest = list(again)
    assert len(head) + len(rest) == len(whole)
    for a, b in zip(head + rest, whole, strict=True):
        assert a["__key__"] == b["__key__"]
        for name in ("tokens", "document_ids", "document_offsets", "cu_seqlens"):
            assert torch.equal(a[name], b[name]), name


def test_resume_on_another_world_size(corpora: dict[str, Any], tmp_path: Path) -> None:
    """2 ranks stop, 3 resume from every rank's state. The mixture's elastic rules: the
    source read whole (``until``) is read once, but for what the new split cannot share
    (named dropped); the other, read as a prefix, at most once; each document whole."""
    mix = _mix(corpora["root"], weights=(1, 1), until="books")
    ledger = str(tmp_path / "ledger")
    kw = _kw(corpora, ledger_dir=ledger)
    batches, states = [], []
    for rank in range(2):
        loader = PackedLoader(mix, rank=rank, world_size=2, **kw)
        it = iter(loader)
        batches += [next(it) for _ in range(5)]
        states.append(loader.state_dict())
        it.close()
    assert len({s["deal"]["consumed"] for s in states}) == 2  # the ranks stopped apart
    for rank in range(3):
        loader = PackedLoader(mix, rank=rank, world_size=3, **kw)
        loader.load_state_dict(states)
        batches += list(loader)
    got = proof(ledger, corpora["keys"])
    (web, web_twice, _), (books, books_twice, books_gone) = got["web"], got["books"]
    assert web_twice == books_twice == 0
    assert books + books_gone == 90 and books_gone < 3 and web > 60
    texts = documents_by_key(batches, Tokenizer.from_file(corpora["tok"]))
    assert len(texts) == web + books
    assert all(corpora["texts"][k] == t for k, t in texts.items())
    with pytest.raises(ValueError, match="every one of the 2 ranks"):
        PackedLoader(mix, rank=0, world_size=3, **kw).load_state_dict(states[:1] * 2)
    other = _mix(corpora["root"], weights=(2, 1), until="books")
    with pytest.raises(ValueError, match="under the mixture its state"):
        PackedLoader(other, rank=0, world_size=2, **kw).load_state_dict(states[0])


def test_sources_it_cannot_read_refused_in_one_line(
    corpora: dict[str, Any], tmp_path: Path
) -> None:
    root = corpora["root"]
    make_image_dataset(str(tmp_path / "images"), [4, 4])
    make_token_dataset(str(tmp_path / "rows"), [8])
    cases = {
        "images": (str(tmp_path / "images"), "holds webdataset shards: PackedLoader reads"),
        "rows": (str(tmp_path / "rows"), "holds rows of packed tokens"),
    }
    for name, (url, message) in cases.items():
        mix = Mixture(sources=(Source(str(root / "web"), 1, "web"), Source(url, 1, name)))
        with pytest.raises(ValueError, match=message) as err:
            PackedLoader(mix, **_kw(corpora, column={"web": "text", name: "tokens"}))
        assert "\n" not in str(err.value) and repr(name) in str(err.value)
    with pytest.raises(ValueError, match=r"source 'books' .* has no column 'text'") as err:
        PackedLoader(_mix(root), **_kw(corpora, column="text"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="names sources"):
        PackedLoader(_mix(root), **_kw(corpora, column={"web": "text"}))
    with pytest.raises(ValueError, match="differ in shard format"):  # other loaders: as before
        TokenLoader(_mix(root), batch_size=2)


def test_the_readme_example_runs(tmp_path: Path) -> None:
    """The README's in-place mixture example, as printed, in its own process."""
    import re
    import subprocess
    import sys

    readme = Path(__file__).resolve().parents[2] / "README.md"
    blocks = re.findall(r"```python\n(.*?)```", readme.read_text(), flags=re.S)
    block = [b for b in blocks if "PackedLoader(mix" in b]
    assert len(block) == 1
    script = tmp_path / "packed_mix_example.py"
    script.write_text(block[0])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["200", "100"]
