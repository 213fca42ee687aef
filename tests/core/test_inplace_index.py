"""``flashfeed index`` over Parquet and JSONL files: a manifest of their units, in place."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flashfeed import storage
from flashfeed.cli.app import main
from flashfeed.dataset import Dataset
from flashfeed.format.inplace import FileChangedError, InPlaceError, split_unit_path
from flashfeed.format.inplaceindex import index_in_place
from flashfeed.format.manifest import read_manifest
from flashfeed.verify import verify_dataset

from support.parquet_corpus import corpus_texts, write_jsonl_corpus, write_parquet_corpus


def _rows_of(ds: Dataset, shard: int) -> list[str]:
    """The text column of unit ``shard``, decoded from its bytes alone."""
    from flashfeed.format.inplace import parquet_metadata, read_row_group

    info = ds.shards[shard]
    url, _, entry = ds.in_place.location(info.path)
    md = parquet_metadata(entry.footer, source=url)
    data = ds.read_shard(shard)
    unit = split_unit_path(info.path)[1]
    return read_row_group(data, entry, unit, ["text"], metadata=md, name=url).column(0).to_pylist()


def test_parquet_folder_indexed_in_place(any_prefix: str) -> None:
    texts = corpus_texts(230)
    files = write_parquet_corpus(any_prefix, {"text": texts, "n": list(range(230))})
    before = sorted(storage.list_files(any_prefix))
    report = index_in_place(any_prefix)
    m = read_manifest(any_prefix)
    assert (m.shard_format, m.format_version, m.requires) == ("parquet", 3, ("in-place",))
    assert m.schema == {"text": "string", "n": "int64"}
    # the units are the files' row groups: rows and byte ranges from the footers
    expected = []
    for f in files:
        md = pq.read_metadata(pa.BufferReader(storage.read_bytes(storage.join(any_prefix, f))))
        expected += [(f"{f}#{g}", md.row_group(g).num_rows) for g in range(md.num_row_groups)]
    assert [(s.path, s.samples) for s in m.shards] == expected
    assert m.num_samples == 230 and report.files == 3
    # nothing beside the data was rewritten: the same files plus the manifest's three
    after = sorted(storage.list_files(any_prefix))
    assert set(before) <= set(after) and len(after) == len(before) + 3
    ds = Dataset.open(any_prefix)
    assert [t for i in range(ds.num_shards) for t in _rows_of(ds, i)] == texts
    rows = list(ds)  # every unit's rows, in file and row group order
    assert [r["text"] for _, r in rows] == texts and rows[0][0] == f"{files[0]}#0/0"
    if not storage.is_local(any_prefix):  # object stores: each file's ETag recorded
        assert all(ds.in_place.etags[f] for f in files)


def test_manifest_under_another_prefix(s3_prefix: str, tmp_path: Path) -> None:
    texts = corpus_texts(90)
    write_parquet_corpus(s3_prefix, {"text": texts}, files=2, compression="snappy")
    dest = str(tmp_path / "index")
    assert main(["index", s3_prefix, "--manifest-prefix", dest, "--no-progress"]) == 0
    assert not storage.exists(storage.join(s3_prefix, "manifest.json"))
    ds = Dataset.open(dest)
    assert ds.manifest.source["root"] == s3_prefix
    assert ds.shard_url(0).startswith(s3_prefix)
    assert [t for i in range(ds.num_shards) for t in _rows_of(ds, i)] == texts


def test_jsonl_blocks_and_compressed_units(tmp_path: Path) -> None:
    rows = [{"text": t, "id": i} for i, t in enumerate(corpus_texts(300))]
    plain, gz, zst = (str(tmp_path / n) for n in ("plain", "gz", "zst"))
    write_jsonl_corpus(plain, rows, files=2)
    write_jsonl_corpus(gz, rows, files=2, codec="gzip")
    write_jsonl_corpus(zst, rows, files=3, codec="zstd")
    m = index_in_place(plain, block_bytes=4096).manifest
    assert m.shard_format == "jsonl" and m.schema == {"id": "json", "text": "json"}
    assert m.num_samples == 300 and m.num_shards > 4  # split at line ends, about 4 KiB each
    ds = Dataset.open(plain)
    lines = [ln for i in range(ds.num_shards) for ln in ds.read_shard(i).splitlines()]
    assert [json.loads(ln) for ln in lines] == rows  # every block is whole lines
    for prefix, files in ((gz, 2), (zst, 3)):  # a compressed file cannot be split
        m = index_in_place(prefix).manifest
        assert m.num_shards == files and m.num_samples == 300
        assert all(s.path.endswith("#0") for s in m.shards)
        assert [r for _, r in Dataset.open(prefix)] == rows  # decompressed, line by line


def test_versions_and_changed_file_refused(tmp_path: Path) -> None:
    prefix = str(tmp_path / "c")
    write_parquet_corpus(prefix, {"text": corpus_texts(100)}, files=2)
    first = index_in_place(prefix).manifest.digest
    ds = Dataset.open(prefix)
    assert verify_dataset(ds).ok
    # the file is replaced after indexing: its units are refused on read, in one line
    write_parquet_corpus(prefix, {"text": corpus_texts(100, seed=1)}, files=2)
    with pytest.raises(FileChangedError, match=r"changed after it was indexed.*flashfeed index"):
        ds.read_shard(0)
    report = verify_dataset(ds)  # `flashfeed verify` names every unit of the changed files
    assert len(report.problems) == ds.num_shards
    assert all("changed after it was indexed" in p.reason for p in report.problems)
    # indexing again makes a new version
    assert index_in_place(prefix, overwrite=True).manifest.digest != first


def test_cli_index_parquet_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = str(tmp_path / "c")
    write_parquet_corpus(prefix, {"text": corpus_texts(50)}, files=2, row_group_size=10)
    assert main(["index", prefix, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "indexed 2 parquet files in place: 6 units, 50 rows" in out
    assert main(["index", prefix, "--no-progress"]) == 1  # committed: refused, one line
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "already holds" in err


# --- bad input: one clear line, nothing written ------------------------------------------


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main([*argv, "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_corrupt_footer_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = tmp_path / "c"
    files = write_parquet_corpus(str(prefix), {"text": corpus_texts(60)}, files=2)
    bad = prefix / files[1]
    data = bytearray(bad.read_bytes())
    flen = int.from_bytes(data[-8:-4], "little")
    data[-8 - flen : -8 - flen + 40] = b"\xff" * 40  # the footer's Thrift is garbage now
    bad.write_bytes(bytes(data))
    err = _one_line(capsys, ["index", str(prefix)])
    assert files[1] in err and "corrupt Parquet footer" in err
    assert not (prefix / "manifest.json").exists()
    bad.write_bytes(b"PAR1 not parquet at all")
    assert "not a Parquet file" in _one_line(capsys, ["index", str(prefix)])


def test_schema_differs_between_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prefix = str(tmp_path / "c")
    write_parquet_corpus(prefix, {"text": corpus_texts(40)}, files=1)
    other = pa.table({"text": [1, 2, 3]})
    pq.write_table(other, str(tmp_path / "c" / "data" / "train-zz.parquet"))
    err = _one_line(capsys, ["index", prefix])
    assert "differ in schema" in err and "'text'" in err and "train-zz.parquet" in err
    with pytest.raises(InPlaceError, match="differ in schema"):
        index_in_place(prefix)


def test_unreadable_compressed_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "a.jsonl.gz").write_bytes(gzip.compress(b'{"text": "x"}\n')[:-6])
    assert "not a readable gzip stream" in _one_line(capsys, ["index", str(tmp_path / "j")])
