"""A generated corpus of bad inputs, each with the outcome flashfeed promises for it.

``TAR_CASES``: tar shards for the shard readers (``iter_samples``/``scan_index``): each is
refused with a ``FlashfeedError`` whose message holds ``expect``. ``MEDIA_CASES``: files an
ingest with ``validate=True`` skips and counts under ``reason``. ``MANIFEST_EDITS``:
hand edits of a committed manifest, each refused naming what is wrong (``HEADER_EDITS``:
those that apply to a version-2 header too). ``TABLE_CASES``: bad version-2 shard tables
(and bad header records of them), each refused naming the file and the field.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from PIL import Image

__all__ = [
    "HEADER_EDITS",
    "MANIFEST_EDITS",
    "MEDIA_CASES",
    "TABLE_CASES",
    "TAR_CASES",
    "BadInput",
    "TableCase",
    "png_bomb",
    "tar_of",
]


@dataclass(frozen=True)
class BadInput:
    name: str
    data: bytes
    expect: str  # substring of the error message, or the skip reason


def _info(name: str | bytes, size: int = 0, **kw: Any) -> tarfile.TarInfo:
    info = tarfile.TarInfo(
        name if isinstance(name, str) else name.decode("utf-8", "surrogateescape")
    )
    info.size = size
    for k, v in kw.items():
        setattr(info, k, v)
    return info


def tar_of(
    members: list[tuple[tarfile.TarInfo, bytes | None]], *, fmt: int = tarfile.GNU_FORMAT
) -> bytes:
    """A tar holding exactly these members (names kept as given, even hostile ones)."""
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _good(key: str, data: bytes = b"payload") -> tuple[tarfile.TarInfo, bytes]:
    return _info(f"{key}.bin", len(data)), data


def _giant_size() -> bytes:
    """A header declaring a 64 GiB member in a tar of a few blocks."""
    blob = bytearray(tar_of([_good("a", b"x" * 600)]))
    info = _info("a.bin", 64 << 30)
    header = info.tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    blob[: len(header)] = header
    return bytes(blob)


def _tar_cases() -> list[BadInput]:
    ok = tar_of([_good("k0"), _good("k1")])
    return [
        BadInput(
            "absolute_path", tar_of([_good("k0"), (_info("/etc/passwd.bin", 0), b"")]), "absolute"
        ),
        BadInput("dotdot", tar_of([(_info("../up/x.bin", 1), b"x")]), "'..'"),
        BadInput(
            "symlink",
            tar_of([(_info("l.bin", type=tarfile.SYMTYPE, linkname="/etc/shadow"), None)]),
            "link",
        ),
        BadInput(
            "hardlink",
            tar_of([_good("k0"), (_info("h.bin", type=tarfile.LNKTYPE, linkname="k0.bin"), None)]),
            "link",
        ),
        BadInput(
            "char_device",
            tar_of([(_info("d.bin", type=tarfile.CHRTYPE, devmajor=1, devminor=3), None)]),
            "device",
        ),
        BadInput("fifo", tar_of([(_info("f.bin", type=tarfile.FIFOTYPE), None)]), "device"),
        BadInput("giant_declared_size", _giant_size(), "truncated"),
        BadInput(
            "non_utf8_name",
            tar_of([(_info(b"caf\xe9.bin", 1), b"x")], fmt=tarfile.GNU_FORMAT),
            "not UTF-8",
        ),
        BadInput("duplicate_key", tar_of([_good("k0"), _good("k1"), _good("k0")]), "twice"),
        BadInput(
            "duplicate_member",
            tar_of([_good("k0"), _good("k0")]),
            "two 'bin' members",
        ),
        BadInput("truncated_mid_member", ok[: 512 + 3], "truncated"),
        BadInput("truncated_after_member", ok[:1024], "end-of-archive"),
        BadInput("zero_bytes", b"", "tar"),
        BadInput("garbage", bytes(range(256)) * 8, "tar"),
    ]


def png_bomb(side: int = 50_000) -> bytes:
    """A PNG header declaring ``side`` x ``side`` pixels: gigabytes once decoded."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    raw = zlib.compress(b"\0" * (side + 1) * 4, 9)  # a few rows; the rest is promised
    idat = b"IDAT" + raw

    def chunk(body: bytes) -> bytes:
        return struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))

    return b"\x89PNG\r\n\x1a\n" + chunk(ihdr) + chunk(idat) + chunk(b"IEND")


def _image(fmt: str) -> bytes:
    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(buf, format=fmt)
    return buf.getvalue()


def _flip_middle(data: bytes) -> bytes:
    b = bytearray(data)
    for i in range(len(b) // 3, len(b) // 3 + 64):
        b[i] = 0xFF ^ b[i]
    return bytes(b)


def _media_cases() -> list[BadInput]:
    jpg, png, webp = _image("JPEG"), _image("PNG"), _image("WEBP")
    return [
        BadInput("jpeg_cut", jpg[: len(jpg) // 2], "undecodable"),
        BadInput("jpeg_not_an_image", b"\xff\xd8\xff\xe0" + b"JFIF" * 50, "undecodable"),
        BadInput("png_bad_crc", _flip_middle(png), "undecodable"),
        BadInput("png_cut", png[:60], "undecodable"),
        BadInput("webp_cut", webp[: len(webp) // 2], "undecodable"),
        BadInput("webp_header_only", webp[:16], "undecodable"),
        BadInput("png_bomb", png_bomb(), "too_many_pixels"),
    ]


Edit = Callable[[dict[str, Any]], None]


def _set(path: tuple[Any, ...], value: Any) -> Edit:
    def edit(d: dict[str, Any]) -> None:
        node: Any = d
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value

    return edit


#: (name, edit of the manifest dict, substring of the error)
MANIFEST_EDITS: list[tuple[str, Edit, str]] = [
    ("sample_count_raised", _set(("totals", "samples"), 10**6), "totals.samples"),
    ("shard_count_wrong", _set(("totals", "shards"), 99), "totals.shards"),
    ("shard_path_escapes", _set(("shards", 0, "path"), "../../etc/passwd"), "escapes"),
    ("shard_path_absolute", _set(("shards", 0, "path"), "/etc/passwd"), "escapes"),
    ("shard_path_url", _set(("shards", 0, "path"), "s3://other/x.tar"), "escapes"),
    ("index_path_escapes", _set(("shards", 0, "index"), "../x.idx"), "escapes"),
    ("unknown_version", _set(("format_version",), 4), "version 4"),
    ("version_as_text", _set(("format_version",), "1"), "version '1'"),
    ("negative_samples", _set(("shards", 0, "samples"), -1), "samples"),
    ("checksum_scheme", _set(("shards", 0, "checksum"), "md5:00"), "checksum"),
    ("classes_not_a_list", _set(("classes",), 7), "classes"),
    ("name_not_text", _set(("name",), {"a": 1}), "'name'"),
]

#: the edits above that do not touch the inline shard list (a version-2 header has none)
_HEADER_ONLY = (
    "sample_count_raised", "shard_count_wrong", "unknown_version", "version_as_text",
    "classes_not_a_list", "name_not_text",
)  # fmt: skip
HEADER_EDITS = [e for e in MANIFEST_EDITS if e[0] in _HEADER_ONLY]


def _ipc(table: pa.Table, *, stream: bool = False) -> bytes:
    sink = pa.BufferOutputStream()
    opener = pa.ipc.new_stream if stream else pa.ipc.new_file
    with opener(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


TableEdit = Callable[[pa.Table, bytes], bytes]


def _column(name: str, values: Callable[[pa.Table], pa.Array]) -> TableEdit:
    def edit(table: pa.Table, _: bytes) -> bytes:
        return _ipc(table.set_column(table.schema.get_field_index(name), name, values(table)))

    return edit


def _first_row(name: str, value: Any, kind: pa.DataType) -> TableEdit:
    return _column(name, lambda t: pa.array([value, *t.column(name).to_pylist()[1:]], kind))


def _drop(name: str) -> TableEdit:
    return lambda table, _: _ipc(table.drop_columns([name]))


def _same(_: pa.Table, data: bytes) -> bytes:
    return data


def _flip(data: bytes) -> bytes:
    b = bytearray(data)
    b[len(b) // 2] ^= 0xFF
    return bytes(b)


@dataclass(frozen=True)
class TableCase:
    """A bad shard table: ``edit`` turns the good table (and its file bytes) into the bad
    file; ``header`` edits the header's ``shard_table`` record; ``sync`` makes the header's
    size and checksum match the bad file, so the check under test is the one that fires."""

    name: str
    edit: TableEdit
    expect: str  # substring of the error
    where: str  # "table" or "header": the file the error must name
    sync: bool = True
    header: Callable[[dict[str, Any]], None] | None = None


def _ref(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda ref: ref.__setitem__(key, value)


TABLE_CASES = [
    TableCase("samples_as_text", _column("samples", lambda t: pa.array(["1"] * len(t))),
              "column 'samples' must be of type int64, got string", "table"),
    TableCase("bytes_as_float", _column("bytes", lambda t: pa.array([1.5] * len(t))),
              "column 'bytes' must be of type int64, got double", "table"),
    TableCase("index_as_int", _column("index", lambda t: pa.array([1] * len(t))),
              "column 'index' must be of type string", "table"),
    TableCase("negative_bytes", _first_row("bytes", -5, pa.int64()),
              "column 'bytes' must be >= 0, row 0 holds -5", "table"),
    TableCase("negative_samples", _first_row("samples", -1, pa.int64()),
              "column 'samples' must be >= 0", "table"),
    TableCase("path_absolute", _first_row("path", "/etc/passwd", pa.string()),
              "column 'path', row 0: '/etc/passwd' escapes", "table"),
    TableCase("path_dotdot", _first_row("path", "../../etc/passwd", pa.string()),
              "column 'path', row 0: '../../etc/passwd' escapes", "table"),
    TableCase("path_url", _first_row("path", "s3://other/x.tar", pa.string()),
              "column 'path', row 0: 's3://other/x.tar' escapes", "table"),
    TableCase("path_backslash", _first_row("path", "a\\..\\b.tar", pa.string()),
              "column 'path', row 0", "table"),
    TableCase("path_empty", _first_row("path", "", pa.string()),
              "column 'path', row 0: '' must be a non-empty string", "table"),
    TableCase("path_null", _first_row("path", None, pa.string()),
              "column 'path' is null in row 0", "table"),
    TableCase("index_escapes", _first_row("index", "../x.idx", pa.string()),
              "column 'index', row 0: '../x.idx' escapes", "table"),
    TableCase("duplicate_path",
              _column("path", lambda t: pa.array([t.column("path")[0].as_py()] * len(t))),
              "two shards share one path", "table"),
    TableCase("checksum_scheme", _first_row("checksum", "md5:00", pa.string()),
              "column 'checksum', row 0: 'md5:00'", "table"),
    TableCase("missing_column", _drop("checksum"),
              "lacks column(s) ['checksum']", "table"),
    TableCase("column_twice",
              lambda t, _: _ipc(t.append_column("path", t.column("path"))),
              "two columns named ['path']", "table"),
    TableCase("truncated_file", lambda _, d: d[: len(d) // 2],
              "not a readable Arrow IPC shard table", "table"),
    TableCase("empty_file", lambda _, d: b"",
              "not a readable Arrow IPC shard table", "table"),
    TableCase("stream_not_file", lambda t, _: _ipc(t, stream=True),
              "not a readable Arrow IPC shard table", "table"),
    TableCase("not_arrow", lambda _, d: b"PAR1" + bytes(len(d)),
              "not a readable Arrow IPC shard table", "table"),
    TableCase("truncated_not_synced", lambda _, d: d[: len(d) // 2],
              "shard_table.bytes", "table", sync=False),
    TableCase("checksum_mismatch", lambda _, d: _flip(d),
              "fails its checksum", "table", sync=False),
    TableCase("rows_mismatch", _same, "shard_table.rows = 5", "table",
              header=_ref("rows", 5)),
    TableCase("table_missing", _same, "is missing", "header",
              header=_ref("path", "manifest-0000000000000000.arrow")),
    TableCase("table_path_escapes", _same, "shard_table.path '../t.arrow' escapes", "header",
              header=_ref("path", "../t.arrow")),
    TableCase("table_format", _same, "shard_table.format must be 'arrow-ipc'", "header",
              header=_ref("format", "parquet")),
    TableCase("table_rows_negative", _same, "shard_table.rows must be an integer", "header",
              header=_ref("rows", -1)),
    TableCase("table_checksum_junk", _same, "shard_table.checksum must look like", "header",
              header=_ref("checksum", 7)),
]  # fmt: skip

TAR_CASES = _tar_cases()
MEDIA_CASES = _media_cases()


def manifest_with(text: str, edit: Edit) -> str:
    d = json.loads(text)
    edit(d)
    return json.dumps(d)
