"""A closed or dropped loader lets go of its shards' memory maps at once.

A map keeps its file's pages in memory, and a file unlinked meanwhile (a shard the node cache
evicted, a cache emptied for the next run) keeps its disk blocks while it is mapped. These
tests read ``/proc/self/maps`` of this process: what the kernel says is mapped, not what the
loader says it holds. Garbage collection stays off while a loader is dropped: a reference
cycle would keep it (and its maps) until a full collection, which may come much later.
"""

from __future__ import annotations

import gc
import os
import weakref
from contextlib import contextmanager

import pytest

from flashfeed.loader import Loader, TokenLoader

from support.loader_helpers import make_image_dataset, make_token_dataset
from support.token_cold import cold_cache

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/maps"), reason="reads this process's maps from /proc"
)


def mapped_under(folder: str) -> set[str]:
    """Files under ``folder`` this process maps now (an unlinked one ends in " (deleted)")."""
    with open("/proc/self/maps") as f:
        fields = [line.split(None, 5) for line in f]
    paths = {x[5].strip() for x in fields if len(x) == 6}
    return {p for p in paths if p.startswith(folder) and "manifest-" not in p}


@contextmanager
def no_collection():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def test_token_loader_close_unmaps_its_shards_and_a_later_pass_reads_them_again(tmp_path):
    prefix = str(tmp_path / "tokens")
    make_token_dataset(prefix, [96, 80, 64], seq_len=16, batch_bytes=1 << 10)
    loader = TokenLoader(prefix, batch_size=8, seed=1)
    first = [k for b in loader for k in b["__key__"]]
    assert mapped_under(prefix)  # the pass mapped them: the check below can fail
    loader.close()
    assert mapped_under(prefix) == set()
    again = [k for b in loader for k in b["__key__"]]
    assert sorted(again) == sorted(first) and len(first) == 240
    loader.close()


def test_image_loader_close_unmaps_its_shards(tmp_path):
    prefix = str(tmp_path / "images")
    make_image_dataset(prefix, [24, 24, 16], size=32)
    loader = Loader(prefix, batch_size=8, image_size=32, seed=1)
    n = sum(len(b["__key__"]) for b in loader)
    assert n == 64 and mapped_under(prefix)
    loader.close()
    assert mapped_under(prefix) == set()
    with pytest.raises(RuntimeError, match=r"is closed .* make a new Loader"):
        iter(loader)


def test_a_cold_token_loader_closed_mid_pass_unmaps_the_part_files(s3_prefix, proxy, tmp_path):
    make_token_dataset(s3_prefix, [400, 400], seq_len=64, batch_bytes=8 << 10)
    ds, cache = cold_cache(s3_prefix, proxy, tmp_path, delay=0.01, part="8KiB")
    loader = TokenLoader(ds, batch_size=8, cache=cache, seed=0)
    it = iter(loader)
    for _ in range(3):
        next(it)
    root = str(tmp_path / "cache")
    assert mapped_under(root)  # still arriving: read from the maps of their part files
    it.close()
    loader.close()
    assert not {p for p in mapped_under(root) if not p.endswith(".live")}
    for shard in range(len(ds.shards)):  # the fills go on (the cache's); once they end,
        cache.get(ds, shard)  # their progress files (".live") are unmapped too
    assert mapped_under(root) == set()


@pytest.mark.parametrize("kind", ["tokens", "images"])
def test_a_dropped_loader_is_freed_without_a_garbage_collection(kind, tmp_path):
    prefix = str(tmp_path / kind)
    with no_collection():
        if kind == "tokens":
            make_token_dataset(prefix, [64, 48], seq_len=16, batch_bytes=1 << 10)
            loader: TokenLoader | Loader = TokenLoader(prefix, batch_size=8, seed=0)
        else:
            make_image_dataset(prefix, [16, 16], size=32)
            loader = Loader(prefix, batch_size=8, image_size=32, seed=0)
        assert sum(len(b["__key__"]) for b in loader) in (112, 32)
        assert mapped_under(prefix)
        gone = weakref.ref(loader)
        del loader
        assert gone() is None
        assert mapped_under(prefix) == set()
