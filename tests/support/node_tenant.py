"""Tenant processes of the node service tests: run as another Unix user, with that user's
own S3 keys, on this test's venv (``benchmarks.harness.unixusers``), doing one thing and
printing JSON."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from typing import Any

from flashfeed.runtime import lifeline

_HERE = os.path.abspath(__file__)


class Tenant:
    """A Unix user with S3 keys of its own, talking to the node service at ``socket``."""

    #: the file whose actions its processes run (``main``)
    script = _HERE

    def __init__(self, user: str, keys: tuple[str, str], endpoint: str, socket: str) -> None:
        self.user = user
        self.keys = keys
        self.endpoint = endpoint
        self.socket = socket
        pw = pwd.getpwnam(user)
        self.uid, self.gid, self.home = pw.pw_uid, pw.pw_gid, pw.pw_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def env(self, job: str = "default") -> dict[str, str]:
        from benchmarks.harness.unixusers import user_env  # of the test's process only

        return {
            "PATH": "/usr/bin:/bin",
            "HOME": self.home,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.keys[0],
            "AWS_SECRET_ACCESS_KEY": self.keys[1],
            "AWS_DEFAULT_REGION": "us-east-1",
            "FLASHFEED_NODE_SOCKET": self.socket,
            "FLASHFEED_JOB": job,
            "FLASHFEED_CACHE_DIR": os.path.join(self.home, ".cache", "flashfeed"),
            "FLASHFEED_VERIFIED_DIR": os.path.join(self.home, ".cache", "ffverified"),
            "PYTHONDONTWRITEBYTECODE": "1",
            **user_env(os.path.dirname(os.path.dirname(_HERE))),
        }

    def command(self, *args: str) -> list[str]:
        # of the test's process only: this module runs as the tenant too, without benchmarks
        from benchmarks.harness.unixusers import BOOT, SITE, user_python

        python = user_python(self.user)
        if python is None:
            raise RuntimeError(f"no Python that {self.user} may run")
        return [python, "-c", BOOT, SITE, self.script, *args]

    def start(self, *args: str, job: str = "default") -> subprocess.Popen[bytes]:
        """Start ``args`` (see ``main``) as this user; it dies with the test."""
        p = lifeline.popen(self.command(*args), user=self.uid, group=self.gid, cwd="/",
                           env=self.env(job), stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        self.procs.append(p)
        return p

    def run(self, *args: str, job: str = "default", timeout: float = 120) -> dict[str, Any]:
        """Run ``args`` to the end: its JSON answer, with ``rc`` and ``stderr``."""
        p = self.start(*args, job=job)
        out, err = p.communicate(timeout=timeout)
        lines = out.decode().strip().splitlines()
        body = json.loads(lines[-1]) if lines else {}
        return {**body, "rc": p.returncode, "stderr": err.decode(), "stdout": out.decode()}

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()


# -- what a tenant process does ----------------------------------------------------------------
def _epoch(url: str, epochs: str = "1") -> dict[str, Any]:
    from flashfeed.loader import ShardDataset

    ds = ShardDataset(url, shuffle=False)
    keys = []
    for e in range(int(epochs)):
        ds.set_epoch(e)
        keys.append([s["__key__"] for s in ds])
    return {"keys": keys}


def _mix_epoch(first: str, second: str) -> dict[str, Any]:
    """An epoch of a mixture of two datasets: its keys, what each source read through, and
    whether an embedded cache was made beside the service."""
    from flashfeed.loader import ShardDataset
    from flashfeed.plan.mixture import Mixture, Source

    ds = ShardDataset(Mixture((Source(first, 1, "a"), Source(second, 1, "b"))), shuffle=False)
    keys = [s["__key__"] for s in ds]
    sources = ds.source.stats()["sources"]
    held = _service_fds()
    ds.close()
    return {
        "keys": keys,
        "kinds": {name: st["kind"] for name, st in sources.items()},
        "misses": {name: st["misses"] for name, st in sources.items()},
        "held": held,
        "embedded_cache": os.path.exists(os.environ["FLASHFEED_CACHE_DIR"]),
    }


def _service_fds() -> int:
    """Descriptors this process holds of files in a node service's cache."""
    n = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            n += "/store/" in os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return n


def _epoch_close(url: str) -> dict[str, Any]:
    from flashfeed.loader import ShardDataset

    ds = ShardDataset(url, shuffle=False)
    keys = [s["__key__"] for s in ds]
    held = _service_fds()
    ds.close()
    return {"keys": keys, "held": held, "after_close": _service_fds()}


def _get(url: str, shards: str) -> dict[str, Any]:
    import hashlib
    import mmap

    from flashfeed.cache.node import NodeClient, NodeError

    out: dict[str, Any] = {"sha256": {}, "hits": {}}
    client = NodeClient()
    try:
        for s in shards.split(","):
            fd, idx, hit = client.get(url, int(s))
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
                out["sha256"][s] = hashlib.sha256(m).hexdigest()
            os.close(fd)
            if idx is not None:
                os.close(idx)
            out["hits"][s] = hit
    except NodeError as exc:
        out["error"] = str(exc)
        out["error_type"] = type(exc).__name__
    return out


def _try_read(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return {"read": len(f.read())}
    except OSError as exc:
        return {"error": type(exc).__name__}


def _train(url: str, seconds: str, last: str) -> dict[str, Any]:
    """Read shards 0 and 1 over and over for ``seconds`` (through ``NodeShardSource``, as the
    loader does), then shard ``last``: how many reads, and whether each one's bytes held."""
    import hashlib
    import time

    from flashfeed.cache.node import NodeShardSource
    from flashfeed.dataset import Dataset
    from flashfeed.runtime.fdpath import map_readonly

    src = NodeShardSource(Dataset.open(url))
    seen: dict[int, str] = {}
    reads = bad = 0
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        for s in (0, 1):
            with map_readonly(src.local_path(s)) as m:
                digest = hashlib.sha256(m).hexdigest()
            bad += seen.setdefault(s, digest) != digest
            reads += 1
        if reads == 2:
            print(json.dumps({"reading": True}), flush=True)
        time.sleep(0.05)
    src.local_path(int(last))
    return {"reads": reads, "bad": bad, **src.stats()}


def _hold(url: str, shards: str) -> None:
    """Hold descriptors of ``shards`` and wait to be killed."""
    import time

    from flashfeed.cache.node import NodeClient

    client = NodeClient()
    held = [client.get(url, int(s)) for s in shards.split(",")]
    print(json.dumps({"held": len(held)}), flush=True)
    time.sleep(600)


def _flood(url: str, shard: str, n: str) -> dict[str, Any]:
    """Send ``n`` reads of one shard without waiting for any answer, then one status
    request (answered after the flood, its requests being this tenant's, served in order)."""
    import time

    from flashfeed.cache.node import NodeClient

    client = NodeClient()
    os.close(client.get(url, int(shard))[0])
    print(json.dumps({"start": time.time()}), flush=True)
    for _ in range(int(n)):
        client.call({"op": "get", "shard": int(shard)}, url=url, wait=False)
    print(json.dumps({"sent": time.time()}), flush=True)
    client.status()
    return {"end": time.time()}


def _hits(url: str, shard: str, k: str, go: str) -> dict[str, Any]:
    """Connect, read once, say so, wait for the file ``go``, then read ``k`` times."""
    import time

    from flashfeed.cache.node import NodeClient

    client = NodeClient()
    os.close(client.get(url, int(shard))[0])
    print(json.dumps({"ready": True}), flush=True)
    while not os.path.exists(go):
        time.sleep(0.005)
    start = time.time()
    for _ in range(int(k)):
        fd, idx, _ = client.get(url, int(shard))
        os.close(fd)
        if idx is not None:
            os.close(idx)
    return {"start": start, "end": time.time()}


def _fill_in_progress(src: Any, s: int) -> tuple[Any, Any, list[str]]:
    """Start reading shard ``s`` in a thread and, meanwhile, take its fill in progress
    (None once the read ended without one): ``(partial, reader thread, [its path])``."""
    import threading
    import time

    whole: list[str] = []
    reader = threading.Thread(target=lambda: whole.append(src.local_path(s)))
    reader.start()
    got = None
    deadline = time.monotonic() + 20
    while got is None and reader.is_alive() and time.monotonic() < deadline:
        got = src.partial(s)
        time.sleep(0.01)
    if got is None:
        reader.join()
    return got, reader, whole


def _partial(url: str, shard: str) -> dict[str, Any]:
    """Start reading ``shard`` (a slow fill) and, meanwhile, take its fill in progress from
    the service: what it held then, and its bytes once the fill is done."""
    import hashlib

    from flashfeed.cache.node import NodeShardSource
    from flashfeed.dataset import Dataset
    from flashfeed.runtime.fdpath import map_readonly

    s = int(shard)
    src = NodeShardSource(Dataset.open(url))
    got, reader, whole = _fill_in_progress(src, s)
    if got is None:
        return {"partial": False}
    early = got.progress.done(0, got.progress.size)
    reader.join()
    with map_readonly(got.part) as m:
        streamed = hashlib.sha256(m).hexdigest()
    with map_readonly(whole[0]) as m:
        final = hashlib.sha256(m).hexdigest()
    return {"partial": True, "samples": len(got.index), "complete_at_first": early,
            "ended": got.progress.ended(), "streamed": streamed, "final": final}  # fmt: skip


def _partial_arrow(url: str, shard: str) -> dict[str, Any]:
    """Read ``shard`` of an Arrow dataset (a slow fill) and, meanwhile, take its fill in
    progress: the record batches located then, and whether the fill had ended by then."""

    from flashfeed.cache.node import NodeShardSource
    from flashfeed.dataset import Dataset

    s = int(shard)
    src = NodeShardSource(Dataset.open(url))
    got, reader, _ = _fill_in_progress(src, s)
    if got is None:
        return {"partial": False}
    layout = got.located()
    early = got.progress.done(0, got.progress.size)
    again = src.partial(s)  # asked again while it runs: no round trip, the same fill
    reader.join()
    return {"partial": True, "batches": 0 if layout is None else layout.num_batches,
            "rows": 0 if layout is None else int(layout.rows[-1]),
            "complete_at_first": early, "again": again is not None}  # fmt: skip


def _token_epoch(url: str) -> dict[str, Any]:
    """One epoch of ``TokenLoader`` through the service: each row's first token."""
    from flashfeed.loader import TokenLoader

    loader = TokenLoader(url, batch_size=4, dtype=None, device="cpu", shuffle=False)
    first = [int(t) for b in loader for t in b["tokens"][:, 0]]
    loader.close()
    return {"first": first}


def _dali_epoch(url: str) -> dict[str, Any]:
    """One eval epoch of the DALI ``Loader``: the keys its batches carry, with their labels."""
    from flashfeed.loader import Loader

    loader = Loader(url, batch_size=8, image_size=16, shuffle=False, train=False, drop_last=False)
    keys: list[str] = []
    labels: list[int] = []
    for batch in loader:
        keys += list(batch["__key__"])
        labels += [int(x) for x in batch["label"]]
    return {"keys": keys, "labels": labels}


def _cli(*args: str) -> dict[str, Any]:
    from flashfeed.cli.app import main

    return {"cli_rc": main(list(args))}


def main() -> None:
    what, *args = sys.argv[1:]
    table = {
        "dali-epoch": _dali_epoch,
        "partial": _partial,
        "partial-arrow": _partial_arrow,
        "token-epoch": _token_epoch,
        "flood": _flood,
        "hits": _hits,
        "train": _train,
        "hold": _hold,
        "epoch": _epoch,
        "epoch-close": _epoch_close,
        "mix-epoch": _mix_epoch,
        "get": _get,
        "try-read": _try_read,
        "cli": _cli,
    }
    print(json.dumps(table[what](*args)), flush=True)


if __name__ == "__main__":
    main()
