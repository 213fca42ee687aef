"""Helper processes die with the process that started them, however it dies (SIGKILL too).

A child is tied to its parent by two guards, both set up in the child:

- the kernel's parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``): immediate,
  and it works for binaries we cannot change. The kernel sends it when the *thread* that
  started the child exits, so it is armed only where that thread lives as long as its
  process: the main thread, or the one spawner thread this module keeps (``popen``);
- a daemon thread that polls ``os.getppid()`` (Python children only): the parent pid changes
  only when the whole parent process is gone, whichever thread started the child, and it
  works where ``prctl`` does not exist.

Both check the parent once right after arming, which closes the race with a parent that
died between starting the child and the child arming its guards.

Ways in: ``popen`` for programs, ``tie_forked_children`` around code that forks Python
workers (DALI's parallel external source), ``ParentLink`` inside an object that is pickled
into a spawned worker, ``tie_to_parent`` for a child's own code, and ``reap_with_parent``
for process trees started by a library we do not control (an embedded Ray): a small reaper
process keeps a list of the tree and SIGKILLs it when this process dies.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = [
    "ParentLink",
    "Reaper",
    "descendants",
    "popen",
    "process_start",
    "reap_with_parent",
    "set_parent_death_signal",
    "tie_forked_children",
    "tie_to_parent",
]

#: how often a tied child looks at its parent pid (seconds)
POLL_INTERVAL = 0.2
_PR_SET_PDEATHSIG = 1

T = TypeVar("T")


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


# resolved once, in the parent: a forked child calls it without loading anything
_prctl = _load_prctl()


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent thread exits.
    False where the kernel has no such thing (not Linux)."""
    return _prctl is not None and _prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)  # not reached


_watched: tuple[int, int] | None = None  # (this process, its parent) once a watchdog runs


def _watch(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(POLL_INTERVAL)
    _die()


def tie_to_parent(parent_pid: int, *, kernel_signal: bool) -> None:
    """In a child: die (SIGKILL) when process ``parent_pid`` dies, or now if it already has.

    ``kernel_signal``: also arm the parent-death signal; only when the thread that started
    this child lives as long as the parent process (see the module docstring).
    """
    global _watched
    if kernel_signal:
        set_parent_death_signal()
    if os.getppid() != parent_pid:
        _die()
    if _watched == (os.getpid(), parent_pid):
        return
    _watched = (os.getpid(), parent_pid)
    threading.Thread(
        target=_watch, args=(parent_pid,), name="flashfeed-lifeline", daemon=True
    ).start()


def _in_long_lived_thread() -> bool:
    """True in a thread that ends only with its process (the kernel signal is then safe)."""
    return threading.current_thread() is threading.main_thread() or (
        _spawner is not None and threading.current_thread() is _spawner[1]
    )


class ParentLink:
    """A picklable token: the process that unpickles it (a spawned worker) is tied to the
    process that created it. Unpickled in its own creator, it does nothing."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.kernel_signal = _in_long_lived_thread()

    def __getstate__(self) -> dict[str, Any]:
        return {"pid": self.pid, "kernel_signal": self.kernel_signal}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.pid = state["pid"]
        self.kernel_signal = state["kernel_signal"]
        if os.getpid() != self.pid:
            tie_to_parent(self.pid, kernel_signal=self.kernel_signal)


# -- children forked by Python code we call (os.fork, multiprocessing "fork") -------------------
_fork_lock = threading.Lock()
_forking: tuple[int, bool] | None = None  # (parent pid, forked from a long-lived thread)


def _after_fork_in_child() -> None:
    global _forking, _fork_lock, _spawner_lock
    _fork_lock, _spawner_lock = threading.Lock(), threading.Lock()  # held by another thread?
    tie, _forking = _forking, None  # grandchildren this child forks are its own business
    if tie is not None:
        tie_to_parent(tie[0], kernel_signal=tie[1])


@contextmanager
def tie_forked_children() -> Iterator[None]:
    """Every process forked while the block runs (by any thread of this process) dies with
    this process."""
    global _forking
    with _fork_lock:
        saved = _forking
        _forking = (os.getpid(), _in_long_lived_thread())
    try:
        yield
    finally:
        with _fork_lock:
            _forking = saved


# -- programs: started from a thread that lives as long as this process ------------------------
_spawner: tuple[int, threading.Thread, queue.SimpleQueue[Any]] | None = None
_spawner_lock = threading.Lock()
os.register_at_fork(after_in_child=_after_fork_in_child)


def _serve(jobs: queue.SimpleQueue[Any]) -> None:
    while True:
        fn, done = jobs.get()
        try:
            done.set_result(fn())
        except BaseException as exc:  # handed to the caller, who re-raises it
            done.set_exception(exc)


def _on_long_lived_thread(fn: Callable[[], T]) -> T:
    """``fn()`` run on the main thread if we are on it, else on the spawner thread."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # none yet, or we were forked
            jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
            thread = threading.Thread(
                target=_serve, args=(jobs,), name="flashfeed-spawner", daemon=True
            )
            thread.start()
            _spawner = (os.getpid(), thread, jobs)
        jobs = _spawner[2]
    done: Future[T] = Future()
    jobs.put((fn, done))
    return done.result()


def popen(args: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(args, **kwargs)`` for a program that must die (SIGKILL) when this
    process dies, whichever thread calls it."""
    if "preexec_fn" in kwargs:
        raise ValueError("popen sets preexec_fn itself")
    parent = os.getpid()

    def arm() -> None:  # runs in the child between fork and exec
        set_parent_death_signal()
        if os.getppid() != parent:
            os._exit(137)

    return _on_long_lived_thread(lambda: subprocess.Popen(args, preexec_fn=arm, **kwargs))


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot, from ``/proc``), so that a
    pid the system reused is not taken for the process that had it; None when no such
    process runs (a zombie counts as gone); "" for one that runs but whose start time
    cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    return None if fields[0] == "Z" else fields[19]


# -- trees started by others: a reaper process ----------------------------------------------
def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process, from /proc (empty elsewhere)."""
    table: dict[int, tuple[int, str]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return table
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            table[int(entry)] = (int(fields[1]), fields[19])
    return table


def descendants(roots: Sequence[int]) -> dict[int, str]:
    """``roots`` (those alive) and every process below them: pid -> start time, so that a
    pid reused by another process is not mistaken for one of them."""
    table = _proc_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, str] = {}
    todo = [p for p in roots if p in table]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out[pid] = table[pid][1]
            todo.extend(children.get(pid, []))
    return out


def _kill_listed(procs: dict[int, str]) -> None:
    table = _proc_table()
    for pid, start in procs.items():
        if pid in table and table[pid][1] == start:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _reap(parent_pid: int, roots: list[int], interval: float) -> None:
    """The reaper's loop: list the trees below ``roots`` while ``parent_pid`` lives; SIGKILL
    everything it listed once the parent is gone. Ends by itself when the trees are gone."""
    known: dict[int, str] = {}
    while True:
        now = descendants(roots)
        known.update(now)
        if os.getppid() != parent_pid:
            break
        if not now:
            return
        roots = list(now)
        time.sleep(interval)
    _kill_listed(known)


class Reaper:
    """A running reaper process; ``close()`` ends it without killing what it watches."""

    def __init__(self, proc: subprocess.Popen[bytes] | None) -> None:
        self.proc = proc

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def reap_with_parent(roots: Sequence[int], *, interval: float = 0.5) -> Reaper:
    """Start a reaper that SIGKILLs ``roots`` and every process below them when this
    process dies (within about ``interval`` seconds of that). A no-op without /proc."""
    if not roots or not os.path.isdir("/proc/self"):
        return Reaper(None)
    # run as a plain script: stdlib only, no package import, a few MiB
    argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), "reap", str(os.getpid())]
    argv += [f"--interval={interval}", *map(str, roots)]
    proc = _on_long_lived_thread(
        lambda: subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    )
    return Reaper(proc)


if __name__ == "__main__" and sys.argv[1:2] == ["reap"]:
    _parent, _interval = int(sys.argv[2]), float(sys.argv[3].split("=", 1)[1])
    _reap(_parent, [int(a) for a in sys.argv[4:]], _interval)
