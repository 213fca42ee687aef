"""Text corpora (``--source-format text``): JSONL, JSONL.gz, JSONL.zst and Parquet, split into
partitions (byte ranges, whole compressed files, row groups), locally and on the real S3
server with the session's real Ray; every bad record a counted skip with its reason."""

from __future__ import annotations

import gzip
import io
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from flashfeed import Dataset, storage
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.sources import StorageContext, detect_format, open_reader, scan_source
from flashfeed.ingest.sources.textparts import plan_ranges

pytestmark = pytest.mark.usefixtures("ray_session")


def _jsonl(docs: list[str], column: str = "text") -> bytes:
    return "".join(json.dumps({column: d, "n": i}) + "\n" for i, d in enumerate(docs)).encode()


def _parquet(docs: list[str], column: str = "text", row_group: int = 4) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({column: docs}), buf, row_group_size=row_group)
    return buf.getvalue()


def _docs(prefix: str, n: int) -> list[str]:
    return [f"{prefix} document {i} " + "word " * (i % 37) + "é✓" for i in range(n)]


def _put(url: str, name: str, data: bytes) -> None:
    storage.write_bytes(storage.join(url, name), data)


def _delivered(url: str) -> Counter[str]:
    return Counter(str(f["txt"]) for _, f in Dataset.open(url))


def test_every_kind_of_file_delivers_every_document_once(any_prefix: str) -> None:
    """Plain JSONL cut into many byte ranges, .gz and .zst whole, Parquet per row group;
    the text column chosen by name; the same on a local folder and on S3."""
    src = f"{any_prefix}/src"
    plain, gz, zst, par = _docs("plain", 60), _docs("gz", 25), _docs("zst", 25), _docs("pq", 18)
    _put(src, "a/plain.jsonl", _jsonl(plain, "content"))
    _put(src, "a/gz.jsonl.gz", gzip.compress(_jsonl(gz, "content")))
    _put(src, "b/zst.jsonl.zst", zstandard.ZstdCompressor().compress(_jsonl(zst, "content")))
    _put(src, "b/t.parquet", _parquet(par, "content"))
    result = run(
        IngestConfig(
            source=src,
            dest=f"{any_prefix}/ds",
            source_format="text",
            format="arrow",
            samples_per_shard=40,
            source_options={"text": {"column": "content", "part_bytes": "700"}},
            progress="none",
        )
    )
    m = result.manifest
    assert m.source["format"] == "text"
    assert m.source["kinds"] == ["gzip", "jsonl", "parquet", "zstd"]
    plain_bytes = len(_jsonl(plain, "content"))
    ranges = -(-plain_bytes // 700)
    assert ranges > 5
    assert m.source["partitions"] == ranges + 1 + 1 + 5  # 18 rows in row groups of 4
    assert _delivered(f"{any_prefix}/ds") == Counter(plain + gz + zst + par)
    assert m.skipped == {}


@pytest.mark.parametrize("part_bytes", [1, 7, 64, 333, 4096, 1 << 20])
def test_byte_ranges_read_every_line_exactly_once(tmp_path: Path, part_bytes: int) -> None:
    """Ranges may cut anywhere, lines longer than a range included."""
    docs = [("x" * (i * 53 % 700)) + f" {i}" for i in range(80)]
    (tmp_path / "c.jsonl").write_bytes(_jsonl(docs) + b"\n\n")
    ctx = StorageContext()
    scan = scan_source(
        str(tmp_path), "text", ctx, options={"text": {"part_bytes": str(part_bytes)}}
    )
    assert scan.description["partitions"] == len(
        plan_ranges("c.jsonl", (tmp_path / "c.jsonl").stat().st_size, part_bytes)
    )
    reader = open_reader(scan.format, scan.shared)
    got = [reader.read(it, ctx)["txt"] for it in scan.items]
    reader.close()
    assert got == docs  # source order, each once
    assert not scan.rejects


def _corrupt_row_group(data: bytes, group: int) -> bytes:
    """The Parquet file with the page header of one row group's column chunk overwritten."""
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    start = meta.row_group(group).column(0).data_page_offset
    return data[:start] + b"\xff" * 24 + data[start + 24 :]


def test_bad_records_are_counted_skips_with_their_reason(s3_prefix: str) -> None:
    good = _docs("ok", 10)
    lines = [
        json.dumps({"text": good[0]}).encode(),
        b'{"text": "broken \xff\xfe utf-8"}',
        json.dumps({"text": "   "}).encode(),
        json.dumps({"text": ""}).encode(),
        b"[1, 2, 3]",
        b'"just a string"',
        json.dumps({"body": "no text field"}).encode(),
        json.dumps({"text": 42}).encode(),
        b'{"text": "unterminated',
        json.dumps({"text": good[1]}).encode(),
    ]
    src = f"{s3_prefix}/src"
    _put(src, "mixed.jsonl", b"\n".join(lines) + b"\n")
    whole = gzip.compress(_jsonl(_docs("lost-gz", 50)))
    _put(src, "cut.jsonl.gz", whole[: len(whole) // 2])
    zwhole = zstandard.ZstdCompressor().compress(_jsonl(_docs("lost-zst", 50)))
    _put(src, "cut.jsonl.zst", zwhole[: len(zwhole) // 2])
    _put(src, "fine.jsonl.gz", gzip.compress(_jsonl(good[2:6])))
    _put(src, "garbage.parquet", b"PAR1 this is not parquet at all PAR1")
    par = _parquet(["bad-rg-" + d for d in good[:4]] + good[6:10], row_group=4)
    _put(src, "onebadgroup.parquet", _corrupt_row_group(par, 0))
    assert detect_format(src, StorageContext()) == "text"  # compressed JSONL is text
    result = run(
        IngestConfig(
            source=src,
            dest=f"{s3_prefix}/ds",
            source_format="text",
            format="arrow",
            progress="none",
        )
    )
    assert result.manifest.skipped == {
        "bad_json": 1,
        "corrupt_parquet": 2,
        "empty_text": 2,
        "invalid_utf8": 1,
        "missing_text": 2,
        "not_an_object": 2,
        "truncated_file": 2,
    }
    assert _delivered(f"{s3_prefix}/ds") == Counter(good)  # nothing of a damaged unit
    rejects = [
        json.loads(line)
        for line in storage.read_bytes(f"{s3_prefix}/ds/rejects.jsonl").decode().splitlines()
    ]
    by_reason = {(r["reason"], r["source"].rsplit("/", 1)[-1]) for r in rejects}
    assert ("truncated_file", "cut.jsonl.gz") in by_reason
    assert ("truncated_file", "cut.jsonl.zst") in by_reason
    assert ("corrupt_parquet", "garbage.parquet") in by_reason
    assert ("corrupt_parquet", "onebadgroup.parquet#rg0") in by_reason
    assert all(r["detail"] for r in rejects)


def test_a_100mb_document_is_skipped_without_holding_it(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    big = b'{"text": "' + b"a" * (100 << 20) + b'"}\n'
    with open(src / "big.jsonl", "wb") as f:
        f.write(_jsonl(["before"]) + big + _jsonl(["after"]))
    result = run(
        IngestConfig(
            source=str(src),
            dest=str(tmp_path / "ds"),
            source_format="text",
            format="arrow",
            progress="none",
        )
    )
    assert result.manifest.skipped == {"too_large": 1}
    assert _delivered(str(tmp_path / "ds")) == Counter(["before", "after"])
    # the limit is an option (it bounds the JSONL line as well as the text), checked when
    # the config is made
    scan = scan_source(
        str(src), "text", StorageContext(), options={"text": {"max_doc_bytes": "25"}}
    )
    assert [r.reason for r in scan.rejects] == ["too_large", "too_large"]  # big, "before"
    assert [it.size for it in scan.items] == [len("after")]
    with pytest.raises(ValueError, match="text_max_doc_bytes"):
        IngestConfig(source="s", dest="d", source_options={"text": {"max_doc_bytes": "0"}})
    with pytest.raises(ValueError, match="text_column"):
        IngestConfig(source="s", dest="d", source_options={"text": {"column": " "}})


def test_text_format_refuses_fields_and_an_empty_source(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("not a corpus file")
    ctx = StorageContext()
    with pytest.raises(ValueError, match="holds no text corpus files"):
        scan_source(str(tmp_path), "text", ctx)
    (tmp_path / "a.jsonl").write_bytes(_jsonl(["x"]))
    with pytest.raises(ValueError, match="--text-column"):
        scan_source(str(tmp_path), "text", ctx, fields={"txt": "body"})
