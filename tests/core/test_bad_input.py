"""Bad input fails loudly and clearly: truncated or hostile tars, corrupt or missing shards,
unknown manifest versions, wrong credentials (the endpoint named, the secret never shown)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from flashfeed import (
    CorruptShardError,
    Dataset,
    HostileInputError,
    Manifest,
    ManifestError,
    StorageError,
    commit_manifest,
    storage,
)
from flashfeed.cli import main
from flashfeed.cli.devstore import EmbeddedStore
from flashfeed.format.tarshard import iter_samples, scan_index
from flashfeed.shardio import shard_name, tar_shard_bytes, write_tar_shard
from flashfeed.verify import verify_dataset


def samples(n: int, start: int = 0) -> list[tuple[str, dict[str, bytes]]]:
    return [
        (f"k{i:04d}", {"bin": bytes([i]) * (1000 + i), "cls": b"1"})
        for i in range(start, start + n)
    ]


def make_dataset(prefix: str, shards: int = 3) -> Manifest:
    infos = tuple(
        write_tar_shard(prefix, shard_name(i, "tar"), samples(4, 4 * i)) for i in range(shards)
    )
    m = Manifest(
        name="bad", shard_format="webdataset", schema={"bin": "x", "cls": "y"}, shards=infos
    )
    commit_manifest(prefix, m)
    return m


def tar_with(members: list[tarfile.TarInfo], payload: bytes = b"data") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info in members:
            if info.isreg():
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            else:
                tar.addfile(info)
    return buf.getvalue()


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


# --- truncated tars ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cut, message",
    [
        ("mid_data", "truncated"),
        ("mid_header", "header is cut short"),
        ("member_boundary", "without the end-of-archive marker"),
        ("garbled_header", "header is invalid"),
    ],
)
def test_truncated_tar_is_a_clear_error_for_stream_and_index_readers(
    cut: str, message: str
) -> None:
    data, _, _ = tar_shard_bytes(samples(3))
    # sample 1's first header is at 2560, its data at 3072; sample 2 starts at 5120
    bad = {
        "mid_data": data[: 3072 + 300],
        "mid_header": data[: 2560 + 100],
        "member_boundary": data[:5120],
        "garbled_header": data[:2560] + b"garbage!" * 64 + data[3072:],
    }[cut]
    with pytest.raises(CorruptShardError, match=r"shard\.tar") as err:
        list(iter_samples(io.BytesIO(bad), source="shard.tar"))
    assert message in str(err.value)
    with pytest.raises(CorruptShardError, match=r"shard\.tar") as err:
        scan_index(io.BytesIO(bad), source="shard.tar")
    assert message in str(err.value) or "truncated" in str(err.value)


def test_index_names_a_truncated_tar_and_commits_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, _, _ = tar_shard_bytes(samples(3))
    (tmp_path / "good.tar").write_bytes(data)
    (tmp_path / "cut.tar").write_bytes(data[: len(data) // 2 + 7])
    assert main(["index", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "cut.tar" in err and "truncated" in err
    assert not (tmp_path / "manifest.json").exists()


def test_truncated_shard_of_a_dataset_fails_its_size_check(tmp_path: Path) -> None:
    prefix = str(tmp_path / "ds")
    m = make_dataset(prefix)
    path = tmp_path / "ds" / m.shards[2].path
    path.write_bytes(path.read_bytes()[:-1024])  # cut on a block boundary: tar alone can't tell
    with pytest.raises(CorruptShardError, match=r"000002\.tar .*truncated or replaced"):
        list(Dataset.open(prefix))


# --- hostile members --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "info, message",
    [
        (member("../evil.jpg"), r"'\.\./evil\.jpg' contains '\.\.'"),
        (member("a/../../evil.jpg"), "contains '..'"),
        (member("/etc/cron.d/evil.jpg"), "absolute path"),
        (member("link.jpg", tarfile.SYMTYPE, "/etc/passwd"), "link to '/etc/passwd'"),
        (member("hard.jpg", tarfile.LNKTYPE, "k0000.bin"), "is a link"),
        (member("dev.jpg", tarfile.CHRTYPE), "device"),
    ],
    ids=["dotdot", "nested-dotdot", "absolute", "symlink", "hardlink", "device"],
)
def test_hostile_members_are_refused(info: tarfile.TarInfo, message: str, tmp_path: Path) -> None:
    data = tar_with([member("ok.jpg"), info])
    with pytest.raises(HostileInputError, match=message):
        list(iter_samples(io.BytesIO(data), source="x.tar"))
    with pytest.raises(HostileInputError, match=message):
        scan_index(io.BytesIO(data), source="x.tar")
    (tmp_path / "x.tar").write_bytes(data)
    assert main(["index", str(tmp_path)]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.tar"]  # no .idx, no manifest


def test_members_with_whitespace_cannot_be_indexed() -> None:
    data = tar_with([member("a b.jpg")])
    with pytest.raises(CorruptShardError, match="whitespace"):
        scan_index(io.BytesIO(data), source="x.tar")


# --- corrupt, replaced and missing shards --------------------------------------------------------


def test_verify_names_every_bad_shard(any_prefix: str, capsys: pytest.CaptureFixture[str]) -> None:
    m = make_dataset(any_prefix, shards=4)
    url1 = storage.join(any_prefix, m.shards[1].path)
    data = bytearray(storage.read_bytes(url1))
    data[700] ^= 1  # same size, other bytes
    storage.write_bytes(url1, bytes(data))
    storage.delete(storage.join(any_prefix, m.shards[3].path))

    report = verify_dataset(any_prefix, workers=3)
    assert [p.path for p in report.problems] == ["shards/000001.tar", "shards/000003.tar"]
    assert "checksum mismatch" in report.problems[0].reason
    assert "missing" in report.problems[1].reason

    assert main(["verify", any_prefix, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "2 of 4 shards" in err
    assert "BAD shards/000001.tar: checksum mismatch" in err
    assert "BAD shards/000003.tar: missing" in err
    assert "000000.tar" not in err and "000002.tar" not in err


def test_missing_shard_object_is_named_when_read(any_prefix: str) -> None:
    m = make_dataset(any_prefix, shards=2)
    storage.delete(storage.join(any_prefix, m.shards[0].path))
    with pytest.raises(CorruptShardError, match=r"shard shards/000000\.tar of dataset .* missing"):
        list(Dataset.open(any_prefix))


def test_verify_catches_a_broken_index(tmp_path: Path) -> None:
    prefix = str(tmp_path)
    m = make_dataset(prefix, shards=2)
    (tmp_path / m.shards[1].index).write_text("v1.2 4\nbin 512 10 k0004.bin\n")  # type: ignore[operator]
    report = verify_dataset(prefix)
    assert [p.path for p in report.problems] == ["shards/000001.tar"]
    assert "index" in report.problems[0].reason and "1 lines follow" in report.problems[0].reason


# --- manifests --------------------------------------------------------------------------------


def test_unknown_format_version_is_refused_naming_the_manifest(
    any_prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    m = make_dataset(any_prefix, shards=1)
    d = m.to_dict()
    d["format_version"] = 99
    storage.write_bytes(storage.join(any_prefix, "manifest.json"), json.dumps(d).encode())
    with pytest.raises(ManifestError, match=r"manifest\.json: manifest format version 99"):
        Dataset.open(any_prefix)
    assert main(["inspect", any_prefix]) == 1
    err = capsys.readouterr().err
    assert storage.join(any_prefix, "manifest.json") in err or "manifest.json" in err
    assert "version 99 is not supported" in err


def test_malformed_manifest_is_a_clear_cli_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "manifest.json").write_text('{"format_version": 1, "name": ')
    assert main(["verify", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path}/manifest.json: not valid JSON" in err


# --- credentials ------------------------------------------------------------------------------


def test_wrong_credentials_name_the_endpoint_and_never_the_secret(
    s3_store: EmbeddedStore,
    s3_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_dataset(s3_prefix, shards=1)
    info = s3_store.info
    wrong = "WrongSecretValue-0123456789abcdef"
    opts = {"endpoint_url": info.endpoint, "key": info.access_key, "secret": wrong}
    with pytest.raises(StorageError) as err:
        Dataset.open(s3_prefix, storage_options=opts)
    text = str(err.value)
    assert info.endpoint in text
    assert "Forbidden" in text or "SignatureDoesNotMatch" in text
    assert "AWS_SECRET_ACCESS_KEY" in text  # says what to check
    assert wrong not in text and info.secret_key not in text

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    assert main(["inspect", s3_prefix]) == 1
    out = capsys.readouterr()
    assert info.endpoint in out.err
    assert wrong not in out.err + out.out and info.secret_key not in out.err + out.out

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "NoSuchKeyId")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", info.secret_key)
    with pytest.raises(StorageError, match=r"InvalidAccessKeyId|AccessDenied|Forbidden") as err:
        Dataset.open(s3_prefix)
    assert info.endpoint in str(err.value) and info.secret_key not in str(err.value)
