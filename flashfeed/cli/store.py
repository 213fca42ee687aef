"""``flashfeed store up|down|status``: the embedded S3 server for laptops, demos and tests."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from flashfeed.cli.devstore import DEFAULT_BUCKET, EmbeddedStore
from flashfeed.cli.help import formatter

DEFAULT_DIR = ".flashfeed-store"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "store",
        help="run a local S3 server (SeaweedFS) on 127.0.0.1",
        description="Run the embedded object store: a real S3 server (SeaweedFS) on "
        "127.0.0.1 with generated credentials. Data persists in --dir between up and down. "
        "Like SeaweedFS itself, this store creates a missing bucket on the first PUT into it; "
        "real object stores do not, so `flashfeed ingest` checks the bucket first.",
        epilog='example:\n  eval "$(flashfeed store up --dir /tmp/ff-store)"\n'
        "  flashfeed store status --dir /tmp/ff-store\n"
        "  flashfeed store down --dir /tmp/ff-store",
        formatter_class=formatter(),
    )
    ssub = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    up = ssub.add_parser(
        "up",
        help="start the server in the background and print export lines",
        description="Start the server, wait until it answers a signed request, create the "
        f"bucket '{DEFAULT_BUCKET}', and print `export AWS_...=` lines on stdout (human "
        'lines go to stderr), so that `eval "$(flashfeed store up)"` configures the shell.',
        formatter_class=formatter(),
    )
    up.add_argument(
        "--dir", default=DEFAULT_DIR, help=f"state and data dir (default {DEFAULT_DIR})"
    )
    up.add_argument("--port", type=int, default=None, help="S3 port (default 8333, or a free one)")
    up.add_argument(
        "--bucket", default=DEFAULT_BUCKET, help="bucket to create (default %(default)s)"
    )
    up.set_defaults(func=_up)
    down = ssub.add_parser("down", help="stop the server (data stays in --dir)")
    down.add_argument("--dir", default=DEFAULT_DIR)
    down.set_defaults(func=_down)
    status = ssub.add_parser("status", help="say whether the server runs, and where")
    status.add_argument("--dir", default=DEFAULT_DIR)
    status.set_defaults(func=_status)


def _state_dir(path: str) -> str:
    """``--dir`` as given, refused when it names a file (the store keeps a directory there)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(
            f"--dir {path} is a file, not a directory: pass a directory for the store's state "
            "and data (it is created if missing)"
        )
    return path


def _up(args: argparse.Namespace) -> int:
    store = EmbeddedStore(
        _state_dir(args.dir), port=args.port, detach=True
    )  # outlives this command
    info = store.start()
    bucket = store.make_bucket(args.bucket)
    print(
        f"flashfeed store: S3 at {info.endpoint}, bucket {bucket}, pid {info.pid}, "
        f"data in {store.dir}",
        file=sys.stderr,
    )
    for k, v in info.env().items():
        print(f"export {k}={shlex.quote(v)}")
    return 0


def _down(args: argparse.Namespace) -> int:
    store = EmbeddedStore(_state_dir(args.dir))
    was_running = store.pid_alive()
    store.stop()
    print(
        "flashfeed store: stopped" if was_running else "flashfeed store: was not running",
        file=sys.stderr,
    )
    return 0


def _status(args: argparse.Namespace) -> int:
    store = EmbeddedStore(_state_dir(args.dir))
    if store.pid_alive() and store.ready():
        print(f"running: {store.info.endpoint} (pid {store.info.pid}, data in {store.dir})")
        return 0
    print(f"not running (state dir {store.dir})")
    return 1
