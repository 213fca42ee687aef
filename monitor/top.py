"""``flashfeed top``: a live view of one node, from the files its loaders and cache keep.

One row per loader of a training rank (samples/s, the share of time its consumer waited on
storage, decode and host-to-device copies, batches that waited on storage, epoch and
position) and one line for the node cache (hit rate, bytes fetched and the fetch rate, fills
in flight, evictions, throttling, used/capacity). Rates are differences between successive
reads of the status files (``status.py``: the node cache's, and this user's runtime
directory's for loaders reading a local dataset in place) and of the cache's ``stats.json``
over the last few seconds; the first frame shows averages since each loader started.
Nothing is served: the view only reads files, so it needs no port and no access beyond the
cache directory and the runtime directory. With ``FLASHFEED_NODE_SOCKET`` set it also shows
the node service's rows per tenant and job (``nodeview.py``): the asker's own, or every
tenant's for an admin.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO

from flashfeed.telemetry import WAIT_KINDS, default_cache_dir

from .nodeview import NodeView
from .status import (
    NodeCache,
    RankStatus,
    local_status_root,
    read_node_cache,
    read_statuses,
    status_dir,
)

__all__ = ["TopView", "default_cache_dir", "run_top"]

#: rates are measured over at most this many seconds of history
WINDOW_S = 5.0
#: how often the view scans the cache directory for its size when no loader reports it
SCAN_EVERY_S = 5.0
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"


@dataclass
class _History:
    points: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)

    def add(self, t: float, values: dict[str, float]) -> tuple[float, dict[str, float]] | None:
        """Keep ``values`` at time ``t``; return the oldest point within ``WINDOW_S``."""
        if not self.points or self.points[-1][0] != t:
            self.points.append((t, values))
        while len(self.points) > 2 and t - self.points[1][0] >= WINDOW_S:
            self.points.popleft()
        first = self.points[0]
        return first if first[0] < t else None


def _gb(n: float | None) -> str:
    return "?" if n is None else f"{n / 1e9:.3f} GB"


def _pct(x: float) -> str:
    return f"{100 * max(0.0, min(x, 1.0)):5.1f}%"


def _source_line(st: RankStatus) -> list[str]:
    """A mixture's rank: its sources' shares of the samples and storage waits so far."""
    per = st.state.sources
    total = sum(float(v.get("samples", 0)) for v in per.values()) or 1.0
    if not per:
        return []
    return [
        f"{'':>4} {'':>7} sources: "
        + ", ".join(
            f"{name} {100 * float(v.get('samples', 0)) / total:.1f}% "
            f"(storage {float(v.get('storage_s', 0.0)):.1f} s)"
            for name, v in per.items()
        )
    ]


class TopView:
    """Frames of ``flashfeed top`` for one cache directory; keeps the history rates need."""

    def __init__(self, cache_dir: str, *, local_root: str | None = None) -> None:
        self.cache_dir = cache_dir
        # loaders without a node cache keep their status files here (``local_status_root``)
        self.local_root = local_root or local_status_root()
        self._ranks: dict[str, _History] = {}
        self._cache = _History()
        self._scanned: int | None = None
        self._scanned_at = float("-inf")
        node = os.environ.get("FLASHFEED_NODE_SOCKET")
        self.node = NodeView(node) if node else None  # the node service's tenants and jobs

    def frame(self, *, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        statuses = read_statuses(self.cache_dir)
        if os.path.realpath(self.local_root) != os.path.realpath(self.cache_dir):
            statuses += read_statuses(self.local_root)
            statuses.sort(key=lambda s: (s.rank, s.pid))
        used = None
        fresh = [s for s in statuses if s.state.cache.get("used_bytes") is not None]
        if fresh:
            used = max(fresh, key=lambda s: s.updated).state.cache["used_bytes"]
        if used is None and now - self._scanned_at < SCAN_EVERY_S:
            used = self._scanned  # no loader measured it: a scan here, now and then
        try:
            cache: NodeCache | None = None
            if os.path.isdir(self.cache_dir):  # a node whose loaders all read local data
                cache = read_node_cache(self.cache_dir, used_bytes=used)
        except (OSError, ValueError):
            cache = None
        if used is None and cache is not None:
            self._scanned, self._scanned_at = cache.used_bytes, now
        head = (
            f"flashfeed top  node {socket.gethostname()}  cache {self.cache_dir}  "
            + time.strftime("%H:%M:%S", time.localtime(now))
        )
        lines = [head]
        if not statuses:
            lines.append(
                f"no loader status files in {status_dir(self.cache_dir)} or "
                f"{status_dir(self.local_root)}: no loader runs on this node now (loaders "
                f"reading through a node cache write them in the first, "
                f"Loader(..., cache_dir={self.cache_dir!r}); loaders reading a local dataset "
                "in place in the second)"
            )
        else:
            lines.append(
                f"{'RANK':>4} {'PID':>7} {'SAMPLES/S':>10} {'STORAGE':>7} {'DECODE':>7} "
                f"{'H2D':>7} {'WAITED':>7} {'EPOCH':>5}  POSITION"
            )
            live = {s.path for s in statuses}
            for key in [k for k in self._ranks if k not in live]:
                del self._ranks[key]
            several = len({s.dataset for s in statuses}) > 1  # then each row names its own
            for s in statuses:
                lines.append(self._rank_row(s, now) + (f"  {s.dataset}" if several else ""))
                lines += _source_line(s)
        if cache is not None:
            lines.append(self._cache_line(cache, now))
        if self.node is not None:
            lines += self.node.lines()
        return lines

    def _rank_row(self, st: RankStatus, now: float) -> str:
        state = st.state
        values = {"samples": float(state.samples), "elapsed": state.elapsed_s}
        values.update({k: st.wait(k) for k in WAIT_KINDS})
        old = self._ranks.setdefault(st.path, _History()).add(st.updated, values)
        idle = now - st.updated
        if old is None:  # first sight: averages since the loader started
            base = dict.fromkeys(values, 0.0)
            wall = values["elapsed"]
        else:  # over the window; a rank that stopped delivering decays towards 0
            base = old[1]
            wall = (now if idle > 2.0 else st.updated) - old[0]
        span = values["elapsed"] - base["elapsed"]
        rate = (values["samples"] - base["samples"]) / wall if wall > 0 else 0.0
        fractions = [(values[k] - base[k]) / span if span > 0 else 0.0 for k in WAIT_KINDS]
        position = f"batch {state.batch + 1} ({state.epoch_samples} samples)"
        if idle > 2.0:
            position += f"  no batch for {idle:.0f} s"
        return (
            f"{st.rank:>4} {st.pid:>7} {rate:>10.1f} "
            + " ".join(f"{_pct(f):>7}" for f in fractions)
            + f" {state.batches_waited_on_storage:>7} {state.epoch:>5}  "
            + position
        )

    def _cache_line(self, cache: NodeCache, now: float) -> str:
        c = cache.counters
        old = self._cache.add(now, dict(c))
        hits, misses, gbps = c["hits"], c["misses"], 0.0
        if old is not None:  # over the window; all-time hit rate while nothing is read
            t, base = old
            if (hits - base["hits"]) + (misses - base["misses"]) > 0:
                hits, misses = hits - base["hits"], misses - base["misses"]
            gbps = (c["bytes_fetched"] - base["bytes_fetched"]) / 1e9 / (now - t)
        hit = f"hit {_pct(hits / (hits + misses))}" if hits + misses else "hit    -  "
        room = f"used {_gb(cache.used_bytes)} / {_gb(cache.capacity)}"
        return (
            f"cache: {hit}  fetched {_gb(c['bytes_fetched'])} at {gbps:.3f} GB/s  "
            f"fills in flight {cache.fills_in_flight}  evictions {int(c['evictions'])}  "
            f"throttle events {int(c['throttle_events'])}  {room}"
        )


def run_top(
    cache_dir: str,
    *,
    interval: float = 1.0,
    iterations: int | None = None,
    out: IO[str] | None = None,
) -> int:
    """Refresh the view every ``interval`` seconds (``iterations`` frames, None: until
    Ctrl-C). On a terminal each frame replaces the last; elsewhere frames are plain lines
    separated by a blank line. Returns 1 when the last frame found no loader."""
    if interval <= 0:
        raise ValueError(f"--interval must be > 0 seconds, got {interval}")
    if iterations is not None and iterations < 1:
        raise ValueError(f"--iterations must be >= 1, got {iterations}")
    view = TopView(cache_dir)
    if not os.path.isdir(cache_dir) and not read_statuses(view.local_root) and not view.node:
        raise FileNotFoundError(
            f"no cache directory at {cache_dir}: pass the node cache the loaders use "
            "(--cache-dir, or set FLASHFEED_CACHE_DIR)"
        )
    stream = out or sys.stdout
    tty = stream.isatty()
    shown = 0
    while True:
        lines = view.frame()
        found = not any(line.startswith("no loader status files") for line in lines)
        if tty:  # overwrite in place (no blank flash between frames)
            stream.write(HOME + "".join(line + CLEAR_LINE + "\n" for line in lines) + CLEAR_BELOW)
        else:
            stream.write(("\n" if shown else "") + "\n".join(lines) + "\n")
        stream.flush()
        shown += 1
        if iterations is not None and shown >= iterations:
            return 0 if found else 1
        time.sleep(interval)
