"""Ctrl-C in a flashfeed command: one line, exit 130, nothing left running, within a moment.

A terminal's Ctrl-C signals the whole foreground process group. Raising ``KeyboardInterrupt``
wherever the main thread happens to be is unsafe while an embedded Ray runs (an interrupt
inside Ray's driver code can end in a native abort) and slow while worker threads finish
their requests. So a command installs ``exit_on_interrupt``: the first SIGINT prints one
line, runs the registered cleanups (temporary directories), SIGKILLs every process this one
started (Ray's processes, DALI readers, an embedded store) and exits 130 at once.

Nothing is lost by stopping this way: every object flashfeed writes is either absent or
complete (temporary name and rename, or one PUT), and a manifest is written last, so a
re-run continues from what is committed. A library caller keeps Python's own Ctrl-C
behaviour: only the command-line entry points install this.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

from flashfeed.runtime import lifeline

__all__ = ["MESSAGE", "cleanup_on_interrupt", "exit_on_interrupt", "interrupted_line"]

MESSAGE = "interrupted; re-run to continue"
EXIT_CODE = 130

_cleanups: list[Callable[[], None]] = []
_lock = threading.Lock()


def interrupted_line(prog: str) -> str:
    return f"{prog}: {MESSAGE}"


@contextmanager
def cleanup_on_interrupt(fn: Callable[[], None]) -> Iterator[None]:
    """Run ``fn`` (quick, no locks) before an interrupted command exits; only inside the
    block. Without ``exit_on_interrupt`` installed it is never called by this module."""
    with _lock:
        _cleanups.append(fn)
    try:
        yield
    finally:
        with _lock:
            if fn in _cleanups:
                _cleanups.remove(fn)


def _kill_children() -> None:
    me = os.getpid()
    procs = {p: s for p, s in lifeline.descendants([me]).items() if p != me}
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _silence_stderr() -> None:
    """Point file descriptor 2 at /dev/null: the one line is out, and the process is ending."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)
    except OSError:
        pass


def stop_now(prog: str) -> None:
    """Say so in one line, clean up, kill this process's children, exit 130 (no return)."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C changes nothing
        sys.stderr.write(interrupted_line(prog) + "\n")
        sys.stderr.flush()
        _silence_stderr()  # native threads (Ray's core worker) log as their peers die
        _kill_children()
        for fn in list(_cleanups):
            try:
                fn()
            except Exception:  # a cleanup that fails must not keep us from exiting
                pass
    finally:
        os._exit(EXIT_CODE)


def exit_on_interrupt(prog: str) -> bool:
    """Make SIGINT stop this process as ``stop_now`` does. Main thread only; False (and
    nothing changed) elsewhere."""
    if threading.current_thread() is not threading.main_thread():
        return False

    def handler(signum: int, frame: FrameType | None) -> None:
        stop_now(prog)

    signal.signal(signal.SIGINT, handler)
    return True
