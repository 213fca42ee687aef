"""What the parsers of every ``flashfeed`` subcommand share; imports nothing of flashfeed,
so any command module can use it without importing ``flashfeed.cli``."""

from __future__ import annotations

import argparse

__all__ = ["formatter"]


def formatter() -> type[argparse.HelpFormatter]:
    """The help formatter every subcommand uses: keeps the examples in epilogs as written."""
    return argparse.RawDescriptionHelpFormatter
