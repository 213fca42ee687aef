"""Nothing outlives its parent: every process flashfeed starts for a Python process's own use
(DALI reader processes, an embedded SeaweedFS, an embedded Ray, spawned workers) is gone
within seconds of that process's death by SIGKILL, the signal schedulers use.

Each test runs a real child Python process, waits until its helpers run, records its
descendants from /proc, SIGKILLs it, and waits for every descendant to be gone.
"""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flashfeed.ingest.raysetup import RAY_PREFIX
from flashfeed.loader.image.dali_runner import PASS_PREFIX
from flashfeed.runtime.scratch import make_owned_dir, remove_owned

from support import TESTS
from support.loader_helpers import make_image_dataset, stub_runner
from support.procs import GONE_WITHIN, alive, descendants


#: the requirement is 5 s; a loaded 2-core machine gets some slack before the test fails
class Children:
    """Children a test started and the helpers seen below them."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.helpers: dict[int, str] = {}


@pytest.fixture
def child() -> Iterator[Children]:
    """Whatever a failing test leaves running is killed, helpers included."""
    kids = Children()
    yield kids
    for p in kids.procs:
        if p.poll() is None:
            kids.helpers.update(descendants(p.pid))
            p.kill()
            p.wait()
    for pid in alive(kids.helpers):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_until_ready(kids: Children, code: str, *args: str) -> int:
    """Start ``python -c code args`` (``python code args`` for a file); return its pid once
    it prints ``ready``."""
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    argv = [code] if os.path.isfile(code) else ["-c", textwrap.dedent(code).strip()]
    p = subprocess.Popen(
        [sys.executable, *argv, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    kids.procs.append(p)
    lines = []
    assert p.stdout is not None
    for line in p.stdout:
        lines.append(line)
        if line.strip() == "ready":
            return p.pid
    p.wait()
    raise AssertionError(f"child exited (rc={p.returncode}) before ready:\n{''.join(lines)}")


def kill_and_expect_orphans_gone(kids: Children, pid: int, *, at_least: int) -> dict[int, str]:
    """SIGKILL ``pid``; assert that its descendants (``at_least`` of them) all end."""
    helpers = descendants(pid)
    kids.helpers.update(helpers)
    named = alive(helpers)
    assert len(helpers) >= at_least, f"expected >= {at_least} helper processes, saw {named}"
    os.kill(pid, signal.SIGKILL)
    kids.procs[-1].wait()
    deadline = time.monotonic() + GONE_WITHIN
    while alive(helpers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(helpers), f"still alive {GONE_WITHIN:.0f}s after SIGKILL: {alive(helpers)}"
    print(f"{len(helpers)} helpers gone {GONE_WITHIN - (deadline - time.monotonic()):.1f}s after")
    return named


LOADER_CHILD = """
    import sys, threading, time
    import flashfeed.loader.image.image as image
    from flashfeed.loader import Loader

    if sys.argv[2] == "spawn":  # as on GPU machines: DALI spawns its reader processes
        build = image.build_pipeline
        image.build_pipeline = lambda *a, **kw: build(*a, **{**kw, "py_start_method": "spawn"})

    def iterate():
        loader = Loader(sys.argv[1], batch_size=4, device="cpu", py_workers=2,
                        num_threads=1, image_size=16)
        for _ in loader:
            print("ready", flush=True)
            time.sleep(3600)

    if sys.argv[2] == "thread":  # reader processes forked by a thread that is not main
        threading.Thread(target=iterate, daemon=True).start()
        time.sleep(3600)
    else:
        iterate()
"""


@pytest.mark.parametrize("start", ["main", "thread", "spawn"])
def test_dali_reader_processes_die_with_a_killed_loader(tmp_path: Path, child, start) -> None:
    ds = str(tmp_path / "ds")
    make_image_dataset(ds, [16, 16], size=16)
    pid = run_until_ready(child, LOADER_CHILD, ds, start)
    kill_and_expect_orphans_gone(child, pid, at_least=2)
    # the killed loader could not remove its pass folder; the next loader made sweeps it
    left = glob.glob(f"/dev/shm/{PASS_PREFIX}{pid}-*")
    if os.access("/dev/shm", os.W_OK):
        assert len(left) == 1, left
    runner = stub_runner()
    try:
        assert not any(os.path.exists(p) for p in left), left
    finally:
        runner.close()


SHARD_DATASET_CHILD = """
    import sys, time
    from flashfeed.loader import ShardDataset

    ds = ShardDataset(sys.argv[1], batch_size=4)
    for _ in ds.loader(num_workers=2):
        print("ready", flush=True)
        time.sleep(3600)
"""


def test_dataloader_workers_die_with_a_killed_trainer(tmp_path: Path, child) -> None:
    ds = str(tmp_path / "ds")
    make_image_dataset(ds, [16, 16], size=16)
    pid = run_until_ready(child, SHARD_DATASET_CHILD, ds)
    kill_and_expect_orphans_gone(child, pid, at_least=2)


STORE_CHILD = """
    import sys, threading, time
    from flashfeed.store import EmbeddedStore

    store = EmbeddedStore(sys.argv[1], port=0)
    if sys.argv[2] == "thread":  # started by a short-lived thread: must outlive the thread
        t = threading.Thread(target=store.start)
        t.start()
        t.join()
        time.sleep(1.0)
        assert store.pid_alive() and store.ready(), "the store died with its thread"
    else:
        store.start()
    print("ready", flush=True)
    time.sleep(3600)
"""


@pytest.mark.parametrize("thread", ["main", "thread"])
def test_embedded_store_dies_with_the_process_that_started_it(
    tmp_path: Path, child, thread
) -> None:
    pid = run_until_ready(child, STORE_CHILD, str(tmp_path / "store"), thread)
    named = kill_and_expect_orphans_gone(child, pid, at_least=1)
    assert any("weed" in cmd for cmd in named.values()), named


RAY_CHILD = """
    import sys, time
    from flashfeed.ingest.raysetup import ray_map, ray_session

    with ray_session(num_cpus=1):
        assert ray_map(abs, [-1, -2]) == [1, 2]
        print("ready", flush=True)
        time.sleep(3600)
"""


def test_embedded_ray_dies_with_the_ingest_driver(child) -> None:
    pid = run_until_ready(child, RAY_CHILD)
    named = kill_and_expect_orphans_gone(child, pid, at_least=2)
    assert any("raylet" in cmd for cmd in named.values()), named
    # its session folder outlived it; the next embedded Ray's folder sweeps it
    left = glob.glob(f"/tmp/{RAY_PREFIX}{pid}-*")
    assert len(left) == 1, left
    remove_owned(make_owned_dir(RAY_PREFIX, "/tmp"), RAY_PREFIX)
    assert not os.path.exists(left[0])


SPAWN_CHILD = """
    import multiprocessing as mp, time
    from flashfeed.runtime.lifeline import ParentLink

    def work(link):
        time.sleep(3600)

    if __name__ == "__main__":
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=work, args=(ParentLink(),)) for _ in range(2)]
        for p in procs:
            p.start()
        time.sleep(2.0)  # the workers have imported and unpickled their link
        print("ready", flush=True)
        time.sleep(3600)
"""


def test_spawned_workers_holding_a_parent_link_die_with_their_parent(tmp_path: Path, child) -> None:
    script = tmp_path / "spawner.py"  # spawn re-imports __main__: it must be a file
    script.write_text(textwrap.dedent(SPAWN_CHILD))
    pid = run_until_ready(child, str(script))
    kill_and_expect_orphans_gone(child, pid, at_least=2)
