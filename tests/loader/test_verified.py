"""A local shard is hashed once per node while its file stays unchanged: later processes
check the file's identity against a record of that hash, and any change to the file (a write
of the same size, a rename over it) makes the next process hash it again and name it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashfeed.dataset import Dataset
from flashfeed.errors import CorruptShardError
from flashfeed.loader import verified
from flashfeed.loader.sources import LocalShardSource

from support.loader_helpers import make_image_dataset

EPOCH = """
import json, sys
from flashfeed.errors import CorruptShardError
from flashfeed.loader import Loader
loader = Loader(sys.argv[1], batch_size=4, image_size=16, device="cpu", seed=3)
try:
    keys = [k for b in loader for k in b["__key__"]]
    print(json.dumps({"keys": keys, "source": loader.stats()["cache"]}))
except CorruptShardError as exc:
    print(json.dumps({"error": str(exc)}))
finally:
    loader.close()
"""


def _epoch(root: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", EPOCH, str(root)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    path.write_bytes(bytes(data))


def _settle() -> None:
    time.sleep(verified.SETTLE_NS / 1e9 + 0.2)


def test_a_later_process_recalls_the_hash_and_a_changed_shard_is_hashed_again(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ds"
    make_image_dataset(str(root), [8, 8, 8])
    _settle()  # written just now: the first process's hashes could not be recorded before

    first = _epoch(root)
    assert (first["source"]["checked_by_hash"], first["source"]["checked_by_record"]) == (3, 0)
    again = _epoch(root)
    assert (again["source"]["checked_by_hash"], again["source"]["checked_by_record"]) == (0, 3)
    assert again["keys"] == first["keys"] and len(set(first["keys"])) == 24

    bad = Dataset.open(str(root)).shards[1].path
    _flip(root / bad)
    after = _epoch(root)
    assert "error" in after and bad in after["error"] and "fails its checksum" in after["error"]


@pytest.fixture
def quick_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verified, "SETTLE_NS", 50_000_000)


def _check_all(root: Path) -> dict:
    source = LocalShardSource(Dataset.open(str(root)))  # a new source: as a new process
    for shard in range(len(source.dataset.shards)):
        source.local_path(shard)
    return source.stats()


def test_a_shard_renamed_over_with_the_same_size_is_hashed_and_named(
    tmp_path: Path, quick_settle: None
) -> None:
    root = tmp_path / "ds"
    make_image_dataset(str(root), [4, 4])
    time.sleep(0.1)
    assert _check_all(root)["checked_by_hash"] == 2
    assert _check_all(root)["checked_by_record"] == 2
    bad = root / Dataset.open(str(root)).shards[0].path
    data = bytearray(bad.read_bytes())
    data[100] ^= 0x01
    (root / "other.tmp").write_bytes(bytes(data))
    stamp = bad.stat()
    os.utime(root / "other.tmp", ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # same mtime too
    os.replace(root / "other.tmp", bad)
    with pytest.raises(CorruptShardError, match=bad.name):
        _check_all(root)


def test_a_file_changed_just_before_its_hash_gets_no_record(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    make_image_dataset(str(root), [4, 4])  # default settle: these files are too new
    assert _check_all(root)["checked_by_hash"] == 2
    assert _check_all(root)["checked_by_hash"] == 2
    records = Path(os.environ["FLASHFEED_VERIFIED_DIR"])
    for shard in Dataset.open(str(root)).shards:
        real = os.path.realpath(root / shard.path)
        assert not (records / verified._name(real)).exists()  # nothing kept for them


def test_no_place_for_records_means_every_process_hashes(
    tmp_path: Path, quick_settle: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "ds"
    make_image_dataset(str(root), [4])
    time.sleep(0.1)
    (tmp_path / "a-file").write_text("not a folder")
    for where in ("", str(tmp_path / "a-file" / "verified")):
        monkeypatch.setenv("FLASHFEED_VERIFIED_DIR", where)
        for _ in range(2):
            stats = _check_all(root)
            assert (stats["checked_by_hash"], stats["checked_by_record"]) == (1, 0)


def test_a_record_is_trusted_only_for_the_manifest_checksum(
    tmp_path: Path, quick_settle: None
) -> None:
    root = tmp_path / "ds"
    make_image_dataset(str(root), [4])
    time.sleep(0.1)
    records = os.environ["FLASHFEED_VERIFIED_DIR"]
    path = str(root / Dataset.open(str(root)).shards[0].path)
    expected = Dataset.open(str(root)).shards[0].checksum
    st = os.stat(path)
    assert verified.checksum(path, st, expected=expected, records=records) == (expected, True)
    assert verified.checksum(path, st, expected=expected, records=records) == (expected, False)
    # a manifest that asks for other bytes: the record does not answer for it, the file does
    other = verified.checksum(path, st, expected="xxh3:other", records=records)
    assert other == (expected, True)
