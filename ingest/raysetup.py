"""Ray for ingest: reuse a running Ray, join ``--ray-address``, or start an embedded one
that listens on loopback only, sends no usage stats and keeps its files in a short dir.

An embedded Ray dies with the process that started it, SIGKILL included: Ray ties its raylet
and GCS to the driver, but its agents linger for a minute when the driver is killed, so a
reaper (``flashfeed.runtime.lifeline``) kills every process the embedded Ray started.

An embedded Ray's processes start with Ray's own jemalloc preloaded (``worker_malloc``):
a task worker runs Ray's threads beside the task, and glibc's malloc, fast only in a process
of one thread, cost the tokenizer 5-8% more CPU there than in a process of its own.

Ctrl-C: Ray blocks SIGINT in its own processes and its workers run in their own process
groups, so a terminal's Ctrl-C reaches the driver alone; the command-line entry points then
stop through ``flashfeed.runtime.interrupt`` (one line, exit 130, Ray's processes killed) instead of
raising ``KeyboardInterrupt`` inside Ray's driver code, which can end in a native abort.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from flashfeed.runtime import lifeline
from flashfeed.runtime.interrupt import cleanup_on_interrupt
from flashfeed.runtime.scratch import make_owned_dir, remove_owned

__all__ = ["JEMALLOC_VARIABLE", "ray_jemalloc", "ray_map", "ray_session", "worker_malloc"]

#: the name of an embedded Ray's session folder in /tmp begins with this
RAY_PREFIX = "ffray-"

#: set to 0 to start an embedded Ray's processes with the system's malloc
JEMALLOC_VARIABLE = "FLASHFEED_RAY_JEMALLOC"

_SAFE_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}


def ray_jemalloc() -> str | None:
    """The jemalloc library this Ray build ships (``ray/core/libjemalloc.so``), if any."""
    import ray

    path = os.path.join(os.path.dirname(ray.__file__), "core", "libjemalloc.so")
    return path if os.path.isfile(path) else None


@contextmanager
def worker_malloc() -> Iterator[str | None]:
    """Around ``ray.init`` of an embedded Ray: its processes, and the task workers its raylet
    starts, preload Ray's jemalloc, whose per-thread caches take no lock. Yields the library
    (None: left to the system, where this Ray has none, ``LD_PRELOAD`` is set already, or
    ``FLASHFEED_RAY_JEMALLOC=0``). The variable is this process's again after the block."""
    lib = None if os.environ.get(JEMALLOC_VARIABLE, "1") == "0" else ray_jemalloc()
    if lib is None or os.environ.get("LD_PRELOAD"):
        yield None
        return
    os.environ["LD_PRELOAD"] = lib
    try:
        yield lib
    finally:
        os.environ.pop("LD_PRELOAD", None)


@contextmanager
def ray_session(*, address: str | None = None, num_cpus: int | None = None) -> Iterator[None]:
    """Ray for the duration of the block; only a Ray started here is shut down after."""
    import ray

    if ray.is_initialized():
        yield
        return
    for k, v in _SAFE_ENV.items():
        os.environ[k] = v
    temp = None
    reaper = lifeline.Reaper(None)
    if address:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    else:
        # swept by a later run if this process is killed before drop_temp
        temp = make_owned_dir(RAY_PREFIX, "/tmp")
        before = set(lifeline.descendants([os.getpid()]))
        with worker_malloc():
            ray.init(
                num_cpus=num_cpus or os.cpu_count() or 1,
                include_dashboard=False,
                object_store_memory=1 << 30,
                _temp_dir=temp,
                log_to_driver=False,
                configure_logging=False,
            )
        started = set(lifeline.descendants([os.getpid()])) - before - {os.getpid()}
        reaper = lifeline.reap_with_parent(sorted(started))

    def drop_temp() -> None:
        if temp:
            remove_owned(temp, RAY_PREFIX)

    try:
        with cleanup_on_interrupt(drop_temp):  # a Ctrl-C'd command leaves no ffray- dir
            yield
    finally:
        ray.shutdown()
        reaper.close()
        drop_temp()


def _apply(fn: Callable[[Any], Any], arg: Any) -> Any:
    return fn(arg)


@cache
def _apply_task() -> Any:
    """``_apply`` as a Ray task retried on worker death, made once per process."""
    import ray

    return ray.remote(max_retries=3)(_apply)


def ray_map(fn: Callable[[Any], Any], args: list[Any], *, stage: str = "scan") -> list[Any]:
    """``[fn(a) for a in args]`` as one Ray task each, results in order; retried on worker
    death. A failed task is one line naming ``stage`` and the file of its argument."""

    from .taskerrors import describe, get

    refs = [_apply_task().remote(fn, a) for a in args]
    return get(refs, stage=stage, where=lambda i: describe(args[i]))
