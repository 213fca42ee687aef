"""The ``flashfeed`` command: one entry point, one subcommand per job.

Each component registers its own subcommands (``register(subparsers)`` in its ``cli``
module), so this file only assembles them and owns the one error path every command
shares: a user's mistake is one line naming what to fix and exit 1 (2 for a bad option
value), Ctrl-C is one line and exit 130 with nothing left running, and only a bug in
flashfeed itself shows a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from flashfeed import __version__
from flashfeed.cli.help import formatter
from flashfeed.errors import FlashfeedError
from flashfeed.runtime.interrupt import exit_on_interrupt, interrupted_line
from flashfeed.storage import redact

__all__ = ["build_parser", "main"]

_COMMAND_MODULES = (
    "flashfeed.cli.store",
    "flashfeed.cli.dataset",
    "flashfeed.ingest.cli",
    "flashfeed.cache.cli.cli",
    "flashfeed.monitor.cli",
)

EPILOG = """\
examples:
  eval "$(flashfeed store up)"                 # a local S3 server, env vars exported
  flashfeed ingest ./photos s3://flashfeed/photos-v1 --format webdataset
  flashfeed inspect s3://flashfeed/photos-v1
  flashfeed cache warm s3://flashfeed/photos-v1 --cache-dir /nvme/ff-cache

run 'flashfeed COMMAND --help' for the options of each command.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flashfeed",
        description="Turn corpora into sharded datasets on object storage, keep them on "
        "node-local flash, and feed GPUs without stalls.",
        epilog=EPILOG,
        formatter_class=formatter(),
    )
    parser.add_argument("--version", action="version", version=f"flashfeed {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


#: mistakes a user fixes (a wrong path, a missing file, no permission): one line, exit 1
_USER_OS_ERRORS = (
    FileNotFoundError,
    FileExistsError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)


def _prog(args: argparse.Namespace) -> str:
    """``flashfeed cache warm``: the command and its action, as the user typed them."""
    words = ["flashfeed", args.command]
    for attr in ("cache_command", "store_command"):
        if getattr(args, attr, None):
            words.append(getattr(args, attr))
    return " ".join(words)


def _describe(exc: BaseException) -> str:
    """One line for a user's mistake; an OSError names its path and what to do."""
    if isinstance(exc, OSError) and not isinstance(exc, FlashfeedError) and exc.filename:
        what = {
            FileNotFoundError: "does not exist: check the path",
            FileExistsError: "already exists",
            NotADirectoryError: "is not a directory (or a part of it is a file): pass a directory",
            IsADirectoryError: "is a directory: pass a file",
            PermissionError: "is not accessible: check its permissions",
        }.get(type(exc), exc.strerror or str(exc))
        return f"{exc.filename}: {what}"
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())  # one line, whatever the message held


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    prog = _prog(args)
    if argv is None:  # the real command line (tests call main() in-process: leave them be)
        exit_on_interrupt(prog)
    try:
        return int(args.func(args) or 0)
    except (FlashfeedError, *_USER_OS_ERRORS) as exc:
        print(f"{prog}: error: {redact(_describe(exc))}", file=sys.stderr)
        return 1
    except ValueError as exc:  # option validation
        print(f"{prog}: error: {redact(_describe(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(interrupted_line(prog), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
