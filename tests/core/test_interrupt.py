"""Ctrl-C in a terminal signals the whole foreground process group. An ingest interrupted so,
while its embedded Ray starts or while shards are being written, exits 130 with the one line
"interrupted; re-run to continue", shows no traceback, leaves no process it started, and
commits nothing: no manifest appears.

A `verify` or `cache warm` interrupted while it reads shards (through a proxy that slows
the store) stops the same way, and what the cache holds is whole; a warm over a Ray cluster
also stops its tasks on the cluster. So does the demo, interrupted in its loader step.

Each case is a real ``python -m flashfeed.cli ingest`` in its own session; SIGINT goes to its
process group (``os.killpg``) once the moment is reached, judged from /proc and the disk.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from benchmarks.harness.slowproxy import SlowProxy
from flashfeed.ingest.samplecorpus import make_imagefolder

from support import REPO
from support.cache_data import make_dataset
from support.procs import GONE_WITHIN, alive, cmdline, descendants, session_members

CLI = [sys.executable, "-m", "flashfeed.cli"]
#: a bound on waiting for a moment to come, not a measured time
MOMENT_WITHIN = 180.0


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_imagefolder(
        tmp_path_factory.mktemp("corpus") / "imgs", classes=4, per_class=60, size=(96, 64)
    )


def interrupt_at(
    proc: subprocess.Popen[str], moment: Callable[[], bool], *, settle: float = 0.0
) -> tuple[str, dict[int, str]]:
    """Wait for ``moment()``, then SIGINT ``proc``'s process group as a terminal's Ctrl-C
    does: its stderr, and the processes it had started by then."""
    try:
        deadline = time.monotonic() + MOMENT_WITHIN
        while not moment():
            if proc.poll() is not None:
                err = proc.stderr.read() if proc.stderr is not None else ""
                raise AssertionError(f"ended (rc {proc.returncode}) before the moment:\n{err}")
            assert time.monotonic() < deadline, "the moment never came"
            time.sleep(0.05)
        time.sleep(settle)
        started = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return err, started


def _ray_starting(pid: int, dest: Path) -> bool:
    return any("gcs_server" in cmdline(p) or "raylet" in cmdline(p) for p in descendants(pid))


def _shards_written(pid: int, dest: Path) -> bool:
    return bool(glob.glob(str(dest / "**" / "*.tar"), recursive=True))


@pytest.mark.parametrize(
    "moment", [_ray_starting, _shards_written], ids=["ray-start", "mid-ingest"]
)
def test_ctrl_c_to_the_process_group_stops_ingest_cleanly(corpus: Path, tmp_path: Path, moment):
    dest = tmp_path / "ds"
    argv = [*CLI, "ingest", str(corpus), str(dest), "--samples-per-shard", "4", "--num-cpus", "2"]
    proc = subprocess.Popen(
        [*argv, "--progress", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    err, started = interrupt_at(proc, lambda: moment(proc.pid, dest))
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Check failed" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1] == "flashfeed ingest: interrupted; re-run to continue", err
    deadline = time.monotonic() + GONE_WITHIN
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(started), f"left behind: {alive(started)}"
    assert not (dest / "manifest.json").exists(), "an interrupted ingest committed"


@pytest.fixture
def slow_store(s3_store, s3_prefix: str) -> Iterator[tuple[str, SlowProxy]]:
    """A committed 8-shard dataset, and a proxy that delays every request to the store."""
    make_dataset(s3_prefix, shards=8, shard_bytes=64 << 10)
    proxy = SlowProxy(("127.0.0.1", s3_store.info.s3_port), delay=0.3)
    try:
        yield s3_prefix, proxy
    finally:
        proxy.close()


def _cluster_flags() -> list[str]:
    """``--ray-address``/``--hosts`` of the session's one-node Ray cluster."""
    import ray

    (node,) = [n for n in ray.nodes() if n.get("Alive")]
    address = ray.get_runtime_context().gcs_address
    return ["--ray-address", address, "--hosts", node["NodeManagerAddress"]]


@pytest.mark.parametrize("command", ["verify", "cache warm", "cluster warm"])
def test_ctrl_c_to_the_process_group_stops_warm_and_verify(
    slow_store: tuple[str, SlowProxy], tmp_path: Path, command: str, request
):
    """A cluster warm (``--ray-address``) also stops its task on the cluster: Ray ends a
    job's tasks with its driver, so shard requests stop arriving."""
    url, proxy = slow_store
    cache = tmp_path / "cache"
    if command == "verify":
        argv = ["verify", url, "--workers", "1", "--no-progress"]
    else:
        argv = ["cache", "warm", url, "--cache-dir", str(cache), "--concurrency", "1",
                "--no-progress"]  # fmt: skip
    if command == "cluster warm":
        request.getfixturevalue("ray_session")
        argv += _cluster_flags()
    proc = subprocess.Popen(
        [*CLI, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "AWS_ENDPOINT_URL": proxy.endpoint},
    )
    err, _ = interrupt_at(proc, lambda: len(proxy.log(".tar")) >= 2)  # shards being read
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    name = "verify" if command == "verify" else "cache warm"
    assert lines == [f"flashfeed {name}: interrupted; re-run to continue"], err
    assert not session_members(proc.pid)
    if command == "cluster warm":  # within a few seconds no more shard requests arrive
        deadline = time.monotonic() + GONE_WITHIN
        while True:
            before = len(proxy.log(".tar"))
            time.sleep(2.0)
            if len(proxy.log(".tar")) == before:
                break
            assert time.monotonic() < deadline, "the cluster's warm task went on fetching"
    if command != "verify":  # what is cached is whole: every cached shard verifies
        from flashfeed.cache.cli import admin

        assert admin.verify(str(cache))["corrupt"] == []


def test_ctrl_c_to_the_demo_stops_it_cleanly(tmp_path: Path):
    """The demo interrupted in its loader step (store, Ray and DALI readers all up): exit 130,
    the one line, nothing it started left running."""
    script = REPO / "examples" / "demo.py"
    demo = [sys.executable, str(script), "--workdir", str(tmp_path / "demo")]
    proc = subprocess.Popen(
        [*demo, "--per-class", "24", "--epochs", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout or []), daemon=True)
    reader.start()
    in_loader = lambda: any(line.startswith("== loader") for line in list(seen))  # noqa: E731
    err, started = interrupt_at(proc, in_loader, settle=1.0)  # its first epoch is running
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[-1].endswith("interrupted; re-run to continue"), err
    deadline = time.monotonic() + GONE_WITHIN
    while alive(started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(started), f"left behind: {alive(started)}"
