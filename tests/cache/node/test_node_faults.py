"""Faults of the node service, with real processes: the service SIGKILLed mid-fill, and a
tenant process killed while holding descriptors."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time

from flashfeed.cache.node import NodeClient


def _parts(node) -> list[str]:
    out = []
    for dirpath, _, names in os.walk(os.path.join(node.cache_dir, "store")):
        if dirpath.endswith(".parts"):
            out += [n for n in names if not n.startswith(".")]
    return out


def _fds(pid: int, cache_dir: str) -> tuple[int, int]:
    """The process's open descriptors of shard files in ``cache_dir`` (complete or being
    filled; not its passing bookkeeping files) and of Unix sockets (its store connections,
    pooled per thread, are TCP: not counted)."""
    with open("/proc/net/unix") as f:
        unix = {line.split()[6] for line in f.read().splitlines()[1:] if len(line.split()) > 6}
    files = sockets = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except FileNotFoundError:
            continue
        shard = f"{os.sep}data{os.sep}" in target or f"{os.sep}.parts{os.sep}" in target
        files += target.startswith(cache_dir + os.sep) and shard
        sockets += target.startswith("socket:[") and target[8:-1] in unix
    return files, sockets


def test_service_killed_mid_fill_readers_go_on_and_the_restart_recovers(
    node, tenants, datasets, node_store
):
    proxy = node_store["proxy"]
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    node.start()
    alice, _ = tenants
    url = datasets["alpha"]
    assert alice.run("get", url, "0,1")["hits"] == {"0": False, "1": False}
    proxy.delay = 3.0  # every shard GET from now on is slow: a fill stays in flight
    try:
        trainer = alice.start("train", url, "6", "5")
        assert json.loads(trainer.stdout.readline()) == {"reading": True}
        filler = alice.start("get", url, "4")
        deadline = time.monotonic() + 10
        while not _parts(node) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _parts(node), "no fill in flight"
        node.kill()  # SIGKILL mid-fill
        assert all(f.endswith((".tar",)) for f in node.store_files())
        assert not any("000004" in f for f in node.store_files())  # nothing partial visible
        time.sleep(1.5)  # the trainer reads on from the descriptors it holds
        proxy.delay = 0.0
        node.start()
        out, err = trainer.communicate(timeout=60)
        got = json.loads(out.decode().splitlines()[-1])
        assert trainer.returncode == 0, err.decode()
        assert got["bad"] == 0 and got["held_reads"] > 0 and got["reconnects"] >= 1
        out, err = filler.communicate(timeout=60)
        assert filler.returncode == 0, err.decode()
        assert "error" not in json.loads(out.decode().splitlines()[-1])
    finally:
        proxy.delay = 0.0
    assert _parts(node) == []  # the dead fill's part file was swept
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        status = admin.status()
    on_disk = node.disk_bytes()
    assert status["used"] == status["report"]["totals"]["resident_bytes"] == on_disk
    charges = os.listdir(os.path.join(node.cache_dir, "state", "charges"))
    assert len(charges) == len(node.store_files())  # no charge for a shard that is not there


def test_tenant_killed_holding_descriptors_leaves_no_descriptor_or_charge(node, tenants, datasets):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    node.start()
    alice, _ = tenants
    url = datasets["alpha"]
    alice.run("get", url, "0,1,2")  # filled: the service's store connections are open
    time.sleep(0.3)
    files, sockets = _fds(node.proc.pid, node.cache_dir)
    holder = alice.start("hold", url, "0,1,2")
    assert json.loads(holder.stdout.readline()) == {"held": 3}
    # the holder's connection; no shard kept open by the service for it
    assert _fds(node.proc.pid, node.cache_dir) == (files, sockets + 1)
    holder.kill()
    holder.wait()
    deadline = time.monotonic() + 5
    while _fds(node.proc.pid, node.cache_dir)[1] > sockets and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _fds(node.proc.pid, node.cache_dir) == (files, sockets)  # its connection closed
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        status = admin.status()
    on_disk = node.disk_bytes()
    assert len(node.store_files()) == 3
    assert status["used"] == status["report"]["totals"]["resident_bytes"] == on_disk
    assert alice.run("get", url, "1,2")["hits"] == {"1": True, "2": True}
    assert status["report"]["totals"]["misses"] == 3


def test_corrupt_cached_file_is_found_after_a_restart_and_fetched_again(node, tenants, datasets):
    node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
    node.start()
    alice, _ = tenants
    url = datasets["alpha"]
    first = alice.run("get", url, "0")["sha256"]["0"]
    node.stop()
    (path,) = node.store_files()
    with open(path, "r+b") as f:  # same size, other bytes: only the checksum tells
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    node.start()
    got = alice.run("get", url, "0")
    assert got["sha256"]["0"] == first  # the tenant got the good bytes
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == first
    assert "corrupt; fetching it again" in node.log_tail()
    with NodeClient(node.socket, reconnect_timeout=5) as admin:
        status = admin.status()
    assert status["used"] == node.disk_bytes()


def test_disk_full_fails_the_fill_in_one_line_and_leaves_nothing_behind(node, tenants, node_store):
    from support.loader_helpers import make_image_dataset

    url = f"s3://ffalpha/big-{os.urandom(3).hex()}"
    make_image_dataset(url, [30] * 4, size=256, storage_options=node_store["admin"])
    os.makedirs(node.cache_dir, mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", node.cache_dir],
                   check=True)  # fmt: skip
    try:
        node.write_config(tenants={"ffnodea": {"quota": "16MiB"}})
        node.start()
        alice, _ = tenants
        got = alice.run("get", url, "0,1,2,3")
        assert got["error"].startswith("disk full (ENOSPC) under cache "), got["error"]
        assert "\n" not in got["error"] and got["error_type"] == "NodeError"
        assert 1 <= len(got["sha256"]) < 4
        assert _parts(node) == []
        with NodeClient(node.socket, reconnect_timeout=5) as admin:
            status = admin.status()
        on_disk = node.disk_bytes()
        assert len(node.store_files()) == len(got["sha256"])
        assert status["used"] == status["report"]["totals"]["resident_bytes"] == on_disk
        assert alice.run("get", url, "0")["hits"] == {"0": True}  # still serving
    finally:
        node.stop()
        subprocess.run(["umount", node.cache_dir], check=False)
