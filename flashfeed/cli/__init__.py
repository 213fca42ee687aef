"""The ``flashfeed`` command (``main``) and the commands of the core: store, dataset."""

from __future__ import annotations

from flashfeed.cli.app import build_parser, main

__all__ = ["build_parser", "main"]
