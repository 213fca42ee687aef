"""Ingest under faults: the driver SIGKILLed mid-run, the object store restarted mid-run, a
Ray worker SIGKILLed mid-task. A re-run reuses the finished shards and the dataset comes
out byte-identical."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from flashfeed import StorageError, storage
from flashfeed.cli import main as cli_main
from flashfeed.cli.devstore import EmbeddedStore
from flashfeed.ingest import IngestConfig, run
from flashfeed.ingest.samplecorpus import make_imagefolder

pytestmark = pytest.mark.usefixtures("ray_session")


def _objects(prefix: str, storage_options: dict | None = None) -> dict[str, bytes]:
    return {
        url[len(prefix) :]: storage.read_bytes(url, storage_options=storage_options)
        for url in storage.list_files(prefix, storage_options=storage_options)
    }


def _done_records(prefix: str) -> int:
    return len(storage.list_files(f"{prefix}/_work"))


def test_driver_killed_mid_run_resumes_to_identical_bytes(tmp_path: Path, s3_prefix: str) -> None:
    import ray

    src = make_imagefolder(tmp_path / "src", classes=4, per_class=20, size=(320, 240))
    args = [
        "ingest",
        str(src),
        "--samples-per-shard",
        "2",
        "--validate",
        "--max-image-side",
        "160",
        "--name",
        "photos",
        "--progress",
        "none",
    ]
    dest = f"{s3_prefix}/killed"
    env = dict(os.environ)
    cmd = [
        sys.executable,
        "-m",
        "flashfeed.cli",
        *args[:2],
        dest,
        *args[2:],
        "--ray-address",
        ray.get_runtime_context().gcs_address,
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while _done_records(dest) < 3:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the driver made no progress"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not storage.exists(f"{dest}/manifest.json"), "the run finished before the kill"
    finished = _done_records(dest)
    assert 3 <= finished < 40

    assert cli_main([*args[:2], dest, *args[2:], "--json"]) == 0
    assert cli_main([*args[:2], f"{s3_prefix}/clean", *args[2:]]) == 0
    assert _objects(dest) == _objects(f"{s3_prefix}/clean")


def test_store_restarted_mid_run(tmp_path: Path) -> None:
    root = tempfile.mkdtemp(prefix="ffrs-", dir="/tmp")
    store = EmbeddedStore(root, port=None)
    try:
        store.start()
        store.make_bucket("restart")
        opts = store.info.storage_options()
        src = make_imagefolder(tmp_path / "src", classes=3, per_class=16, size=(256, 192))
        cfg = dict(
            source=str(src),
            samples_per_shard=2,
            validate=True,
            max_image_side=128,
            name="r",
            progress="none",
        )
        dest = "s3://restart/ds"
        outcome: dict[str, object] = {}

        def ingest() -> None:
            try:
                outcome["result"] = run(IngestConfig(dest=dest, storage_options=opts, **cfg))
            except StorageError as exc:
                outcome["error"] = exc

        t = threading.Thread(target=ingest)
        t.start()
        deadline = time.monotonic() + 120
        while not storage.list_files(f"{dest}/_work", storage_options=opts):
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.02)
        store.stop()
        time.sleep(1.5)
        store.start()
        t.join(timeout=180)
        assert not t.is_alive()
        if "error" in outcome:  # retries ran out: the re-run must pick up from there
            outcome["result"] = run(IngestConfig(dest=dest, storage_options=opts, **cfg))
        assert outcome["result"] is not None
        run(IngestConfig(dest=str(tmp_path / "ref"), **cfg))
        got = _objects(dest, opts)
        ref = {k: v for k, v in _objects(str(tmp_path / "ref")).items()}
        assert got == ref and "/manifest.json" in got
    finally:
        store.stop()
        shutil.rmtree(root, ignore_errors=True)


def _running_shard_task(timeout: float = 60) -> int:
    """The pid of a Ray worker while it runs shard tasks (Ray titles it ``ray::run_shards``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if f.read().startswith(b"ray::run_shard"):
                        return int(pid)
            except OSError:
                pass
        time.sleep(0.005)
    raise AssertionError(f"no shard task ran within {timeout} s")


@pytest.mark.usefixtures("ray_session")
def test_ray_worker_killed_mid_task_is_retried_to_identical_bytes(
    tmp_path: Path, s3_prefix: str
) -> None:
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=4, size=(1200, 900))
    cfg = dict(
        source=str(src),
        samples_per_shard=2,
        seed=2,
        validate=True,
        max_image_side=96,
        name="photos",
        progress="none",
    )
    outcome: dict[str, object] = {}

    def ingest() -> None:
        try:
            outcome["result"] = run(IngestConfig(dest=f"{s3_prefix}/faulted", **cfg))
        except BaseException as exc:
            outcome["error"] = exc

    driver = threading.Thread(target=ingest)
    driver.start()
    try:
        victim = _running_shard_task()
        os.kill(victim, signal.SIGKILL)  # a Ray worker, mid-task
    finally:
        driver.join(timeout=120)
    assert "error" not in outcome, outcome.get("error")
    run(IngestConfig(dest=f"{s3_prefix}/clean", **cfg))
    faulted, clean = _objects(f"{s3_prefix}/faulted"), _objects(f"{s3_prefix}/clean")
    assert faulted == clean and len(clean) == 2 * 4 + 2  # shards and indexes, header, table
