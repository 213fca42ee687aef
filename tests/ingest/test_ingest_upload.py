"""How shard tasks make and upload shards: ``put_object`` (ingest's own signed PUT, s3fs's
elsewhere) on the real S3 server, runs of shards per task (``shard_groups``), ``run_shards``
building the same shards ``run_shard`` builds one by one while their uploads overlap, and
tar members written whole giving the standard library's bytes."""

from __future__ import annotations

import dataclasses
import io
import os
import tarfile
from pathlib import Path

import pytest

from flashfeed import storage
from flashfeed.cli.devstore import EmbeddedStore
from flashfeed.errors import StorageError
from flashfeed.format.tarshard import FIXED_MTIME
from flashfeed.ingest import IngestConfig
from flashfeed.ingest.assign import GROUP_SHARDS, shard_groups
from flashfeed.ingest.runner import _assign_shards, _recorded
from flashfeed.ingest.samplecorpus import make_imagefolder
from flashfeed.ingest.shardtask import ShardJob, TaskSpec, done_url, run_shard, run_shards
from flashfeed.ingest.sources import StorageContext, scan_source
from flashfeed.s3.putobject import put_object
from flashfeed.shardio import tar_shard_bytes


def test_shard_groups_cover_every_shard_once_in_runs_that_fill_every_cpu() -> None:
    for shards in (0, 1, 5, 7, 12, 100):
        for cpus in (1, 2, 3, 16):
            groups = shard_groups(shards, cpus)
            assert [n for g in groups for n in g] == list(range(shards))
            assert all(0 < len(g) <= GROUP_SHARDS for g in groups)
            assert len(groups) >= min(shards, cpus)  # no CPU idle for want of a task
            sizes = [len(g) for g in groups]
            assert not sizes or max(sizes) - min(sizes) <= 1
            # more runs than CPUs come in whole waves: every CPU gets as many runs
            assert len(groups) <= cpus or len(groups) % cpus == 0 or len(groups) == shards
    assert [list(g) for g in shard_groups(6, 1)] == [list(range(6))]  # one run: one tail
    assert [len(g) for g in shard_groups(12, 2)] == [6, 6]
    assert [len(g) for g in shard_groups(13, 2)] == [6, 7]
    assert [len(g) for g in shard_groups(17, 2)] == [4, 4, 4, 5]  # 8 and 9 shards a CPU
    assert [len(g) for g in shard_groups(25, 3)] == [4, 4, 4, 4, 4, 5]  # not 4 runs on 3 CPUs
    with pytest.raises(ValueError, match="cpus must be >= 1, got 0"):
        shard_groups(4, 0)
    with pytest.raises(ValueError, match="shards must be >= 0, got -1"):
        shard_groups(-1, 2)


def test_put_object_round_trips_on_s3_and_locally(s3_prefix: str, tmp_path: Path) -> None:
    blob = os.urandom(3 << 20) + b"tail"
    for url in (f"{s3_prefix}/a/shard.tar", str(tmp_path / "a" / "shard.tar")):
        put_object(url, blob)
        put_object(url + ".idx", memoryview(b"0 10\n"))
        assert storage.read_bytes(url) == blob
        assert storage.read_bytes(url + ".idx") == b"0 10\n"
        put_object(url, b"second")  # overwrites whole, on the kept connection
        assert storage.read_bytes(url) == b"second"


def test_put_object_refused_is_one_clear_error_and_writes_nothing(
    s3_store: EmbeddedStore, s3_prefix: str
) -> None:
    wrong = {**s3_store.info.storage_options(), "secret": "not-the-secret"}
    with pytest.raises(StorageError, match=r"could not write .*x\.tar.*AWS_SECRET_ACCESS_KEY"):
        put_object(f"{s3_prefix}/x.tar", b"data", storage_options=wrong)
    assert not storage.exists(f"{s3_prefix}/x.tar")


def _jobs(tmp_path: Path, dest: str) -> tuple[TaskSpec, list[ShardJob]]:
    """An ImageFolder of 12 images, one of them corrupt, in shards of two, decode check on:
    the spec and jobs ``run`` would dispatch."""
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=6, size=(64, 48))
    victim = sorted(src.glob("*/*.jpg"))[5]
    victim.write_bytes(victim.read_bytes()[:200])  # truncated: the decode check rejects it
    config = IngestConfig(source=str(src), dest=dest, samples_per_shard=2, validate=True)
    ctx = StorageContext.resolve(None)
    scan = scan_source(str(src), "imagefolder", ctx)
    shards = _assign_shards(config, scan, scan.items, ctx)
    return shards.spec, shards.jobs


def test_run_shards_writes_what_run_shard_writes_one_by_one(tmp_path: Path, s3_prefix: str) -> None:
    spec, jobs = _jobs(tmp_path, f"{s3_prefix}/grouped")
    grouped = run_shards(spec, tuple(jobs))
    single_spec = dataclasses.replace(spec, dest=f"{s3_prefix}/single")
    single = [run_shard(single_spec, job) for job in jobs]
    assert [r.number for r in grouped] == list(range(len(jobs))) == [r.number for r in single]
    assert [r.info for r in grouped] == [r.info for r in single]
    assert [r.rejects for r in grouped] == [r.rejects for r in single]
    assert sum(len(r.rejects) for r in grouped) == 1  # the truncated image, counted
    for r in grouped:
        assert r.info is not None and r.timings["upload"] > 0
        for name in (r.info["path"], r.info["index"]):
            got = storage.read_bytes(f"{s3_prefix}/grouped/{name}")
            assert got == storage.read_bytes(f"{s3_prefix}/single/{name}")
        assert (
            storage.checksum(storage.read_bytes(f"{s3_prefix}/grouped/{r.info['path']}"))
            == r.info["checksum"]
        )
        assert storage.exists(done_url(f"{s3_prefix}/grouped", r.number))
    again = run_shards(spec, tuple(jobs))  # a retried task reuses what its first try finished
    assert all(r.reused for r in again) and [r.info for r in again] == [r.info for r in grouped]


def test_done_records_are_looked_up_where_listed_or_as_a_retry_left_them(
    tmp_path: Path, s3_prefix: str
) -> None:
    """A fresh run's tasks skip the per-shard lookups; a retried task still reuses the
    prefix of its run that its first try finished, and a resumed run what the driver's
    listing of ``_work/`` found, wherever it lies in a run."""
    dest = f"{s3_prefix}/records"
    spec, jobs = _jobs(tmp_path, dest)
    fresh = [dataclasses.replace(j, recorded=False) for j in jobs]
    assert _recorded(dest, StorageContext.resolve(None)) == set()
    first = run_shards(spec, tuple(fresh[:2]))  # a first try that died after two shards
    retry = run_shards(spec, tuple(fresh))
    assert [r.reused for r in retry] == [True, True] + [False] * (len(jobs) - 2)
    assert [r.info for r in retry[:2]] == [r.info for r in first]
    # a resumed run: the records of shards 1 and 4 are left, found by one listing
    for n in (0, 2, 3, 5):
        storage.delete(done_url(dest, n))
    unlisted = run_shards(spec, tuple(fresh))  # unlisted and not a retry's: not looked up
    assert not any(r.reused for r in unlisted)
    assert [r.info for r in unlisted] == [r.info for r in retry]
    for n in (0, 2, 3, 5):
        storage.delete(done_url(dest, n))
    names = _recorded(dest, StorageContext.resolve(None))
    assert names == {done_url(dest, n).rsplit("/", 1)[-1] for n in (1, 4)}
    listed = [
        dataclasses.replace(j, recorded=done_url(dest, j.number).rsplit("/", 1)[-1] in names)
        for j in jobs
    ]
    resumed = run_shards(spec, tuple(listed))
    assert [r.reused for r in resumed] == [n in (1, 4) for n in range(len(jobs))]
    assert [r.info for r in resumed] == [r.info for r in retry]


def test_tar_shards_are_what_tarfile_addfile_writes() -> None:
    """Shard tars write each member whole; the bytes are the standard library's, member for
    member (sizes on and off the 512-byte blocks, empty members, nested keys, names of 100
    bytes and over, which ustar splits into a prefix)."""
    samples = [
        ("000000001", {"cls": b"3", "jpg": os.urandom(70_001)}),
        ("000000002", {"bin": b"", "seg.png": b"y" * 512}),
        ("a/b/000000003", {"json": b"{}" * 300, "txt": b"x" * 511}),
        ("k" * 96, {"jpg": b"z" * 1000}),  # 100 bytes with its extension
        ("p" * 60 + "/" + "q" * 60, {"jpg": b"w"}),  # 125 bytes: prefix and name
    ]
    data, _, n = tar_shard_bytes(iter(samples))
    ref = io.BytesIO()
    with tarfile.open(fileobj=ref, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for key, fields in samples:
            for ext in sorted(fields):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(fields[ext]), FIXED_MTIME, 0o644
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(fields[ext]))
    assert n == 5 and data == ref.getvalue()
    with pytest.raises(ValueError, match=r"sample 'k.*too long"):
        tar_shard_bytes(iter([("k" * 300, {"bin": b"x"})]))
