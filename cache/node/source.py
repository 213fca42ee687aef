"""``NodeShardSource``: the loader's shards through the node service (``$FLASHFEED_NODE_SOCKET``
or ``node=``), behind the same ``ShardSource`` interface as the embedded cache.

``local_path`` answers ``/proc/self/fd/N``: a descriptor the service handed over for a
verified shard, which the reader maps as it maps a cached file (``flashfeed.runtime.fdpath``).
The source keeps up to ``max_held`` descriptors and reads a shard it holds again without
a round trip (a dataset version's bytes never change; the service is told of such reads
without waiting, a few at a time, for its LRU and the job's hits). So while the service is
away (restarting) the shards held are read on; others wait for it to come back. A
descriptor whose file the service has evicted is closed ``GRACE`` seconds after its path
was last handed out: what a tenant holds on the disk beyond its quota is what its readers
use now, not all it once read. A shard still being filled is read as it lands
(``partial``): the service hands over descriptors of its part file and of the fill's
progress, as the embedded cache's ``DatasetView`` opens them.
"""

from __future__ import annotations

import os
import resource
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from flashfeed.dataset import Dataset
from flashfeed.format.wdsindex import SampleIndex, parse_index
from flashfeed.runtime.fdpath import fd_path

from ..progress import FillView
from ..view import PartialShard, arrow_partial
from .client import NodeClient, NodeUnavailable

__all__ = ["NodeShardSource", "default_max_held"]

#: descriptors a source keeps at least and at most by default (``default_max_held``): well
#: above the shards a reader keeps mapped (16) plus those its read-ahead has in flight, so a
#: path handed out stays valid while used
MIN_HELD, MAX_HELD = 256, 16384
#: the descriptors handed out last that a new one never replaces: their paths may not have
#: been opened yet (a reader maps a path at once; 16 stay mapped, a few more in flight)
RECENT = 64
#: seconds between the requests that tell the service of reads of held shards
TOUCH_EVERY = 0.05
#: seconds a descriptor stays open after its path was last handed out, whatever happens to
#: its file: a reader opens or maps a path as soon as it has it, and from then on needs
#: no descriptor. After that a descriptor of a file the service evicted is closed, at
#: most every ``SWEEP_EVERY`` seconds: kept, it would hold the evicted bytes on the
#: node's disk beyond the tenant's quota until the process ends
GRACE = 5.0
SWEEP_EVERY = 1.0


class NodeShardSource:
    """Shards of ``dataset`` from the node service at ``socket_path`` (picklable: each
    process connects on its own, as job ``job`` of its Unix user)."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        socket_path: str | None = None,
        job: str | None = None,
        storage_options: dict[str, Any] | None = None,
        max_held: int | None = None,
    ) -> None:
        if max_held is None:
            max_held = default_max_held()
        if max_held < 1:
            raise ValueError(f"max_held must be >= 1, got {max_held!r}")
        self.dataset = dataset
        self.url = dataset.url.rstrip("/")
        self.max_held = max_held
        self._args = (socket_path, job, storage_options)
        self.client = NodeClient(socket_path, job=job, storage_options=storage_options)
        self.socket_path = self.client.socket_path
        self._init_local()

    def _init_local(self) -> None:
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self._held: OrderedDict[int, int] = OrderedDict()  # shard -> fd
        self._index: dict[int, list[SampleIndex]] = {}
        self._parts: list[int] = []  # part files of fills handed over (``partial``)
        #: shard -> (live file, part file, its identity, index) of a fill handed over and not
        #: yet seen ended: asked again (the feeder, then the reader's map), no round trip
        self._live: dict[int, tuple[int, int, tuple[int, int], list[SampleIndex] | None]] = {}
        self._hits = self._misses = self._held_reads = 0
        self._closed = False
        self._quota: int | None = None
        self._touched: list[int] = []  # reads of held shards not yet told (``_touch``)
        self._touched_at = time.monotonic()
        self._handed: dict[int, float] = {}  # descriptor -> when its path was last handed out
        self._swept_at = time.monotonic()
        # told when this source is collected or the process exits, if not closed before
        weakref.finalize(self, _tell_touches, self.client, self.url, self._touched)

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "url": self.url, "max_held": self.max_held,
                "_args": self._args, "socket_path": self.socket_path}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        path, job, options = self._args
        self.client = NodeClient(path, job=job, storage_options=options)
        self._init_local()

    def _mine(self) -> None:
        if self._owner != os.getpid() or self._closed:
            # forked, or used again after ``close``: a connection and descriptors of its own
            path, job, options = self._args
            self.client = NodeClient(path, job=job, storage_options=options)
            self._init_local()

    @property
    def capacity(self) -> int | None:
        """The bytes this tenant may hold in the node cache: its quota, asked of the service
        once (None while it is away). A loader sizes its read-ahead by it, as by an embedded
        cache's capacity: fetched further ahead, its own shards would evict each other."""
        if self._quota is None:
            try:
                reply, _ = self.client.call({"op": "status"}, patient=False)
            except NodeUnavailable:
                return None
            self._quota = int(reply.get("quota", 0))
        return self._quota

    def local_path(self, shard: int) -> str:
        self._mine()
        with self._lock:
            held = self._held.get(shard)
            if held is not None:  # verified bytes of this dataset version, whatever since
                self._held.move_to_end(shard)
                self._held_reads += 1
                self._handed[held] = time.monotonic()
        if held is not None:
            self._touch(shard)
            self._sweep()
            return fd_path(held)
        fd, idx, hit = self.client.get(self.url, shard)
        index = None
        if idx is not None:
            try:
                with os.fdopen(idx, "rb") as f:
                    index = parse_index(f.read(), source=f"{self.url} shard {shard} index")
            except BaseException:
                os.close(fd)
                raise
        with self._lock:
            self._hits += hit
            self._misses += not hit
            if index is not None:
                self._index[shard] = index
            old = self._held.get(shard)
            if old is not None and _same_file(old, fd):
                os.close(fd)  # the copy this process holds already: its path stays valid
                self._held.move_to_end(shard)
                self._handed[old] = time.monotonic()
                return fd_path(old)
            self._held[shard] = fd
            self._held.move_to_end(shard)
            self._handed[fd] = time.monotonic()
            while len(self._held) > self.max_held:
                self._close(self._held.pop(self._victim()))
            if old is not None:
                self._close(old)  # replaced by a new copy (evicted and fetched again)
        self._sweep()
        return fd_path(fd)

    def _victim(self) -> int:
        """The held shard to let go of for the new one: the one handed out most recently
        before the last ``RECENT`` (at most a quarter of ``max_held``), whose paths a reader
        may not have opened yet. An epoch reads each shard once: with more shards than
        ``max_held``, letting go of the oldest lets go of the next one needed in a cyclic
        order (none read again without asking), where this keeps the older ones to the next
        epoch whatever the order."""
        recent = min(RECENT, self.max_held // 4)
        if len(self._held) <= recent + 2:
            return next(iter(self._held))  # the oldest
        newest_first = reversed(self._held)
        for _ in range(recent + 1):  # the new one and the ``recent`` handed out before it
            next(newest_first)
        return next(newest_first)

    def _close(self, fd: int) -> None:
        """Close a held descriptor (the lock held)."""
        self._handed.pop(fd, None)
        os.close(fd)

    def _sweep(self) -> None:
        """Close the descriptors of evicted files (no link left) whose paths were last
        handed out over ``GRACE`` seconds ago: shards held, and part files of fills handed
        over. At most once every ``SWEEP_EVERY`` seconds (an ``fstat`` per descriptor)."""
        now = time.monotonic()
        if now - self._swept_at < SWEEP_EVERY:
            return
        with self._lock:
            self._swept_at = now
            stale = {fd for fd, t in self._handed.items() if now - t > GRACE}
            if not stale:
                return
            gone = {fd for fd in stale if _evicted(fd)}
            for shard in [s for s, fd in self._held.items() if fd in gone]:
                del self._held[shard]
            self._parts = [fd for fd in self._parts if fd not in gone]
            for fd in gone:
                self._close(fd)

    def _touch(self, shard: int) -> None:
        """Tell the service of a read of a held shard (its LRU and this job's hits), without
        waiting: gathered, one request at most every ``TOUCH_EVERY`` seconds (a hot epoch
        of small shards would otherwise spend the tenant's requests a second on them)."""
        with self._lock:
            self._touched.append(int(shard))
            now = time.monotonic()
            if now - self._touched_at < TOUCH_EVERY and len(self._touched) < 1024:
                return
            self._touched_at = now
            batch = self._touched[:]
            self._touched.clear()
        _tell_touches(self.client, self.url, batch, wait=False)

    def index(self, shard: int) -> list[SampleIndex]:
        known = self._index.get(shard)
        if known is None:
            self.local_path(shard)
            known = self._index.get(shard)
        if known is None:
            raise ValueError(f"shard {shard} of {self.url} has no index at the node service")
        return known

    def fetch_ahead(self, shards: Sequence[int]) -> None:
        """Ask the service to fetch ``shards`` ahead, except those this process holds: it
        reads them from its descriptors (fetched again, they would evict others for nothing)."""
        self._mine()
        with self._lock:
            wanted = [int(s) for s in shards if int(s) not in self._held]
        if not wanted:
            return
        try:
            self.client.prefetch(self.url, wanted)
        except NodeUnavailable:
            pass  # a hint: the reads themselves wait for the service

    def need(
        self, shard: int, rows: Sequence[int] | np.ndarray, batches: Sequence[int] | np.ndarray
    ) -> None:
        return None

    def set_future(self, shards: Sequence[int]) -> None:
        return None

    def partial(self, shard: int) -> PartialShard | None:
        """The shard's fill running now at the service, read as it lands: descriptors of its
        part file and its progress, and its index (a tar shard's; an Arrow shard's record
        batches are located from its own bytes). None when it is complete here, no fill
        runs, or the service is away."""
        self._mine()
        if shard in self._held:
            return None
        known = self._known_partial(shard)
        if known is not None:
            return known
        got = self.client.partial(self.url, shard)
        if got is None:
            return None
        live, part, idx = got
        view = FillView.from_fd(live)
        index: list[SampleIndex] | None = None
        try:
            if view is None:
                return None
            if idx is not None:  # a tar shard: its index, one small GET beside the first parts
                while not view.index_ready():
                    if view.ended():
                        view.close()
                        return None
                    time.sleep(0.002)
                index = parse_index(_read_fd(idx), source=f"{self.url} shard {shard} index")
        except BaseException:
            if view is not None:
                view.close()
            os.close(part)
            raise
        finally:
            if idx is not None:
                os.close(idx)
        view.part, view.index_part = fd_path(part), None
        with self._lock:  # kept open while a reader may still map it by this path
            self._parts.append(part)
            self._handed[part] = time.monotonic()
            while len(self._parts) > self.max_held:
                self._close(self._parts.pop(0))
            old = self._live.pop(shard, None)
            self._live[shard] = (os.dup(view.fileno()), part, _identity(part), index)
        if old is not None:
            os.close(old[0])
        return self._located(shard, view, index)

    def _located(
        self, shard: int, view: FillView, index: list[SampleIndex] | None
    ) -> PartialShard | None:
        """A tar shard's fill with its index; an Arrow shard's once its schema message has
        landed, with the record batches it locates (``arrow_partial``)."""
        if index is not None:
            return PartialShard(view.part, index, view)
        info = self.dataset.shards[shard]
        return arrow_partial(view, info.path, info.samples)

    def _known_partial(self, shard: int) -> PartialShard | None:
        """The fill of ``shard`` handed over before, while it has not ended (its part file
        is held open in ``_parts`` meanwhile); None otherwise."""
        with self._lock:
            known = self._live.get(shard)
            if known is None:
                return None
            live, part, ident, index = known
            held = part in self._parts and _identity(part) == ident
            if not held or os.fstat(live).st_nlink == 0:
                del self._live[shard]  # ended (in place, or failed): ask the service again
                os.close(live)
                return None
            view = FillView.from_fd(os.dup(live))
            self._handed[part] = time.monotonic()
        if view is None:
            return None
        view.part, view.index_part = fd_path(part), None
        return self._located(shard, view, index)

    def held(self) -> int:
        """Descriptors this process holds now."""
        return len(self._held)

    def close(self) -> None:
        """Close the held descriptors and the connection (a loader's ``close`` does): the
        service may then free what it evicted. Used again, the source connects anew."""
        if not self._closed and self._owner == os.getpid():
            _tell_touches(self.client, self.url, self._touched)  # the last ones, counted
        with self._lock:
            for fd in [*self._held.values(), *self._parts, *(v[0] for v in self._live.values())]:
                os.close(fd)
            self._handed.clear()
            self._held.clear()
            self._parts.clear()
            self._live.clear()
            self._closed = True
        self.client.close()

    def stats(self) -> dict[str, Any]:
        return {"kind": "node", "socket": self.socket_path, "hits": self._hits,
                "misses": self._misses, "held_reads": self._held_reads,
                "held": len(self._held), "reconnects": self.client.reconnects}  # fmt: skip


def default_max_held() -> int:
    """Descriptors a source keeps by default: a quarter of this process's limit on open
    files (``ulimit -n``), within ``MIN_HELD`` (or half the limit) and ``MAX_HELD``. A held
    shard is read again without a round trip; one not held costs a request to the service."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = 4 * MAX_HELD
    return max(min(MIN_HELD, soft // 2), min(MAX_HELD, soft // 4))


def _tell_touches(client: NodeClient, url: str, touched: list[int], *, wait: bool = True) -> None:
    """Send the reads of held shards gathered in ``touched`` (emptied); ``wait``: until the
    service has counted them (a closing source's last ones)."""
    shards = touched[:]
    touched.clear()
    if not shards:
        return
    try:
        client.call({"op": "touch", "shards": shards, "ack": wait}, url=url, wait=wait,
                    patient=False)  # fmt: skip
    except (NodeUnavailable, OSError):
        pass  # away: the held copies are read on all the same


def _read_fd(fd: int) -> bytes:
    chunks: list[bytes] = []
    offset = 0
    while True:
        data = os.pread(fd, 1 << 20, offset)
        if not data:
            return b"".join(chunks)
        chunks.append(data)
        offset += len(data)


def _evicted(fd: int) -> bool:
    """The file of ``fd`` has no name left (the service evicted it)."""
    try:
        return os.fstat(fd).st_nlink == 0
    except OSError:
        return False  # not ours to judge: left as it is


def _identity(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
