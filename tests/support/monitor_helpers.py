"""Two training ranks as processes over a small image dataset, for the monitoring tests."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flashfeed.runtime.lifeline import popen

from support.loader_helpers import make_image_dataset

WORKER = str(Path(__file__).with_name("monitor_worker.py"))


@dataclass
class Ranks:
    url: str
    cache_dir: str
    run_dir: str
    ports: list[int]
    procs: list[Any]


def wait_for(what: str, check: Callable[[], Any], *, timeout: float = 180.0) -> Any:
    """Poll ``check`` until it returns something true; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.3)


@contextmanager
def running_ranks(tmp: Path, *, ranks: int = 2, prometheus: bool = False) -> Iterator[Ranks]:
    """``ranks`` loader processes on one node cache, reading epoch after epoch until the
    block ends (they are killed then, and die with this process in any case)."""
    url = str(tmp / "ds")
    make_image_dataset(url, [24] * 6, size=16)
    cache_dir, run_dir = str(tmp / "cache"), str(tmp / "run")
    os.makedirs(run_dir, exist_ok=True)
    procs, port_files = [], []
    try:
        for rank in range(ranks):
            port_file = str(tmp / f"port{rank}") if prometheus else None
            port_files.append(port_file)
            cfg = {
                "url": url,
                "rank": rank,
                "world_size": ranks,
                "cache_dir": cache_dir,
                "stats_log": os.path.join(run_dir, f"rank{rank}.jsonl"),
                "port_file": port_file,
            }
            log = open(tmp / f"worker{rank}.log", "wb")
            procs.append(popen([sys.executable, WORKER, json.dumps(cfg)], stdout=log, stderr=log))
            log.close()

        def ports() -> list[int] | None:
            for p, rank in zip(procs, range(ranks), strict=True):
                if p.poll() is not None:
                    raise AssertionError(
                        f"rank {rank} exited: {(tmp / f'worker{rank}.log').read_text()[-2000:]}"
                    )
            if not prometheus:
                return [0] * ranks
            if not all(os.path.exists(f) for f in port_files if f):
                return None
            return [int(Path(f).read_text()) for f in port_files if f]

        found = wait_for("the ranks to start", ports)
        yield Ranks(url, cache_dir, run_dir, found, procs)
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
