"""Security: the secret key never leaves the client in anything a run produces; the cache is
private (dirs 0700, files 0600) and refuses a directory others own or may write into."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from flashfeed import Dataset, storage
from flashfeed.cache import CachePermissionError, ShardCache
from flashfeed.cli import main
from flashfeed.cli.devstore import StoreInfo
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.samplecorpus import make_imagefolder
from flashfeed.loader import Loader


def _all_files(*roots: Path) -> list[Path]:
    return [p for r in roots if r.exists() for p in r.rglob("*") if p.is_file()]


@pytest.mark.usefixtures("ray_session")
def test_the_secret_key_appears_nowhere_a_run_leaves_anything(
    tmp_path: Path,
    s3_prefix: str,
    s3_info: StoreInfo,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    secret = s3_info.secret_key
    assert len(secret) >= 16
    caplog.set_level(logging.DEBUG)
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=5, size=(24, 24))
    (src / "class_00" / "broken.jpg").write_bytes(b"\xff\xd8 not a jpeg")  # a reject to list
    opts = s3_info.storage_options()  # the secret passed explicitly, through Ray tasks too
    result = run(
        IngestConfig(
            source=str(src),
            dest=f"{s3_prefix}/lib",
            validate=True,
            samples_per_shard=4,
            storage_options=opts,
            progress="lines",
        )
    )
    assert result.manifest.skipped == {"undecodable": 1}
    dest = f"{s3_prefix}/cli"
    assert main(["ingest", str(src), dest, "--validate", "--samples-per-shard", "4", "--json"]) == 0
    assert main(["inspect", dest, "--json"]) == 0
    assert main(["verify", dest]) == 0
    cache_dir = tmp_path / "cache"
    assert main(["cache", "warm", dest, "--cache-dir", str(cache_dir), "--json"]) == 0
    assert main(["cache", "status", str(cache_dir), "--json"]) == 0
    # the cluster-wide warm: one Ray task per node, whose logs are searched below
    warm_argv = ["cache", "warm", dest, "--cache-dir", str(tmp_path / "cache-cluster"),
                 "--ray-address", "auto", "--json"]  # fmt: skip
    assert main(warm_argv) == 0
    ds = Dataset.open(dest, storage_options=opts)
    with ShardCache(cache_dir, capacity="64MiB", storage_options=opts) as cache:
        loader = Loader(ds, batch_size=3, image_size=16, cache=cache, train=False)
        assert sum(len(b["label"]) for b in loader) == 9
    # failures carry the endpoint and the object, never the secret
    errors = []
    for call in (
        lambda: Dataset.open("s3://no-such-bucket-x/ds", storage_options=opts),
        lambda: Dataset(dest, ds.manifest, storage_options=opts).read_shard(0) and None,
        lambda: storage.read_bytes(f"{dest}/nope", storage_options=opts),
    ):
        try:
            call()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc!r} {exc}")
    storage.delete(f"{dest}/{ds.shards[0].path}")
    try:
        Dataset.open(dest, storage_options=opts).read_shard(0)
    except Exception as exc:
        errors.append(repr(exc))
    assert len(errors) == 3
    assert main(["cache", "warm", "s3://flashfeed/none", "--cache-dir", str(cache_dir)]) != 0

    out = capsys.readouterr()
    produced = {
        "stdout": out.out,
        "stderr": out.err,
        "logs": "\n".join(r.getMessage() + repr(r.args) for r in caplog.records),
        "errors": "\n".join(errors),
    }
    assert '"samples"' in out.out and "undecodable" in produced["logs"] + out.out + out.err
    for prefix in (f"{s3_prefix}/lib", dest):
        for url in storage.list_files(prefix):
            produced[url] = storage.read_bytes(url).decode("latin-1")
    assert any(k.endswith("rejects.jsonl") for k in produced)
    assert any(k.endswith("manifest.json") for k in produced)
    import ray

    session = Path(ray._private.worker._global_node.get_session_dir_path())
    for path in _all_files(cache_dir, session / "logs"):
        produced[str(path)] = path.read_bytes().decode("latin-1")
    leaks = [where for where, text in produced.items() if secret in text]
    assert not leaks, f"the secret key appears in {leaks}"
    assert len(produced) > 20


def test_cache_is_private_and_refuses_a_directory_of_another_user(
    s3_prefix: str, tmp_path: Path
) -> None:
    from support.cache_data import make_dataset

    ds = make_dataset(s3_prefix, shards=2, shard_bytes=20_000)
    root = tmp_path / "cache"
    with ShardCache(root, capacity="1MiB") as cache:
        cache.get(ds, 0)
        cache.pin(ds, 1)
        cache.set_future(ds, [0, 1])
    entries = list(root.rglob("*"))
    assert any(p.name == "000000.tar" for p in entries)
    for p in [root, *entries]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))

    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(CachePermissionError, match="belongs to uid 65534"):
        ShardCache(theirs, capacity="1MiB")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(CachePermissionError, match="writable by group or others"):
        ShardCache(shared, capacity="1MiB")
    assert not list(shared.iterdir()) and not list(theirs.iterdir())


def test_warm_json_output_is_parseable_and_names_no_credentials(
    s3_prefix: str, s3_info: StoreInfo, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from support.cache_data import make_dataset

    make_dataset(s3_prefix, shards=2, shard_bytes=10_000)
    capsys.readouterr()
    assert main(["cache", "warm", s3_prefix, "--cache-dir", str(tmp_path / "c"), "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out)
    assert summary and s3_info.secret_key not in out and s3_info.access_key not in out
