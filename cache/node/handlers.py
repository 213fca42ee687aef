"""What the node service does for each request.

``hello`` names the job; ``open`` checks a proof of access (``access.py``) and grants the
tenant the dataset; ``get`` answers a hit at once with open descriptors of the shard and its
index, and queues a miss for the fill workers (room made in the tenant's quota first);
``pin``, ``warm``, ``prefetch``, ``status``, ``metrics``, ``reload``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from flashfeed.units import format_size

from ..errors import CacheError
from ..progress import FillView, live_path
from .access import AccessRefused, check_presigned
from .accounting import prometheus_text
from .fills import fill_for, needs_fill, queue_fill, wait_for_fill
from .room import QuotaError, warm_fits
from .server import Connection, NodeService

__all__ = ["fill_worker", "serve_fill", "serve_request"]

log = logging.getLogger("flashfeed.node")

#: fills of one read, each evicted by another fill before it was handed over, before the
#: read fails (a cache far too small for its readers)
FILL_ATTEMPTS = 3


class RequestError(Exception):
    """A refused request: ``kind`` for the client, the message one line."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def serve_request(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    """Serve one request (the request loop's turn of ``conn``'s tenant): fast ones at once,
    fills queued for the fill workers."""
    _run(svc, conn, request, _REQUESTS)


def fill_worker(svc: NodeService) -> None:
    while True:
        item = svc.fills.get()
        if item is None:
            return
        serve_fill(svc, *item)


def serve_fill(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    """Run a queued fill request (``get``, ``open``, ``warm``, ``prefetch``, ``verify``)."""
    _run(svc, conn, request, _FILLS)


def _run(svc: NodeService, conn: Connection, request: dict[str, Any], table: dict) -> None:
    op = request.get("op")
    handler = table.get(op)
    try:
        if handler is None:
            raise RequestError("bad", f"unknown request {op!r}")
        handler(svc, conn, request)
    except RequestError as exc:
        conn.reply(request, {"error": str(exc), "kind": exc.kind})
    except QuotaError as exc:
        conn.reply(request, {"error": str(exc), "kind": "quota"})
    except CacheError as exc:  # the cache's own one-line reasons (disk full, corrupt store...)
        conn.reply(request, {"error": str(exc), "kind": "cache"})
    except Exception as exc:  # one request failing must not stop the service
        log.exception("request %s of tenant %s failed", op, conn.tenant)
        conn.reply(request, {"error": f"{type(exc).__name__}: {exc}", "kind": "failed"})


# -- requests (fast: no store I/O) -----------------------------------------------------------
def _hello(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    job = request.get("job") or "default"
    if not isinstance(job, str) or len(job) > 64 or not job.isprintable():
        raise RequestError("bad", f"job must be a short printable name, got {job!r}")
    conn.job = job
    conn.reply(request, {"tenant": conn.tenant, "job": job})


def _resolve(svc: NodeService, conn: Connection, request: dict[str, Any]) -> tuple[Any, int]:
    """The request's dataset (``key``, granted to this tenant) and its ``shard``."""
    dataset = _granted(svc, conn, request.get("key"))
    return dataset, _shard_of(dataset, request.get("shard"))


def _granted(svc: NodeService, conn: Connection, key: Any) -> Any:
    if not isinstance(key, str) or not svc.granted(conn, key):
        raise RequestError("grant", "no grant for this dataset: open it first (again)")
    return svc.datasets[key]


def _shard_of(dataset: Any, shard: Any) -> int:
    n = len(dataset.shards)
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < n:
        raise RequestError("bad", f"shard must be an int in [0, {n}), got {shard!r}")
    return shard


def _get(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    dataset, i = _resolve(svc, conn, request)
    d = svc.cache.dataset_dir(dataset)
    key = (d.key, i)
    present = key in svc.ledger.charges and key not in svc.filling
    present = present and os.path.exists(d.shard_path(i))
    if present and key in svc.verified:  # verified since this service started
        fds = _open_shard(d.shard_path(i))
        if fds is not None:
            svc.ledger.touch(key)
            svc.accounts.add(conn.owner, hits=1)
            _send_shard(conn, request, fds, hit=True)
            return
        present = False  # evicted since the look (another tenant's fill): a miss
    # a miss, or a copy not yet verified since the service started (a checksum of the whole
    # shard: not in the way of other tenants' hits)
    request["_queued"], request["_present"] = time.monotonic(), present
    if not wait_for_fill(svc, conn, request, key):
        queue_fill(svc, conn, request)


def _open_shard(path: str) -> list[int] | None:
    """Descriptors of a cached shard and of its index (when it has one); None when the
    shard was evicted meanwhile. Open, they keep its bytes whatever is evicted next."""
    try:
        fds = [os.open(path, os.O_RDONLY | os.O_CLOEXEC)]
    except FileNotFoundError:
        return None
    try:
        fds.append(os.open(path + ".idx", os.O_RDONLY | os.O_CLOEXEC))
    except FileNotFoundError:
        pass
    return fds


def _send_shard(conn: Connection, request: dict[str, Any], fds: list[int], *, hit: bool) -> None:
    """Hand ``fds`` (``_open_shard``) over, and close them here."""
    try:
        conn.reply(request, {"hit": hit, "index": len(fds) > 1}, fds)
    finally:
        for fd in fds:
            os.close(fd)


def _touch(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    """Reads of shards the client holds already (``shards``): each counted as a hit, its
    use noted; answered only when ``ack`` asks (else the client does not wait)."""
    shards = request.get("shards")
    if not isinstance(shards, list) or len(shards) > 4096:
        raise RequestError("bad", "touch needs a list of at most 4,096 shard numbers")
    dataset = _granted(svc, conn, request.get("key"))
    key = svc.cache.dataset_dir(dataset).key
    for s in shards:
        svc.ledger.touch((key, _shard_of(dataset, s)))
    svc.accounts.add(conn.owner, hits=len(shards))
    if request.get("ack"):  # the client waits until they are counted (its last ones)
        conn.reply(request, {"touched": len(shards)})


def _partial(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    """The fill of a shard running now, as descriptors of its live progress file, its part
    file and its index part (a tar shard's; an Arrow shard is located by its own layout),
    or ``partial: false``: none runs, or a tar shard has no index to locate samples by."""
    dataset, i = _resolve(svc, conn, request)
    d = svc.cache.dataset_dir(dataset)
    view = None
    if (d.key, i) in svc.filling:
        view = FillView.open(live_path(d.parts_dir, i))
    arrow = dataset.manifest.shard_format == "arrow"  # located by its layout, not an index
    if view is None or (view.index_part is None and not arrow):
        if view is not None:
            view.close()
        conn.reply(request, {"partial": False})
        return
    paths = [view.part] if view.index_part is None else [view.part, view.index_part]
    fds: list[int] = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
        fds.insert(0, os.dup(view.fileno()))
    except FileNotFoundError:  # the fill ended meanwhile: the whole shard is there
        conn.reply(request, {"partial": False})
        return
    finally:
        view.close()
        for fd in fds if len(fds) <= len(paths) else ():
            os.close(fd)
    try:
        conn.reply(request, {"partial": True}, fds)
    finally:
        for fd in fds:
            os.close(fd)


def _pin(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    dataset, i = _resolve(svc, conn, request)
    pinned = bool(request.get("pinned", True))
    d = svc.cache.dataset_dir(dataset)
    c = svc.ledger.set_pin((d.key, i), conn.owner, pinned)
    others = c is not None and bool(c.pins)
    (svc.cache.pin if others else svc.cache.unpin)(dataset, i)
    conn.reply(request, {"pinned": pinned, "resident": c is not None})


def _status(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    admin = svc.is_admin(conn)
    report = svc.accounts.report(None if admin else conn.tenant)
    now = time.monotonic()
    mine = {
        k for (t, k), until in svc.grants.items() if until > now and (admin or t == conn.tenant)
    }
    datasets = []
    for key in sorted(mine):
        ds = svc.datasets[key]
        held = [c for (k, _), c in list(svc.ledger.charges.items()) if k == key]
        row = {"url": ds.url, "shards": len(ds.shards), "cached_shards": len(held)}
        if not admin:  # only what this tenant's own jobs hold and pin
            held = [c for c in held if c.owner[0] == conn.tenant]
            row["cached_shards"] = len(held)
        row["bytes"] = sum(c.size for c in held)
        datasets.append(row)
    body: dict[str, Any] = {"tenant": conn.tenant, "job": conn.job, "admin": admin,
                            "report": report, "datasets": datasets}  # fmt: skip
    cfg = svc.config
    body["quota"] = cfg.tenant(conn.tenant).quota
    if admin:
        body.update(capacity=cfg.capacity, used=svc.ledger.used(), disk=svc.cache.used_bytes(),
                    config_error=svc.watch.error, requests=svc.loop.backlog())  # fmt: skip
        if svc.peer is not None:  # the service as a peer: its address, peers and counters
            body["peers"] = {"address": svc.peer.address, "peers": list(svc.peer.tier.peers),
                             **svc.peer.server.counters()}  # fmt: skip
    conn.reply(request, body)


def _metrics(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    report = svc.accounts.report(None if svc.is_admin(conn) else conn.tenant)
    conn.reply(request, {"text": prometheus_text(report)})


def _verify(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    from .adminops import verify_all

    if not svc.is_admin(conn):
        raise RequestError("access", f"tenant {conn.tenant} may not verify the node cache")
    conn.reply(request, verify_all(svc))


def _evict(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    from .adminops import evict_own

    key = request.get("key")
    if key is not None and (not isinstance(key, str) or not svc.granted(conn, key)):
        raise RequestError("grant", "no grant for this dataset: open it first (again)")
    conn.reply(request, evict_own(svc, conn, key))


def _reload(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    if not svc.is_admin(conn):
        raise RequestError("access", f"tenant {conn.tenant} may not reload the node config")
    svc.watch.reload()
    conn.reply(request, {"error_in_config": svc.watch.error})


# -- fills (slow: store I/O, queued per job by weight) ---------------------------------------
def _open(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    url, proof = request.get("url"), request.get("proof")
    if not isinstance(url, str) or not isinstance(proof, str):
        raise RequestError("bad", "open needs a dataset url and a presigned proof")
    url = url.rstrip("/")
    cfg = svc.config
    try:
        check_presigned(proof, url=url, tenant=conn.tenant, store_options=cfg.store or None)
    except AccessRefused as exc:
        log.info("%s", exc)
        raise RequestError("access", str(exc)) from None
    dataset = svc.cache.open_dataset(url)
    d = svc.cache.dataset_dir(dataset)
    now = time.monotonic()
    with svc.lock:
        svc.dirs.setdefault(d.key, d)
        svc.datasets[d.key] = dataset
        for stale in [g for g, until in svc.grants.items() if until <= now]:
            del svc.grants[stale]
        svc.grants[(conn.tenant, d.key)] = now + cfg.grant_seconds
    conn.reply(request, {"key": d.key, "version": dataset.manifest.digest,
                         "shards": len(dataset.shards)})  # fmt: skip


def _fill(
    svc: NodeService, conn: Connection, dataset: Any, i: int, *, what: str
) -> tuple[str, bool]:
    """A verified copy of shard ``i``, filled if needed with room made in the tenant's quota:
    ``(path, fetched here)``."""
    quota = svc.config.tenant(conn.tenant).quota
    return fill_for(svc, conn.owner, quota, dataset, i, what=what)


def _get_fill(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    dataset, i = _resolve(svc, conn, request)
    what = f"shard {i} of {dataset.url}"
    for _ in range(FILL_ATTEMPTS):  # another fill may evict it before it is opened here
        path, fresh = _fill(svc, conn, dataset, i, what=what)
        fds = _open_shard(path)
        if fds is not None:
            break
    else:
        raise RequestError("cache", f"{what} was evicted before it could be handed over, "
                           f"{FILL_ATTEMPTS} times: the node cache is too small for its "
                           "readers")  # fmt: skip
    if request.get("_present") and not fresh:  # there all along: only its first check
        svc.accounts.add(conn.owner, hits=1)
        _send_shard(conn, request, fds, hit=True)
        return
    waited = time.monotonic() - request.get("_queued", time.monotonic())
    svc.accounts.add(conn.owner, misses=1, fill_wait_seconds=waited)
    _send_shard(conn, request, fds, hit=False)


def _warm(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    """Fetch (and with ``pin``, pin for this job) the given shards; fails at once, before
    any fetch, when they cannot all fit in the tenant's quota: of one dataset or several at
    once, a mixture's sources (``keys``, and ``items``: pairs of a key's place in ``keys``
    and a shard, in the order to fetch them)."""
    items = _warm_items(svc, conn, request)
    keys: dict[tuple[str, int], int] = {}
    for dataset, d, s in items:
        keys[(d.key, s)] = dataset.shards[s].bytes
    urls = ", ".join(dict.fromkeys(dataset.url for dataset, _, _ in items))
    what = f"warm of {len(keys)} shards of {urls}"
    quota = svc.config.tenant(conn.tenant).quota
    warm_fits(svc.ledger, conn.tenant, quota, keys, what)
    pin = bool(request.get("pin", True))
    fetched = fetched_bytes = 0
    for dataset, d, s in items:
        if pin:  # pinned first: the next shard's room is never made by evicting this one
            svc.ledger.set_pin((d.key, s), conn.owner, True)
        _, fresh = _fill(svc, conn, dataset, s, what=what)
        if pin:
            svc.ledger.set_pin((d.key, s), conn.owner, True)  # the charge follows the pin
            svc.cache.pin(dataset, s)
        fetched += fresh
        fetched_bytes += dataset.shards[s].bytes if fresh else 0
    conn.reply(request, {"shards": len(keys), "fetched": fetched, "fetched_bytes": fetched_bytes,
                         "bytes": format_size(sum(keys.values()))})  # fmt: skip


def _warm_items(
    svc: NodeService, conn: Connection, request: dict[str, Any]
) -> list[tuple[Any, Any, int]]:
    """``(dataset, its cache folder, shard)`` of a warm request, in its order, each shard
    once; every dataset granted to this connection."""
    granted = [_granted(svc, conn, k) for k in request.get("keys") or []]
    pairs = request.get("items")
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) for p in pairs
    ):
        raise RequestError("bad", "a warm needs items: [dataset, shard] pairs")
    if any(not 0 <= j < len(granted) for j, _ in pairs):
        raise RequestError("bad", f"item datasets must be in [0, {len(granted)})")
    wanted = [(granted[j], s) for j, s in pairs]
    out, seen = [], set()
    for dataset, s in wanted:
        s = _shard_of(dataset, s)
        d = svc.cache.dataset_dir(dataset)
        if (d.key, s) not in seen:
            seen.add((d.key, s))
            out.append((dataset, d, s))
    return out


def _prefetch(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    """A fetch ahead of one shard (a hint): nothing to do, and no waiting, when it is here
    or being filled already, or its asker is gone; failures only logged."""
    try:
        dataset, i = _resolve(svc, conn, request)
        if not conn.alive or not needs_fill(svc, dataset, i):  # moot now: no turn taken
            svc.fills.refund(conn.owner)
            return
        _fill(svc, conn, dataset, i, what=f"fetch ahead of shard {i} of {dataset.url}")
    except (RequestError, QuotaError) as exc:
        log.debug("fetch ahead of tenant %s skipped: %s", conn.tenant, exc)


def _queued(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    queue_fill(svc, conn, request)


def _queue_prefetch(svc: NodeService, conn: Connection, request: dict[str, Any]) -> None:
    """A fetch ahead queues one fill per shard that needs one, behind the job's reads: the
    job weights share fills, and one list never holds a fill worker for all its shards."""
    shards = request.get("shards")
    try:
        dataset = _granted(svc, conn, request.get("key"))
        for s in shards if isinstance(shards, list) else []:
            i = _shard_of(dataset, s)
            if needs_fill(svc, dataset, i):
                queue_fill(svc, conn, {"op": "prefetch", "key": request.get("key"), "shard": i})
    except RequestError as exc:
        log.debug("fetch ahead of tenant %s skipped: %s", conn.tenant, exc)


_REQUESTS = {
    "hello": _hello,
    "touch": _touch,
    "partial": _partial,
    "get": _get,
    "pin": _pin,
    "status": _status,
    "metrics": _metrics,
    "reload": _reload,
    "evict": _evict,
    "open": _queued,
    "verify": _queued,
    "warm": _queued,
    "prefetch": _queue_prefetch,
}
_FILLS = {
    "get": _get_fill,
    "open": _open,
    "warm": _warm,
    "prefetch": _prefetch,
    "verify": _verify,
}
