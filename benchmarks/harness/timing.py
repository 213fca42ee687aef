"""How one loader run is timed, the same way for flashfeed and every peer: samples per second
from construction to the first batch after a minimum time (or over one epoch), and the CPU
seconds of the whole process tree per sample."""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

__all__ = [
    "BATCH",
    "batch_len",
    "epoch",
    "first_epoch",
    "first_then_hot",
    "timed",
    "tree_cpu_seconds",
    "whole_epochs",
]

#: samples in a batch; what ``batch_len`` counts for a batch that carries no keys
BATCH = 64


def tree_cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and every live descendant, from /proc:
    a measure of work that the other tenants of a shared machine do not inflate as much as
    wall-clock throughput."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, grew = {os.getpid()}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    return sum(cpu.get(p, 0.0) for p in tree)


def batch_len(batch: Any) -> int:
    """Samples in a batch: a flashfeed/DALI dict (its keys) or a DataLoader's (images, ...)."""
    if isinstance(batch, dict):
        return len(batch["__key__"]) if "__key__" in batch else BATCH
    return len(batch[0])


def timed(make: Callable[[], Iterable[Any]], min_seconds: float) -> tuple[float, float, float]:
    """(images/s, CPU ms per image, seconds): the timer starts before ``make()`` constructs
    the loader and stops at the first batch after ``min_seconds``; epochs repeat until then.
    The same boundaries for every loader, construction included."""
    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    loader = make()
    n = 0
    while True:
        got = 0
        for batch in loader:
            got += batch_len(batch)
            if time.perf_counter() - t0 >= min_seconds:
                break
        n += got
        if not got:
            raise RuntimeError("the loader gave no batch")
        if time.perf_counter() - t0 >= min_seconds:
            break
    wall, cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    del loader
    # tear down now, outside every timer: a pipeline or DataLoader left to a later garbage
    # collection joins its worker processes inside the next row's window (seen: ~10 s)
    gc.collect()
    return n / wall, 1000 * cpu / n, wall


def first_epoch(make: Callable[[], Iterable[Any]]) -> tuple[float, float]:
    """(images/s, CPU ms per image) of one epoch, the timer starting before ``make()``."""
    c0, t0 = tree_cpu_seconds(), time.perf_counter()
    loader = make()
    n = sum(batch_len(b) for b in loader)
    wall, cpu = time.perf_counter() - t0, tree_cpu_seconds() - c0
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    del loader
    gc.collect()
    return n / wall, 1000 * cpu / n


def epoch(make: Callable[[], Iterable[Any]]) -> tuple[float, int]:
    """(images/s, images) of one whole epoch, the timer starting before ``make()``."""
    t0 = time.perf_counter()
    n = sum(batch_len(b) for b in make())
    return n / (time.perf_counter() - t0), n


def whole_epochs(loader: Iterable[Any], min_seconds: float) -> tuple[int, float]:
    """(samples, seconds) of whole epochs of ``loader``, at least one and ``min_seconds``;
    an epoch without a batch is an error (fewer samples than a batch, with ``drop_last``)."""
    t0, n = time.perf_counter(), 0
    while not n or time.perf_counter() - t0 < min_seconds:
        got = sum(batch_len(b) for b in loader)
        if not got:
            raise RuntimeError("an epoch gave no batch: the dataset holds less than a batch")
        n += got
    return n, time.perf_counter() - t0


def first_then_hot(make: Callable[[], Any], *, min_seconds: float) -> dict[str, float]:
    """A loader's first epoch from its construction (samples/s), then its whole hot epochs
    (samples/s and CPU ms per sample of the process tree); closed after."""
    t0 = time.perf_counter()
    loader = make()
    n = sum(batch_len(b) for b in loader)
    first = n / (time.perf_counter() - t0)
    c0 = tree_cpu_seconds()
    n, secs = whole_epochs(loader, min_seconds)
    cpu = tree_cpu_seconds() - c0
    loader.close()
    return {"first": first, "hot": n / secs, "cpu_ms": 1e3 * cpu / n}
