"""The source-format registry: one table drives detection, the CLI, config and reading."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from flashfeed.ingest import IngestConfig
from flashfeed.ingest.cli import build_config, register
from flashfeed.ingest.config import SOURCE_FORMATS
from flashfeed.ingest.samplecorpus import make_imagefolder
from flashfeed.ingest.sources import (
    FORMATS,
    Item,
    Record,
    SourceScan,
    StorageContext,
    check_source_options,
    detect_format,
    open_reader,
    scan_source,
)
from flashfeed.ingest.sources.base import Mapper
from flashfeed.ingest.sources.format import FunctionReader, Listing, SourceOption, SourceReader


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser


def _args(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(["ingest", "SRC", "DEST", *argv])


def test_every_registered_format_is_a_choice_and_its_options_are_flags() -> None:
    assert ("auto", *FORMATS) == SOURCE_FORMATS
    for name, fmt in FORMATS.items():
        assert _args("--source-format", name).source_format == name
        for opt in fmt.options:
            for value in opt.choices:
                config = build_config(_args(f"--{name}-{opt.name}", value))
                expected = {} if value == opt.default else {name: {opt.name: value}}
                assert config.source_options == expected
    with pytest.raises(SystemExit):
        _args("--lmdb-decoder", "yaml")


def test_source_options_are_checked_by_their_format() -> None:
    assert check_source_options({"lmdb": {"decoder": "json"}}) == {"lmdb": {"decoder": "json"}}
    assert check_source_options({"lmdb": {"decoder": "raw"}}) == {}  # the default is no option
    for bad, words in [
        ({"tar": {}}, "no source format 'tar'"),
        ({"lmdb": {"codec": "json"}}, "no option 'codec'"),
        ({"csv": {"decoder": "json"}}, "format 'csv' has no option"),
        ({"lmdb": {"decoder": "yaml"}}, "lmdb_decoder must be one of"),
    ]:
        with pytest.raises(ValueError, match=words):
            IngestConfig(source="src", dest="dest", source_options=bad)
    with pytest.raises(ValueError, match="source_options must map"):
        IngestConfig(source="src", dest="dest", source_options={"lmdb": "json"})  # type: ignore[dict-item]
    same = [
        IngestConfig(source="s", dest="d", source_options=o).provenance()
        for o in ({}, {"lmdb": {"decoder": "raw"}})
    ]
    assert same[0] == same[1]


def test_detection_follows_the_registry_order(tmp_path: Path) -> None:
    ctx = StorageContext()
    make_imagefolder(tmp_path / "img", classes=2, per_class=1)
    assert detect_format(str(tmp_path / "img"), ctx) == "imagefolder"
    (tmp_path / "img" / "rows.csv").write_text("text\nhello\n")
    assert detect_format(str(tmp_path / "img"), ctx) == "csv"
    (tmp_path / "img" / "rows.jsonl").write_text('{"text": "hi"}\n')
    assert detect_format(str(tmp_path / "img"), ctx) == "jsonl"  # jsonl before csv
    (tmp_path / "img" / "a.tar").write_bytes(b"")
    assert detect_format(str(tmp_path / "img"), ctx) == "webdataset"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        detect_format(str(tmp_path / "nothing"), ctx)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.xyz").write_text("?")
    with pytest.raises(ValueError, match="cannot tell the format"):
        detect_format(str(tmp_path / "other"), ctx)


def test_lmdb_json_values_read_back_and_the_reader_closes(tmp_path: Path) -> None:
    import lmdb

    env = lmdb.open(str(tmp_path / "db"), map_size=1 << 24)
    rows = [{"txt": f"caption {i}", "cls": i, "meta": {"i": i}} for i in range(4)]
    with env.begin(write=True) as txn:
        for i, row in enumerate(rows):
            txn.put(f"k{i}".encode(), json.dumps(row).encode())
    env.close()
    ctx = StorageContext()
    url = str(tmp_path / "db")
    assert detect_format(url, ctx) == "lmdb"
    scan = scan_source(url, "auto", ctx, options={"lmdb": {"decoder": "json"}})
    assert scan.format == "lmdb" and scan.fields == {"cls": "int", "meta": "json", "txt": "text"}
    reader = open_reader(scan.format, scan.shared)
    try:
        got = [reader.read(item, ctx) for item in scan.items]
    finally:
        reader.close()
    assert got == [{**r, "meta": json.dumps(r["meta"])} for r in rows]
    reader.close()  # twice is harmless
    assert reader.read(scan.items[0], ctx)["txt"] == "caption 0"  # reopens after a close
    reader.close()
    raw = scan_source(url, "lmdb", ctx)
    assert raw.fields == {"bin": "bytes"}  # the default decoder: one raw field


class _LinesFormat:
    """A format written for this test: ``*.lines`` files, one text sample per line."""

    name = "lines"
    options = (SourceOption("case", ("keep", "upper"), "keep", "letter case"),)

    def detect(self, url: str, listing: Listing) -> bool:
        return listing.any_endswith((".lines",))

    def scan(
        self,
        url: str,
        ctx: StorageContext,
        *,
        fields: dict[str, str],
        options: dict[str, str],
        mapper: Mapper,
    ) -> SourceScan:
        lines = Path(url, "a.lines").read_text().splitlines()
        items = [Item(i, f"{url}:{i}", len(t), {"text": t}) for i, t in enumerate(lines)]
        return SourceScan("lines", items, {"txt": "text"}, shared={"case": options["case"]})

    def open_reader(self, shared: dict[str, Any]) -> SourceReader:
        def read(item: Item, ctx: StorageContext, cache: dict[str, Any]) -> Record:
            text = item.ref["text"]
            return {"txt": text.upper() if cache["shared"]["case"] == "upper" else text}

        return FunctionReader(read, shared)


def test_a_new_format_is_one_registry_entry(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setitem(FORMATS, "lines", _LinesFormat())
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.lines").write_text("one\ntwo\n")
    ctx = StorageContext()
    url = str(tmp_path / "src")
    assert detect_format(url, ctx) == "lines"
    config = build_config(_args("--lines-case", "upper"))
    assert config.source_options == {"lines": {"case": "upper"}}
    scan = scan_source(url, "auto", ctx, options=config.source_options)
    reader = open_reader(scan.format, scan.shared)
    assert [reader.read(it, ctx) for it in scan.items] == [{"txt": "ONE"}, {"txt": "TWO"}]
    reader.close()
