"""Ray for ingest: reuse a running Ray, join ``--ray-address``, or start an embedded one
that listens on loopback only, sends no usage stats and keeps its files in a short dir.

An embedded Ray dies with the process that started it, SIGKILL included: Ray ties its raylet
and GCS to the driver, but its agents linger for a minute when the driver is killed, so a
reaper (``flashfeed.runtime.lifeline``) kills every process the embedded Ray started.

Ctrl-C: Ray blocks SIGINT in its own processes and its workers run in their own process
groups, so a terminal's Ctrl-C reaches the driver alone; the command-line entry points then
stop through ``flashfeed.runtime.interrupt`` (one line, exit 130, Ray's processes killed) instead of
raising ``KeyboardInterrupt`` inside Ray's driver code, which can end in a native abort.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from flashfeed.runtime import lifeline
from flashfeed.runtime.interrupt import cleanup_on_interrupt
from flashfeed.runtime.scratch import make_owned_dir, remove_owned

__all__ = ["ray_map", "ray_session"]

#: the name of an embedded Ray's session folder in /tmp begins with this
RAY_PREFIX = "ffray-"

_SAFE_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}


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


def ray_map(fn: Callable[[Any], Any], args: list[Any], *, stage: str = "scan") -> list[Any]:
    """``[fn(a) for a in args]`` as one Ray task each, results in order; retried on worker
    death. A failed task is one line naming ``stage`` and the file of its argument."""
    import ray

    from .taskerrors import describe, get

    remote = ray.remote(max_retries=3)(_apply)
    refs = [remote.remote(fn, a) for a in args]
    return get(refs, stage=stage, where=lambda i: describe(args[i]))
