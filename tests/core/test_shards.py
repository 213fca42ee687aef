"""Conformance: manifest + tar + Arrow shards behave the same on a local dir and on real S3.

Every test taking ``any_prefix`` runs twice: on ``tmp_path`` and on the SeaweedFS server.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path

import pyarrow as pa
import pytest

from flashfeed import (
    CorruptShardError,
    Dataset,
    DatasetExistsError,
    Manifest,
    ManifestError,
    TarShardReader,
    commit_manifest,
    read_manifest,
    storage,
)
from flashfeed.format.arrowshard import open_arrow, schema_of
from flashfeed.format.tarshard import FIXED_MTIME, TarShardWriter, iter_samples, validate_key
from flashfeed.format.wdsindex import parse_index
from flashfeed.runtime.fdpath import fd_path, map_readonly
from flashfeed.shardio import shard_name, tar_shard_bytes, write_arrow_shard, write_tar_shard
from flashfeed.verify import verify_dataset


def samples(start: int, n: int) -> list[tuple[str, dict[str, bytes]]]:
    """Samples with fields of varying sizes (some cross 512-byte tar blocks)."""
    return [
        (
            f"class{i % 3}/img{i:05d}",
            {
                "jpg": bytes([i % 251]) * (300 + 97 * i),
                "cls": str(i % 3).encode(),
                "json": b'{"i": %d}' % i,
            },
        )
        for i in range(start, start + n)
    ]


def write_tar_dataset(prefix: str, shards: int = 3, per_shard: int = 5) -> Manifest:
    infos = tuple(
        write_tar_shard(prefix, shard_name(i, "tar"), samples(i * per_shard, per_shard))
        for i in range(shards)
    )
    m = Manifest(
        name="conf",
        shard_format="webdataset",
        schema={"jpg": "image/jpeg", "cls": "text/plain", "json": "application/json"},
        shards=infos,
    )
    commit_manifest(prefix, m)
    return m


def test_tar_dataset_round_trip(any_prefix: str) -> None:
    m = write_tar_dataset(any_prefix)
    ds = Dataset.open(any_prefix)
    assert ds.manifest == m
    assert len(ds) == 15
    assert list(ds) == samples(0, 15)
    assert [s.index for s in ds.shards] == [f"shards/00000{i}.tar.idx" for i in range(3)]
    assert verify_dataset(ds).ok


def test_random_access_through_the_index(any_prefix: str) -> None:
    write_tar_dataset(any_prefix, shards=2, per_shard=7)
    ds = Dataset.open(any_prefix)
    expected = samples(7, 7)
    index = ds.read_index(1)
    assert [s.key for s in index] == [k for k, _ in expected]
    with TarShardReader(ds.shard_url(1), index) as reader:
        assert len(reader) == 7
        for i in (6, 0, 3):
            assert reader[i] == expected[i]


def test_identical_samples_give_identical_bytes_on_every_backend(
    any_prefix: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = str(tmp_path_factory.mktemp("again") / "ds")
    a = write_tar_shard(any_prefix, "s.tar", samples(0, 6))
    b = write_tar_shard(other, "s.tar", samples(0, 6))
    assert a == b
    assert storage.read_bytes(storage.join(any_prefix, "s.tar")) == storage.read_bytes(
        storage.join(other, "s.tar")
    )
    assert storage.checksum(storage.read_bytes(storage.join(any_prefix, "s.tar"))) == a.checksum


def test_tar_members_follow_the_determinism_rules(any_prefix: str) -> None:
    info = write_tar_shard(any_prefix, "s.tar", [("b", {"z": b"1", "a": b"22"}), ("a", {"x": b""})])
    data = storage.read_bytes(storage.join(any_prefix, info.path))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
    # samples in the order given, members of a sample adjacent with extensions sorted
    assert [m.name for m in members] == ["b.a", "b.z", "a.x"]
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.mode, m.uname, m.gname) == (
            FIXED_MTIME,
            0,
            0,
            0o644,
            "",
            "",
        )
        assert m.isreg()
    text = storage.read_bytes(storage.join(any_prefix, "s.tar.idx")).decode()
    assert text.splitlines()[0] == "v1.2 2"
    idx = parse_index(text)
    assert [(c.ext, c.size, c.name) for c in idx[0].components] == [
        ("a", 2, "b.a"),
        ("z", 1, "b.z"),
    ]
    assert data[idx[0].components[0].offset : idx[0].components[0].offset + 2] == b"22"


def test_arrow_dataset_round_trip(any_prefix: str) -> None:
    tables = [
        pa.table(
            {
                "__key__": [f"doc{i}-{j}" for j in range(4)],
                "tokens": [[i, j, j + 1] for j in range(4)],
                "text": [f"t{i}{j}" for j in range(4)],
            }
        )
        for i in range(2)
    ]
    infos = tuple(
        write_arrow_shard(any_prefix, shard_name(i, "arrow"), t) for i, t in enumerate(tables)
    )
    m = Manifest(name="tok", shard_format="arrow", schema=schema_of(tables[0]), shards=infos)
    commit_manifest(any_prefix, m)
    ds = Dataset.open(any_prefix)
    assert ds.manifest.schema == {
        "__key__": "string",
        "tokens": "list<item: int64>",
        "text": "string",
    }
    assert [s.samples for s in ds.shards] == [4, 4]
    rows = list(ds)
    assert rows[5] == ("doc1-1", {"__key__": "doc1-1", "tokens": [1, 1, 2], "text": "t11"})
    assert open_arrow(ds.read_shard(1)).equals(tables[1])
    assert verify_dataset(ds).ok


def test_arrow_shard_memory_maps_locally(tmp_path: Path) -> None:
    table = pa.table({"x": list(range(100_000))})
    info = write_arrow_shard(str(tmp_path), "a.arrow", table)
    before = pa.total_allocated_bytes()
    mapped = open_arrow(str(tmp_path / info.path))
    # zero copy: reading the 800 kB column allocates nothing, its buffers are the mapped file
    assert pa.total_allocated_bytes() - before < 10_000
    assert mapped.equals(table)


def test_arrow_shard_opens_through_a_descriptor_path(tmp_path: Path) -> None:
    """A ``/proc/self/fd/N`` path (a node service's descriptor) maps that descriptor's whole
    file, read-only, from its start whatever the descriptor's offset."""
    table = pa.table({"x": list(range(10_000))})
    info = write_arrow_shard(str(tmp_path), "a.arrow", table)
    path = tmp_path / info.path
    fd = os.open(path, os.O_RDONLY)
    try:
        os.lseek(fd, 100, os.SEEK_SET)
        with map_readonly(fd_path(fd)) as m:
            assert m[:] == path.read_bytes()
            with pytest.raises(TypeError):
                m[0] = 0
        assert open_arrow(fd_path(fd)).equals(table)
    finally:
        os.close(fd)


def test_commit_is_refused_over_a_committed_dataset(any_prefix: str) -> None:
    write_tar_dataset(any_prefix, shards=1)
    m = read_manifest(any_prefix)
    with pytest.raises(DatasetExistsError, match="already exists"):
        commit_manifest(any_prefix, m)


def test_no_manifest_no_dataset(any_prefix: str) -> None:
    write_tar_shard(any_prefix, "s.tar", samples(0, 2))  # shards, but never committed
    with pytest.raises(ManifestError, match="does not exist"):
        Dataset.open(any_prefix)


def test_replaced_shard_bytes_fail_the_checksum(any_prefix: str) -> None:
    m = write_tar_dataset(any_prefix, shards=2)
    url = storage.join(any_prefix, m.shards[1].path)
    data = bytearray(storage.read_bytes(url))
    data[600] ^= 0xFF
    storage.write_bytes(url, bytes(data))
    ds = Dataset.open(any_prefix)
    assert list(ds.iter_shard(0)) == samples(0, 5)
    with pytest.raises(CorruptShardError, match=r"000001\.tar .*fails its checksum"):
        list(ds.iter_shard(1))


def test_list_files_and_atomic_writes_leave_no_temporaries(any_prefix: str) -> None:
    write_tar_dataset(any_prefix, shards=2)
    found = storage.list_files(any_prefix)
    names = sorted(f.rsplit("/", 1)[-1] for f in found)
    assert names == [
        "000000.tar",
        "000000.tar.idx",
        "000001.tar",
        "000001.tar.idx",
        json.loads(storage.read_bytes(f"{any_prefix}/manifest.json"))["shard_table"]["path"],
        "manifest.json",
    ]
    idx = storage.list_files(any_prefix, suffix=".idx")
    assert [f.rsplit("/", 2)[-2:] for f in idx] == [
        ["shards", "000000.tar.idx"],
        ["shards", "000001.tar.idx"],
    ]
    assert idx[0].startswith("s3://" if any_prefix.startswith("s3://") else "/")
    assert storage.list_files(storage.join(any_prefix, "absent")) == []


@pytest.mark.parametrize("key", ["a.b", "../x", "/abs", "x/../y", "sp ace", "", "dir/", "a//b"])
def test_writer_rejects_keys_that_break_the_format(key: str) -> None:
    with pytest.raises(ValueError, match="invalid sample key"):
        validate_key(key)
    with TarShardWriter(io.BytesIO()) as w, pytest.raises(ValueError, match="invalid sample key"):
        w.write(key, {"jpg": b"x"})


def test_writer_rejects_duplicate_keys_bad_extensions_and_empty_shards() -> None:
    with TarShardWriter(io.BytesIO()) as w:
        w.write("a", {"jpg": b"x"})
        with pytest.raises(ValueError, match="duplicate sample key 'a'"):
            w.write("a", {"jpg": b"y"})
        with pytest.raises(ValueError, match="invalid extension"):
            w.write("b", {"j pg": b"y"})
        with pytest.raises(ValueError, match="has no fields"):
            w.write("c", {})
    with pytest.raises(ValueError, match="empty shard"):
        tar_shard_bytes([])


def test_reader_groups_members_by_key_and_keeps_slashes() -> None:
    data, _, n = tar_shard_bytes(samples(0, 4))
    assert n == 4
    got = list(iter_samples(io.BytesIO(data)))
    assert [k for k, _ in got] == [
        "class0/img00000",
        "class1/img00001",
        "class2/img00002",
        "class0/img00003",
    ]
    assert got == samples(0, 4)


@pytest.mark.parametrize("size", [0, 1, (8 << 20) - 1, 8 << 20, (16 << 20) + 12345])
def test_a_file_checksum_read_in_pieces_is_the_checksum_of_its_bytes(tmp_path: Path, size: int):
    import os

    from flashfeed import storage

    data = os.urandom(size)
    path = tmp_path / "shard.bin"
    path.write_bytes(data)
    assert storage.file_checksum(path) == storage.checksum(data)
    flipped = bytearray(data or b"\0")
    flipped[-1] ^= 1
    path.write_bytes(bytes(flipped))
    assert storage.file_checksum(path) != storage.checksum(data)
