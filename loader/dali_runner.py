"""One DALI pipeline kept across passes, so reader processes start once per loader.

Its reader processes die with the loader's process, however that dies (``flashfeed.lifeline``).

Each pass's samples go to a pass file before the pass starts; ``reset()`` moves DALI to the
next epoch index, which names the next pass file (see ``reader.BatchSource``). A pass left
early (the consumer stopped mid-epoch) leaves batches in flight, so the next pass builds a
fresh pipeline instead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable
from typing import Any

from flashfeed.errors import CorruptShardError
from flashfeed.lifeline import tie_forked_children

from .passplan import PassPlan
from .reader import BatchSource, write_pass

__all__ = ["DaliRunner"]

# what a reader process raises about the data it reads; DALI re-raises them as a bare
# Exception carrying the worker's traceback text
_DATA_ERRORS = ("CorruptShardError", "HostileInputError", "ValueError", "FileNotFoundError")

Builder = Callable[[BatchSource], tuple[Any, list[str]]]


def _scratch_dir() -> str:
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return tempfile.mkdtemp(prefix="flashfeed-pass-", dir=base)


class DaliRunner:
    """Starts passes on a reusable pipeline built by ``build(batch_source)``."""

    def __init__(self, build: Builder, make_source: Callable[[str], BatchSource]) -> None:
        self._build = build
        self._make_source = make_source
        self.pass_dir = _scratch_dir()
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.pass_dir, True)
        self.pipe: Any = None
        self.names: list[str] = []
        self.epoch = -1
        self.ready = False
        self.builds = 0

    def start(self, plan: PassPlan) -> float:
        """Make ``plan`` the next pass; returns the seconds spent (building, if it had to)."""
        t0 = time.perf_counter()
        if self.pipe is not None and self.ready:
            self.epoch += 1
            write_pass(self.pass_dir, self.epoch, plan.shards, plan.rows, plan.num_batches)
            self.pipe.reset()
        else:
            self.drop()
            self.epoch = 0
            write_pass(self.pass_dir, 0, plan.shards, plan.rows, plan.num_batches)
            # DALI forks its reader processes while building; they must die with us
            with tie_forked_children():
                self.pipe, self.names = self._build(self._make_source(self.pass_dir))
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
            raise CorruptShardError(data_error) from exc

    def finish(self) -> None:
        """Observe the end of the pass, so the next one can reuse the pipeline."""
        try:
            self.pipe.run()
        except StopIteration:
            self.ready = True
            return
        raise RuntimeError("the DALI pipeline produced more batches than the pass planned")

    def drop(self) -> None:
        self.pipe, self.names, self.ready = None, [], False

    def close(self) -> None:
        self.drop()
        self._cleanup()


def _reader_data_error(exc: Exception) -> str | None:
    """The message of a data error raised in a DALI reader process, else None."""
    if type(exc) is not Exception or "Traceback" not in str(exc):
        return None
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    name, _, message = lines[-1].partition(": ") if lines else ("", "", "")
    if name.rsplit(".", 1)[-1] in _DATA_ERRORS and message:
        return message
    return None
