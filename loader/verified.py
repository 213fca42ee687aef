"""A local shard's checksum, hashed once per node while its file stays unchanged.

A dataset read in place is checked against its manifest (size and checksum) before a process
reads a shard. Hashing every shard again in every process (each rank, each restart) costs
about 0.2 ms of CPU per MiB. Each hash that matched leaves a record in the node's cache
directory, so a later process checks the file's identity instead: same device, inode, size,
modification and change time. A write, a truncation or a rename over the file changes one of
those, so such a file is hashed again.

File times are coarse (a write in the same clock tick as the one before can leave them as
they were), so a file changed less than ``SETTLE_NS`` before its hash gets no record: it is
hashed again by the next process, until it has settled.

``FLASHFEED_VERIFIED_DIR`` moves the records (default: ``verified/`` in
``FLASHFEED_CACHE_DIR``, else ``~/.cache/flashfeed``); set to an empty value, every process
hashes each shard it reads. The folder is the user's own (mode 0700 when made here): whoever
can write a record there could make a changed file pass.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import NamedTuple

import xxhash

from flashfeed import storage
from flashfeed.runtime.files import atomic_write_json
from flashfeed.telemetry import default_cache_dir

__all__ = ["SETTLE_NS", "FileStamp", "checksum", "records_dir"]

log = logging.getLogger(__name__)

#: a file changed less than this before its hash is not recorded (coarse file times)
SETTLE_NS = 2_500_000_000


class FileStamp(NamedTuple):
    """What identifies a file's content without reading it."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> FileStamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def records_dir() -> str | None:
    """Where records are kept on this node; None: nowhere (``FLASHFEED_VERIFIED_DIR=""``)."""
    given = os.environ.get("FLASHFEED_VERIFIED_DIR")
    if given is not None:
        return given or None
    return os.path.join(default_cache_dir(), "verified")


def checksum(
    path: str, st: os.stat_result, *, expected: str, records: str | None
) -> tuple[str, bool]:
    """``path``'s manifest checksum and whether it was hashed now: a record of an earlier hash
    that gave ``expected`` for the same, unchanged file (``st``: its ``os.stat``, taken
    before) stands for it (False). A record is never trusted for a mismatch: that is always
    hashed again, so errors name fresh bytes."""
    real = os.path.realpath(path)
    before = FileStamp.of(st)
    if records is not None and _recorded(records, real, before) == expected:
        return expected, False
    started = time.time_ns()
    got = storage.file_checksum(real)
    if records is not None and got == expected:
        after = FileStamp.of(os.stat(real))
        if after == before and started - max(before.mtime_ns, before.ctime_ns) >= SETTLE_NS:
            _record(records, real, before, got)
    return got, True


def _name(real: str) -> str:
    return xxhash.xxh3_64_hexdigest(real.encode("utf-8", "surrogateescape"))


def _recorded(records: str, real: str, stamp: FileStamp) -> str | None:
    """The checksum a record keeps for ``real`` as ``stamp`` shows it, or None."""
    try:
        with open(os.path.join(records, _name(real)), encoding="utf-8") as f:
            kept = json.load(f)
        if kept["path"] == real and FileStamp(*kept["stamp"]) == stamp:
            return str(kept["checksum"])
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none, unreadable or of another form: hash the file
    return None


def _record(records: str, real: str, stamp: FileStamp, got: str) -> None:
    """Keep a record (written aside, then renamed into place); a folder that cannot be
    written only means the next process hashes again."""
    record = {"path": real, "stamp": list(stamp), "checksum": got}
    try:
        os.makedirs(records, mode=0o700, exist_ok=True)
        atomic_write_json(os.path.join(records, _name(real)), record, mode=0o644)
    except OSError as exc:
        log.debug("no record of the check of %s kept in %s: %s", real, records, exc)
