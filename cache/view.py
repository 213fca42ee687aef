"""``DatasetView``: one dataset's shards in a cache, as a reader sees them (no fetch, no lock).

A loader's reader processes and ``DataLoader`` workers hold a view (it pickles): a shard
the cache already holds is opened directly, and a shard still arriving is read from its
part file as its bytes land, without a ``ShardCache`` in that process. Only a shard the
cache lacks needs one (``CacheHandle.open``). A tar shard is located by its ``.idx``; an
Arrow shard by the record batch layout its schema message records
(``flashfeed.format.arrowlayout``), or, when it records none, by walking its messages as they
land (``flashfeed.format.ipcwalk``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flashfeed.format.arrowlayout import PREFIX, BatchLayout, head_size, read_layout
from flashfeed.format.ipcwalk import IpcWalk, start_walk
from flashfeed.format.wdsindex import SampleIndex, parse_index
from flashfeed.runtime.fdpath import open_binary

from .progress import FillView, live_path

if TYPE_CHECKING:
    from flashfeed.dataset import Dataset

__all__ = ["DatasetView", "PartialShard", "arrow_partial"]


@dataclass(frozen=True)
class PartialShard:
    """A fill running now: its part file (full size, filled as parts arrive), the shard's
    index (tar) or record batch layout (Arrow, ``index`` empty: the one its schema records,
    else ``walk``, the messages walked as they land) and the fill's progress (close it when
    done with it)."""

    part: str
    index: list[SampleIndex]
    progress: FillView
    layout: BatchLayout | None = None
    walk: IpcWalk | None = None

    def located(self) -> BatchLayout | None:
        """The record batches located now: all of them when the schema records them, else
        those whose headers have landed (the walk goes on first). None for a tar shard."""
        walk = self.walk
        if walk is None:
            return self.layout
        if not walk.ended:
            try:
                walk.advance(lambda lo, hi: _pread(self.part, hi - lo, lo), self.progress.done)
            except FileNotFoundError:  # the fill ended: renamed into place, or failed
                pass
        return walk.layout()


class DatasetView:
    """The shards of ``dataset`` in the cache directory ``data_dir`` (fills in ``parts_dir``)."""

    def __init__(self, dataset: Dataset, data_dir: str, parts_dir: str) -> None:
        self.dataset = dataset
        self.data_dir = data_dir
        self.parts_dir = parts_dir

    def _path(self, shard: int) -> str:
        return os.path.join(self.data_dir, self.dataset.shards[shard].path)

    def ready_path(self, shard: int) -> str | None:
        """The cached copy's path if the shard is complete now (no fetch, no wait)."""
        path = self._path(shard)
        return path if os.path.exists(path) else None

    def cached_index(self, shard: int) -> list[SampleIndex] | None:
        """The ``.idx`` entries kept beside a cached shard, or None when there are none."""
        path = self._path(shard) + ".idx"
        try:
            with open(path, "rb") as f:
                return parse_index(f.read(), source=path)
        except FileNotFoundError:
            return None

    def partial(self, shard: int) -> PartialShard | None:
        """A fill of ``shard`` running now in any process of the node. None when the shard
        is complete, no fill runs, or the dataset has no index to locate samples with."""
        final = self._path(shard)
        if os.path.exists(final):
            return None
        view = FillView.open(live_path(self.parts_dir, shard))
        if view is None:
            return None
        if view.index_part is None:
            if self.dataset.manifest.shard_format == "arrow":
                info = self.dataset.shards[shard]
                return arrow_partial(view, info.path, info.samples)
            view.close()
            return None
        while not view.index_ready():  # the index is one small GET beside the first parts
            if view.ended():
                view.close()
                return None
            time.sleep(0.002)
        for path in (view.index_part, final + ".idx"):
            try:
                with open(path, "rb") as f:
                    return PartialShard(view.part, parse_index(f.read(), source=path), view)
            except FileNotFoundError:
                continue
        view.close()
        return None


def arrow_partial(view: FillView, name: str, rows: int) -> PartialShard | None:
    """An Arrow shard's fill, once its schema message (the first bytes) has landed: with
    the layout it records, else with a walk of its messages (a shard of ``rows`` rows);
    None when it is no IPC file (the shard is read whole), or the fill ends (or the shard
    is renamed into place) first."""
    size: int | None = None
    try:
        while not view.ended():
            since = view.marks()  # woken by the next mark of a fill in this process
            if size is None and view.done(0, PREFIX):
                size = head_size(_pread(view.part, PREFIX), name=name)
                if size is None:
                    break
            if size is not None and view.done(0, size):
                head = _pread(view.part, size)
                layout = read_layout(head, name=name, size=view.size)
                if layout is not None:
                    return PartialShard(view.part, [], view, layout)
                walk = start_walk(head, name=name, size=view.size, rows=rows)
                return PartialShard(view.part, [], view, walk=walk)
            view.wait_marked(since, 0.002)
    except FileNotFoundError:  # renamed into place meanwhile: the whole shard is there
        pass
    view.close()
    return None


def _pread(path: str, size: int, offset: int = 0) -> bytes:
    """``size`` bytes at ``offset``; a ``/proc/self/fd/N`` path (a descriptor a node service
    handed over, of a file this user may not open by name) is read through its descriptor."""
    with open_binary(path) as f:
        return os.pread(f.fileno(), size, offset)
