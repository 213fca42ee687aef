"""One DALI pipeline kept across passes, so reader processes start once per loader.

Its reader processes die with the loader's process, however that dies (``flashfeed.runtime.lifeline``).

Each pass's samples go to a pass file before the pass starts; ``reset()`` moves DALI to the
next epoch index, which names the next pass file (see ``reader.BatchSource``). A pass left
early (the consumer stopped mid-epoch) leaves batches in flight: ``abandon()`` writes a stop
file that makes the source end the pass at its next call, and runs out the few batches
already in flight, so the pipeline and its reader processes serve the next pass too (a
spawned reader process costs seconds to start). Only if that fails is the pipeline dropped
and the next pass builds a fresh one.
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from collections.abc import Callable
from typing import Any

from flashfeed.errors import CorruptShardError
from flashfeed.runtime.lifeline import tie_forked_children
from flashfeed.runtime.scratch import make_owned_dir, remove_owned

from ..passorder import PassOrder
from ..reader import BatchSource, write_pass

__all__ = [
    "READER_STARTS",
    "DaliRunner",
    "StoppableSource",
    "collect_dropped_pipelines",
    "py_start_method",
]

#: how DALI starts its reader processes: ``Loader(reader_start=...)``
READER_STARTS = ("auto", "fork", "spawn")

# what a reader process raises about the data it reads; DALI re-raises them as a bare
# Exception carrying the worker's traceback text
_DATA_ERRORS = (
    "CorruptShardError", "HostileInputError", "ValueError", "FileNotFoundError",
    "UnsupportedCodecError",
)  # fmt: skip

Builder = Callable[[Any], tuple[Any, list[str]]]

# pipelines let go of by any runner of this process since the last collection, and every
# runner not yet collected (a loader dropped without close() keeps its runner, and with it
# its pipeline, in a reference cycle until the next collection)
_dropped = 0
_runners: weakref.WeakSet[DaliRunner] = weakref.WeakSet()


def collect_dropped_pipelines(runner: DaliRunner) -> bool:
    """Before ``runner`` builds a pipeline: collect garbage if a pipeline may be waiting in
    a reference cycle (one was dropped and outlived its last reference, or another runner
    still holds one), so that it shuts its reader processes down now, not inside the reader
    processes forked next. A full collection costs 0.1-0.2 s in a process that has imported
    torch: the first loader of a process skips it, and so does the next one when the loaders
    before it were closed (their pipelines freed at once)."""
    global _dropped
    if not _dropped and all(r is runner or r.pipe is None for r in _runners):
        return False
    _dropped = 0
    gc.collect()
    return True


def py_start_method(reader_start: str, *, decode_on_gpu: bool, cuda_initialized: bool) -> str:
    """``"fork"`` or ``"spawn"``: how DALI starts the reader processes.

    DALI refuses to fork once CUDA is initialised in the process (a training script that
    touched the GPU before building the loader), and GPU decode initialises it, so ``"auto"``
    spawns in both cases and forks otherwise (faster to start, nothing to pickle).
    """
    if reader_start not in READER_STARTS:
        raise ValueError(f"reader_start must be one of {READER_STARTS}, got {reader_start!r}")
    if reader_start != "auto":
        return reader_start
    return "spawn" if decode_on_gpu or cuda_initialized else "fork"


def cuda_initialized() -> bool:
    """Whether this process has initialised CUDA through torch."""
    try:
        import torch

        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


#: the name of a pass folder begins with this
PASS_PREFIX = "flashfeed-pass-"


def _pass_base() -> str | None:
    """Where pass folders go: ``/dev/shm`` where it can be written, else the system's."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None


def stop_path(pass_dir: str, epoch: int) -> str:
    return os.path.join(pass_dir, f"stop-{epoch}")


class StoppableSource:
    """A batch source that ends pass ``e`` early once ``stop-<e>`` exists in its pass folder:
    what lets a pass left early give its pipeline back without rebuilding it. Picklable (a
    spawned reader process unpickles it)."""

    def __init__(self, source: BatchSource, pass_dir: str) -> None:
        self.source = source
        self.pass_dir = pass_dir

    def __call__(self, info: Any) -> Any:
        if os.path.exists(stop_path(self.pass_dir, int(info.epoch_idx))):
            raise StopIteration
        return self.source(info)

    def close(self) -> None:
        self.source.close()


class DaliRunner:
    """Starts passes on a reusable pipeline built by ``build(batch_source)``."""

    def __init__(self, build: Builder, make_source: Callable[[str], BatchSource]) -> None:
        self._build = build
        self._make_source = make_source
        _runners.add(self)
        # removed on close, collection or exit; swept by a later loader if this process is
        # killed (``flashfeed/runtime/scratch.py``)
        self.pass_dir = make_owned_dir(PASS_PREFIX, _pass_base())
        #: the pipe's source (this process's copy), closed when the pipe is dropped or this
        #: runner goes: a pipeline may be kept by a cycle of its own, its source with it
        self._sources: list[StoppableSource] = []
        self._cleanup = weakref.finalize(self, _release, self.pass_dir, self._sources)
        self.pipe: Any = None
        self.names: list[str] = []
        self.epoch = -1
        self.ready = False
        self.builds = 0
        self.abandoned = 0
        #: bound on the batches ``abandon()`` runs out: DALI's queue and the readers' prefetch
        self.drain_limit = 64

    def start(self, order: PassOrder) -> float:
        """Make ``order`` the next pass; returns the seconds spent (building, if it had to)."""
        t0 = time.perf_counter()
        if self.pipe is not None and self.ready:
            self.epoch += 1
            write_pass(self.pass_dir, self.epoch, order)
            self.pipe.reset()
        else:
            self.drop()
            self.epoch = 0
            write_pass(self.pass_dir, 0, order)
            # DALI forks its reader processes while building; they must die with us
            with tie_forked_children():
                source = StoppableSource(self._make_source(self.pass_dir), self.pass_dir)
                self._sources.append(source)
                self.pipe, self.names = self._build(source)
            self.builds += 1
        self.ready = False
        return time.perf_counter() - t0

    def run(self) -> Any:
        try:
            return self.pipe.run()
        except StopIteration:
            raise
        except Exception as exc:
            data_error = _reader_data_error(exc)
            if data_error is None:
                raise
            if "UnsupportedCodecError: " in str(exc):  # not corrupt: this device cannot decode it
                from .video import UnsupportedCodecError

                raise UnsupportedCodecError(data_error) from exc
            raise CorruptShardError(data_error) from exc

    def finish(self) -> None:
        """Observe the end of the pass, so the next one can reuse the pipeline."""
        try:
            self.pipe.run()
        except StopIteration:
            self.ready = True
            return
        raise RuntimeError("the DALI pipeline produced more batches than the pass planned")

    def abandon(self) -> float:
        """The consumer left the pass early: end it in the source and run out the batches in
        flight, so the next pass reuses this pipeline. Returns the seconds it took; drops the
        pipeline when the pass does not end within ``drain_limit`` batches or fails."""
        t0 = time.perf_counter()
        if self.pipe is None or self.ready:
            return 0.0
        try:
            with open(stop_path(self.pass_dir, self.epoch), "w"):
                pass
            for _ in range(self.drain_limit):
                self.pipe.run()
        except StopIteration:
            self.ready = True
            self.abandoned += 1
        except Exception:  # a failing pipeline is not reused: the next pass builds anew
            pass
        if not self.ready:
            self.drop()
        return time.perf_counter() - t0

    def drop(self) -> None:
        global _dropped
        alive = _watch(self.pipe)
        self.pipe, self.names, self.ready = None, [], False
        _close_sources(self._sources)  # its shards unmapped now, whatever keeps the pipe
        if alive is not None and alive() is not None:  # still referenced: maybe a cycle
            _dropped += 1

    def close(self) -> None:
        self.drop()
        self._cleanup()

    @property
    def closed(self) -> bool:
        """Closed (or collected): its pass folder is gone, no pass can start."""
        return not self._cleanup.alive


def _close_sources(sources: list[StoppableSource]) -> None:
    while sources:
        sources.pop().close()


def _release(pass_dir: str, sources: list[StoppableSource]) -> None:
    """A runner's end (closed, collected or at exit): its sources closed, its folder gone."""
    try:
        _close_sources(sources)
    finally:
        remove_owned(pass_dir, PASS_PREFIX)


def _watch(pipe: Any) -> Callable[[], Any] | None:
    """What says whether ``pipe`` still exists once dropped (None for no pipe)."""
    if pipe is None:
        return None
    try:
        return weakref.ref(pipe)
    except TypeError:  # cannot be watched: count it as possibly alive
        return lambda: pipe


def _reader_data_error(exc: Exception) -> str | None:
    """The message of a data error raised in a DALI reader process, else None."""
    if type(exc) is not Exception or "Traceback" not in str(exc):
        return None
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    name, _, message = lines[-1].partition(": ") if lines else ("", "", "")
    if name.rsplit(".", 1)[-1] in _DATA_ERRORS and message:
        return message
    return None
