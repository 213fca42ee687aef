"""The ``flashfeed`` command: one entry point, one subcommand per job.

Each component registers its own subcommands (``register(subparsers)`` in its ``cli``
module), so this file only assembles them and turns flashfeed errors into clear messages.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Sequence

from . import __version__
from .errors import FlashfeedError
from .storage import redact

__all__ = ["build_parser", "main"]

_COMMAND_MODULES = (
    "flashfeed.cli_store",
    "flashfeed.cli_dataset",
    "flashfeed.ingest.cli",
    "flashfeed.cache.cli",
    "flashfeed.loader.cli",
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
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"flashfeed {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        if importlib.util.find_spec(name) is None:
            continue
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except FlashfeedError as exc:
        print(f"flashfeed {args.command}: error: {redact(str(exc))}", file=sys.stderr)
        return 1
    except ValueError as exc:  # option validation
        print(f"flashfeed {args.command}: error: {redact(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"flashfeed {args.command}: interrupted", file=sys.stderr)
        return 130


def formatter() -> type[argparse.HelpFormatter]:
    """The help formatter every subcommand uses: keeps the examples in epilogs as written."""
    return argparse.RawDescriptionHelpFormatter


if __name__ == "__main__":
    sys.exit(main())
