"""Node service quotas and fill shares: two tenants (real Unix users, told apart by the
service through ``SO_PEERCRED``) with equal quotas, each reading a dataset larger than its
quota through one node service whose cache is smaller than both datasets, for 3 epochs at
once, the store behind a proxy that passes a fixed number of bytes a second (fills are
bandwidth-bound). One run per pair of job weights (``--weights 1:1,2:1``), each on a cold
cache of its own. The loaders fetch a fixed number of shards ahead (``--readahead``,
default half the quota; ``auto`` sizes it from what each measures), so both keep fills
queued: the shares show the service's scheduling, not the read-ahead's sizing.

  quota   each tenant's resident bytes (the admin's ``status``, sampled through the run)
          against its quota, in shards over (the goal: within one shard)
  share   each tenant's share of the store bytes while both read their cold first epoch,
          against its job's share of the weights (the goal: a ratio within 0.90-1.10); also
          in the middle half of that span (its start and end are ramps: one loader's first
          fetches ahead go out before the other's, one ends its epoch first)

Also per tenant: store bytes per epoch, evictions suffered and caused, and the bytes of
evicted shards its loader still held open (their disk space returns when it lets go).
Prints tables and writes JSON. Not a timed test: run it by hand, as root (it makes the two
users if missing and removes those it made).

    python -m benchmarks.stages.nodequota --shards 32 --shard-size 1MiB --rate 2MiB \\
        --out .bench/nodequota.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.harness.datasets import random_dataset
from benchmarks.harness.nodeservice import NodeServiceProc, held_evicted_bytes
from benchmarks.harness.quotafigures import print_tables, run_figures, weights_arg
from benchmarks.harness.results import write_json
from benchmarks.harness.slowproxy import SlowProxy
from benchmarks.harness.store import start_store
from benchmarks.harness.unixusers import UserProgram, unix_users
from flashfeed.cache.node import NodeClient
from flashfeed.units import parse_size

TENANT = str(Path(__file__).resolve().parents[1] / "harness" / "quotatenant.py")
JOB = "train"


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--shards", type=int, default=32, help="shards of each tenant's dataset")
    p.add_argument("--shard-size", default="1MiB")
    p.add_argument("--per-shard", type=int, default=4, help="samples a shard")
    p.add_argument("--quota-shards", type=int, default=None, help="default: half a dataset")
    p.add_argument(
        "--capacity-shards",
        type=int,
        default=None,
        help="the node cache's capacity (default: both quotas and 4 shards)",
    )
    p.add_argument("--rate", default="2MiB", help="store bytes a second, over all fills")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument(
        "--readahead",
        default=None,
        help="shards each loader fetches ahead, or auto (default: half the quota)",
    )
    p.add_argument("--weights", type=weights_arg, default=weights_arg("1:1,2:1"))
    p.add_argument("--users", default="ffquotaa,ffquotab", help="the two tenants' users")
    p.add_argument("--sample-every", type=float, default=0.1, help="seconds between samples")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    args.users = tuple(args.users.split(","))
    if len(args.users) != 2 or len(set(args.users)) != 2:
        p.error(f"--users must name two different users, got {args.users!r}")
    args.shard_bytes = parse_size(args.shard_size, name="--shard-size")
    args.rate_bytes = parse_size(args.rate, name="--rate")
    quota = args.quota_shards if args.quota_shards is not None else args.shards // 2
    capacity = args.capacity_shards if args.capacity_shards is not None else 2 * quota + 4
    if not 0 < quota < args.shards:
        p.error(f"--quota-shards must be in 1..{args.shards - 1} (below a dataset), got {quota}")
    if not 2 * quota <= capacity < 2 * args.shards:
        p.error(
            f"--capacity-shards must hold both quotas and less than both datasets "
            f"({2 * quota}..{2 * args.shards - 1}), got {capacity}"
        )
    args.quota_shards, args.capacity_shards = quota, capacity
    args.readahead = args.readahead or str(max(1, quota // 2))
    if args.readahead != "auto" and not args.readahead.isdigit():
        p.error(f"--readahead must be a number of shards or auto, got {args.readahead!r}")
    return args


def _tenant_stores(users: tuple[str, ...]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One S3 identity and bucket per tenant (it may read its own bucket only)."""
    identities, keys = [], {}
    for i, user in enumerate(users):
        bucket = f"ffquota{i}"
        keys[user] = (f"key{user}", f"secret-{user}-{os.urandom(6).hex()}", bucket)
        identities.append(
            {
                "name": user,
                "credentials": [{"accessKey": keys[user][0], "secretKey": keys[user][1]}],
                "actions": [f"Read:{bucket}", f"List:{bucket}"],
            }
        )
    return identities, keys


def _lines(proc: subprocess.Popen[bytes], into: list[dict[str, Any]]) -> threading.Thread:
    """A thread appending each JSON line the tenant prints to ``into``."""

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                into.append(json.loads(line))
            except ValueError:
                pass

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def _sampler(
    svc: NodeServiceProc,
    proxy: SlowProxy,
    needles: dict[str, str],
    pids: dict[str, int],
    every: float,
) -> tuple[list[dict[str, Any]], threading.Event]:
    """Samples, every ``every`` seconds until the event is set: each tenant's resident bytes
    (the admin's view of the service), its store bytes so far, the evicted bytes it holds."""
    samples: list[dict[str, Any]] = []
    stop = threading.Event()
    client = NodeClient(svc.socket, reconnect_timeout=5)
    cache_dir = str(svc.config["cache_dir"])

    def run() -> None:
        while not stop.is_set():
            t = time.time()
            st = client.status()
            resident = dict.fromkeys(needles, 0)
            evicted = dict.fromkeys(needles, 0)
            for row in st["report"]["rows"]:
                if row["tenant"] in resident:
                    resident[row["tenant"]] += int(row["resident_bytes"])
                    evicted[row["tenant"]] += int(row["evictions_suffered"])
            samples.append(
                {
                    "t": t,
                    "resident": resident,
                    "evicted": evicted,
                    "used": st["used"],
                    "disk": st["disk"],
                    "fetched": {u: proxy.sent_bytes(n) for u, n in needles.items()},
                    "held_evicted": {u: held_evicted_bytes(p, cache_dir) for u, p in pids.items()},
                }
            )
            stop.wait(every)
        client.close()

    threading.Thread(target=run, daemon=True).start()
    return samples, stop


def _run(
    args: argparse.Namespace,
    base: str,
    weights: tuple[float, float],
    *,
    store: dict[str, Any],
    proxy: SlowProxy,
    keys: dict[str, Any],
    urls: dict[str, str],
) -> dict[str, Any]:
    """Both tenants' epochs at once through a fresh node service with these job weights."""
    users = args.users
    quota = args.quota_shards * args.shard_bytes
    w = dict(zip(users, weights, strict=True))
    svc = NodeServiceProc(
        base,
        {
            "cache_dir": os.path.join(base, "cache"),
            "capacity": args.capacity_shards * args.shard_bytes,
            "store": {**store, "endpoint_url": proxy.endpoint},
            "admins": ["root"],
            "default_quota": "0",
            "tenants": {u: {"quota": quota, "jobs": {JOB: {"weight": w[u]}}} for u in users},
        },
    )
    svc.start()
    procs: dict[str, subprocess.Popen[bytes]] = {}
    out: dict[str, list[dict[str, Any]]] = {u: [] for u in users}
    stop = threading.Event()
    go = os.path.join(base, "go")
    try:
        for i, user in enumerate(users):
            key, secret, _ = keys[user]
            home = os.path.expanduser(f"~{user}")
            env = {
                "AWS_ENDPOINT_URL": proxy.endpoint,
                "AWS_ACCESS_KEY_ID": key,
                "AWS_SECRET_ACCESS_KEY": secret,
                "AWS_DEFAULT_REGION": "us-east-1",
                "FLASHFEED_NODE_SOCKET": svc.socket,
                "FLASHFEED_JOB": JOB,
                "FLASHFEED_CACHE_DIR": os.path.join(home, ".cache", "flashfeed"),
            }
            with open(os.path.join(base, f"{user}.err"), "wb") as err:
                procs[user] = UserProgram(user, env).start(
                    TENANT,
                    urls[user],
                    str(args.epochs),
                    str(i),
                    go,
                    args.readahead,
                    stdout=subprocess.PIPE,
                    stderr=err,
                )
            _lines(procs[user], out[user])
        deadline = time.monotonic() + 60
        while not all(any(m.get("ready") for m in out[u]) for u in users):
            dead = [u for u in users if procs[u].poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"tenant {dead or users} did not start: {_err(base, users)}")
            time.sleep(0.02)
        pids = {u: int(next(m["pid"] for m in out[u] if m.get("ready"))) for u in users}
        needles = {u: f"/{keys[u][2]}/" for u in users}
        samples, stop = _sampler(svc, proxy, needles, pids, args.sample_every)
        time.sleep(2 * args.sample_every)  # a sample before the first fill
        Path(go).touch()
        end = time.monotonic() + args.timeout
        for user, p in procs.items():
            p.wait(max(1.0, end - time.monotonic()))
            if p.returncode != 0:
                raise RuntimeError(f"tenant {user} failed (rc {p.returncode}): {_err(base, users)}")
        time.sleep(2 * args.sample_every)
        stop.set()
        time.sleep(2 * args.sample_every)
        with NodeClient(svc.socket, reconnect_timeout=5) as client:
            final = client.status()["report"]["rows"]
    finally:
        stop.set()
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        svc.stop()
    return run_figures(args, w, samples, out, final)


def _err(base: str, users: tuple[str, ...]) -> str:
    tails = []
    for u in users:
        try:
            tails.append(f"{u}: " + Path(base, f"{u}.err").read_text(errors="replace")[-1500:])
        except OSError:
            pass
    return " | ".join(tails)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if os.geteuid() != 0:
        raise SystemExit("nodequota runs the service and two tenants' users: run it as root")
    root = tempfile.mkdtemp(prefix="ffnodequota-", dir="/tmp")
    os.chmod(root, 0o755)
    runs = []
    try:
        with unix_users(args.users) as users:
            identities, keys = _tenant_stores(users)
            bench = start_store(
                os.path.join(root, "s3"), bucket=keys[users[0]][2], identities=identities
            )
            proxy = None
            try:
                bench.store.make_bucket(keys[users[1]][2])
                proxy = SlowProxy(("127.0.0.1", bench.store.info.s3_port), rate=args.rate_bytes)
                urls = {}
                for u in users:  # written straight to the store: not paced, not counted
                    urls[u] = f"s3://{keys[u][2]}/ds"
                    random_dataset(
                        urls[u],
                        args.shards,
                        args.shard_bytes,
                        per_shard=args.per_shard,
                        storage_options=bench.opts,
                    )
                for i, weights in enumerate(args.weights):
                    runs.append(
                        _run(
                            args,
                            os.path.join(root, f"run{i}"),
                            weights,
                            store=bench.opts,
                            proxy=proxy,
                            keys=keys,
                            urls=urls,
                        )
                    )
            finally:
                if proxy is not None:
                    proxy.close()
                bench.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print_tables(args, runs)
    if args.out:
        saved = {k: v for k, v in vars(args).items() if k != "weights"}
        write_json(args.out, {"args": {**saved, "weights": args.weights}, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
