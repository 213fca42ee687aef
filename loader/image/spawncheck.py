"""Spawned reader processes re-import the training script: say so when it cannot be done.

Python's ``spawn`` start method runs the main script again in every new process (as
``__mp_main__``). A script that builds its loader outside an ``if __name__ == "__main__":``
guard then builds loaders inside DALI's reader processes too, and a script read from stdin
cannot be run again at all; DALI only reports "Workers initialization failed". The loader
checks its caller's script before it starts reader processes, and names the line to guard.
"""

from __future__ import annotations

import ast
import os
import sys
from types import FrameType

from flashfeed.errors import FlashfeedError

__all__ = ["SpawnError", "check_spawnable_main", "spawn_failure_hint", "unguarded_line"]

_FIX = (
    'put the training code under `if __name__ == "__main__":` (a `main()` called from '
    'there), or pass reader_start="fork" when nothing initialises CUDA before the loader'
)


class SpawnError(FlashfeedError, RuntimeError):
    """Reader processes started with ``spawn`` could not run the training script."""


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, *test.comparators]
    names = [s.id for s in sides if isinstance(s, ast.Name)]
    consts = [s.value for s in sides if isinstance(s, ast.Constant)]
    return names == ["__name__"] and consts == ["__main__"]


def unguarded_line(source: str, line: int) -> bool:
    """Whether the top-level statement holding line ``line`` of module ``source`` runs
    again when the module is imported under another name than ``__main__`` (a spawned
    process): it is not the body of an ``if __name__ == "__main__":``. Unparsable source
    counts as guarded (nothing to say)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    for node in tree.body:
        end = node.end_lineno or node.lineno
        if not node.lineno <= line <= end:
            continue
        if _is_main_guard(node) and isinstance(node, ast.If) and node.body:
            body_end = node.body[-1].end_lineno or node.body[-1].lineno
            return not node.body[0].lineno <= line <= body_end  # the else branch runs too
        return True
    return False


def _main_frame_line(frame: FrameType | None, main_globals: dict[str, object]) -> int | None:
    """The line of the main script's top level that is running ``frame``, if any."""
    line = None
    while frame is not None:
        if frame.f_globals is main_globals and frame.f_code.co_name == "<module>":
            line = frame.f_lineno
        frame = frame.f_back
    return line


def check_spawnable_main(what: str = "Loader", *, reader_start: str = "spawn") -> None:
    """Raise ``SpawnError`` when reader processes started with ``spawn`` could not run the
    main script: it builds ``what`` at its top level without a ``__main__`` guard, or it was
    read from stdin. Called where ``what`` is built, before any reader process starts."""
    how = (
        f"{what} starts its reader processes with spawn (reader_start={reader_start!r}), "
        "which runs the main script again in each of them"
    )
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return  # an interactive session or ``python -c``: spawn does not run it again
    if not os.path.isfile(path):
        raise SpawnError(
            f"{how}, and this one was not read from a file ({path}): save it as a file and "
            f'run that, or pass reader_start="fork" when nothing initialises CUDA before '
            "the loader"
        )
    line = _main_frame_line(sys._getframe(1), vars(main))
    if line is None:
        return  # built from a thread or a callback, not while the script's top level runs
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
    except (OSError, UnicodeDecodeError):
        return
    if unguarded_line(source, line):
        raise SpawnError(
            f"{how}, and {path} line {line} builds the loader outside an "
            '`if __name__ == "__main__":` guard, so every reader process would build '
            f"loaders of its own (DALI then says only 'Workers initialization failed'): {_FIX}"
        )


def spawn_failure_hint() -> str:
    """What to check when DALI's spawned reader processes failed to start."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or "the main script"
    return (
        "DALI's reader processes, started with spawn, failed to start. Each runs the main "
        f"script ({path}) again: code at its top level that is not under "
        '`if __name__ == "__main__":` runs in every reader process; '
        f"{_FIX}. The reader processes' own errors are above"
    )
