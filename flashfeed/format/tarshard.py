"""WebDataset tar shards: a deterministic writer and a reader that refuses hostile members.

A sample is ``key -> {ext: bytes}``; its members ``<key>.<ext>`` stand adjacent in the tar,
extensions in sorted order. Identical samples give identical bytes: fixed mtime, uid/gid 0,
mode 0644, no user names, POSIX ustar headers.
"""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

from flashfeed.errors import CorruptShardError, HostileInputError
from flashfeed.format.wdsindex import Component, SampleIndex, format_index, split_name

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "FIXED_MTIME",
    "Sample",
    "StrictTarInfo",
    "TarHeaderError",
    "TarShardWriter",
    "iter_members",
    "iter_samples",
    "validate_key",
]

Sample = tuple[str, dict[str, bytes]]

#: 2000-01-01T00:00:00Z: a fixed member mtime keeps shard bytes reproducible.
FIXED_MTIME = 946684800

_KEY_RE = re.compile(r"^[A-Za-z0-9_\-/]+$")
_EXT_RE = re.compile(r"^[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*$")


def validate_key(key: str) -> str:
    """A key is a relative path without dots, spaces, ``..`` or a leading ``/``."""
    if not key or not _KEY_RE.match(key) or key.startswith("/") or "//" in key:
        raise ValueError(
            f"invalid sample key {key!r}: use letters, digits, '_', '-' and '/' "
            "(no dots, no spaces, no leading '/')"
        )
    if key.endswith("/"):
        raise ValueError(f"invalid sample key {key!r}: must not end with '/'")
    return key


def _validate_ext(ext: str, key: str) -> str:
    if not _EXT_RE.match(ext):
        raise ValueError(f"invalid extension {ext!r} for sample {key!r}: use e.g. 'jpg', 'seg.png'")
    return ext


class TarShardWriter:
    """Write samples into a tar stream and keep the DALI index of what was written.

    >>> buf = io.BytesIO()
    >>> with TarShardWriter(buf) as w:
    ...     w.write("000001", {"cls": b"3", "jpg": b"..."})
    >>> w.num_samples
    1
    """

    def __init__(self, fileobj: IO[bytes]) -> None:
        self._tar = tarfile.open(fileobj=fileobj, mode="w", format=tarfile.USTAR_FORMAT)
        self._index: list[SampleIndex] = []
        self._keys: set[str] = set()
        self.num_bytes = 0

    @property
    def num_samples(self) -> int:
        return len(self._index)

    def write(self, key: str, fields: Mapping[str, bytes]) -> None:
        validate_key(key)
        if key in self._keys:
            raise ValueError(f"duplicate sample key {key!r} in one shard")
        if not fields:
            raise ValueError(f"sample {key!r} has no fields")
        comps = []
        for ext in sorted(fields):
            data = fields[ext]
            if not isinstance(data, bytes | bytearray | memoryview):
                raise TypeError(f"sample {key!r} field {ext!r} must be bytes, got {type(data)}")
            name = f"{key}.{_validate_ext(ext, key)}"
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = FIXED_MTIME
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            header_at = self._tar.offset
            try:
                self._add(info, data)
            except ValueError as exc:  # name too long for ustar
                raise ValueError(f"sample {key!r}: {exc}") from None
            comps.append(Component(ext, header_at + tarfile.BLOCKSIZE, len(data), name))
            self.num_bytes += len(data)
        self._keys.add(key)
        self._index.append(SampleIndex(key, tuple(comps)))

    def _add(self, info: tarfile.TarInfo, data: bytes | bytearray | memoryview) -> None:
        """``TarFile.addfile`` with the member's bytes written whole: the header, the data in
        one write and its padding (``addfile`` copies through a file object 16 KiB at a
        time, a fifth of an image shard's CPU). Same bytes as ``addfile``."""
        tar: Any = self._tar  # its writer state (fileobj, offset, members), as addfile keeps it
        header = _ustar_header(info.name, info.size) or info.tobuf(
            tar.format, tar.encoding, tar.errors
        )
        pad = -len(data) % tarfile.BLOCKSIZE
        tar.fileobj.write(header)
        tar.fileobj.write(data)
        if pad:
            tar.fileobj.write(tarfile.NUL * pad)
        tar.offset += len(header) + len(data) + pad
        tar.members.append(info)

    def index_text(self) -> str:
        if not self._index:
            raise ValueError("an empty shard has no index")
        return format_index(self._index)

    def close(self) -> None:
        self._tar.close()

    def __enter__(self) -> TarShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _header_template() -> bytes:
    """The ustar header of an empty-named, empty member with this writer's fixed fields."""
    info = tarfile.TarInfo("")
    info.mtime = FIXED_MTIME
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


_TEMPLATE = _header_template()
_MAX_SIZE = 8**11  # 11 octal digits: larger members need tarfile's own checks (it refuses)


def _ustar_header(name: str, size: int) -> bytes | None:
    """``TarInfo.tobuf``'s ustar header for a member of this writer (fixed mode, owner and
    mtime) whose name fits the 100-byte field: the template with name, size and checksum
    set, a tenth of tobuf's CPU (two headers per image sample). None: ask tarfile."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > 100 or not 0 <= size < _MAX_SIZE:
        return None
    header = bytearray(_TEMPLATE)
    header[0 : len(raw)] = raw
    header[124:136] = b"%011o\0" % size
    header[148:156] = b"        "
    header[148:155] = b"%06o\0" % sum(header)
    return bytes(header)


# --- reading -----------------------------------------------------------------------------


def _check_member(m: tarfile.TarInfo, source: str) -> str | None:
    """The member's clean name, None to skip it (directories), or a HostileInputError."""
    name = m.name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise HostileInputError(
            f"{source}: member name {name.encode('utf-8', 'surrogateescape')!r} is not UTF-8"
        ) from None
    if m.isdir():
        return None
    if m.issym() or m.islnk():
        raise HostileInputError(
            f"{source}: member {name!r} is a link to {m.linkname!r}; links are refused"
        )
    if not m.isfile():
        raise HostileInputError(
            f"{source}: member {name!r} is a device, fifo or other special file; refused"
        )
    if name.startswith("/") or re.match(r"^[A-Za-z]:[\\/]", name):
        raise HostileInputError(f"{source}: member {name!r} has an absolute path; refused")
    while name.startswith("./"):
        name = name[2:]
    if ".." in name.replace("\\", "/").split("/"):
        raise HostileInputError(f"{source}: member {name!r} contains '..'; refused")
    return name


class TarHeaderError(CorruptShardError):
    """A truncated or invalid tar header (raised from inside tarfile, which would otherwise
    take a bad header for the end of the archive)."""


class StrictTarInfo(tarfile.TarInfo):
    """Headers that must be whole and valid until the end-of-archive block.

    ``tarfile`` ends iteration quietly at a truncated or garbled header past the first
    member, which would drop the rest of a shard without a word; this refuses instead.
    """

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if len(buf) == 0:
            raise TarHeaderError("it ends without the end-of-archive marker (cut after a member)")
        if len(buf) != tarfile.BLOCKSIZE:
            raise TarHeaderError(f"a header is cut short ({len(buf)} of {tarfile.BLOCKSIZE} bytes)")
        if buf.count(0) == tarfile.BLOCKSIZE:
            return super().frombuf(buf, encoding, errors)  # the end-of-archive block
        try:
            return super().frombuf(buf, encoding, errors)
        except tarfile.HeaderError as exc:
            raise TarHeaderError(f"a header is invalid ({exc})") from None


def iter_members(fileobj: IO[bytes], *, source: str = "tar") -> Iterator[tuple[str, bytes]]:
    """Regular-file members of a (possibly gzip-compressed) tar stream, in order.

    Links, devices, absolute paths and ``..`` raise ``HostileInputError``; a truncated or
    malformed tar raises ``CorruptShardError``; both name ``source`` and the member.
    """
    last = "<start>"
    try:
        with tarfile.open(fileobj=fileobj, mode="r|*", tarinfo=StrictTarInfo) as tar:
            for m in tar:
                name = _check_member(m, source)
                if name is None:
                    continue
                last = name
                f = tar.extractfile(m)
                data = f.read() if f is not None else b""
                if len(data) != m.size:
                    raise CorruptShardError(
                        f"{source}: member {name!r} is truncated ({len(data)} of {m.size} bytes)"
                    )
                yield name, data
    except TarHeaderError as exc:
        raise CorruptShardError(
            f"{source}: truncated or corrupt after member {last!r}: {exc}"
        ) from None
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError) as exc:
        if isinstance(exc, CorruptShardError):
            raise
        raise CorruptShardError(
            f"{source}: not a readable tar after member {last!r} ({exc}); "
            "the shard is truncated or corrupt"
        ) from None


def iter_samples(fileobj: IO[bytes], *, source: str = "tar") -> Iterator[Sample]:
    """Samples ``(key, {ext: bytes})`` from a tar stream, adjacent members grouped by key.

    A repeated extension within a sample, or a key that comes back later in the shard, is a
    ``CorruptShardError``: both would silently merge or duplicate samples otherwise.
    """
    return group_samples(iter_members(fileobj, source=source), source=source)


def group_samples(members: Iterable[tuple[str, bytes]], *, source: str = "tar") -> Iterator[Sample]:
    seen: set[str] = set()
    key: str | None = None
    fields: dict[str, bytes] = {}
    for name, data in members:
        k, ext = split_name(name)
        if not k or k.endswith("/"):
            continue
        if k != key:
            if key is not None:
                yield key, fields
            if k in seen:
                raise CorruptShardError(f"{source}: sample key {k!r} appears twice")
            seen.add(k)
            key, fields = k, {}
        if ext in fields:
            raise CorruptShardError(f"{source}: sample {k!r} has two {ext!r} members")
        fields[ext] = data
    if key is not None:
        yield key, fields


def scan_index(fileobj: IO[bytes], *, source: str = "tar") -> list[SampleIndex]:
    """Build the DALI index of an uncompressed tar: data offsets of each regular member."""
    from flashfeed.format.wdsindex import samples_from_members

    members: list[tuple[str, int, int]] = []
    try:
        with tarfile.open(fileobj=fileobj, mode="r:", tarinfo=StrictTarInfo) as tar:
            for m in tar:
                name = _check_member(m, source)
                if name is None:
                    continue
                if any(c.isspace() for c in name):
                    raise CorruptShardError(
                        f"{source}: member {name!r} has whitespace, which the index "
                        "format cannot hold; re-shard it with `flashfeed ingest`"
                    )
                members.append((name, m.offset_data, m.size))
    except TarHeaderError as exc:
        last = members[-1][0] if members else "<start>"
        raise CorruptShardError(
            f"{source}: truncated or corrupt after member {last!r}: {exc}"
        ) from None
    except CorruptShardError:
        raise
    except (tarfile.TarError, EOFError, ValueError) as exc:
        raise CorruptShardError(
            f"{source}: not a readable uncompressed tar ({exc}); it is truncated or corrupt"
        ) from None
    samples = samples_from_members(members)
    _check_unique(samples, source)
    end = _tar_length(fileobj)
    for s in samples:
        for c in s.components:
            if c.offset + c.size > end:
                raise CorruptShardError(f"{source}: member {c.name!r} is truncated")
    return samples


def _check_unique(samples: list[SampleIndex], source: str) -> None:
    """The index must agree with ``iter_samples``: one entry per key, one member per ext."""
    seen: set[str] = set()
    for s in samples:
        if s.key in seen:
            raise CorruptShardError(f"{source}: sample key {s.key!r} appears twice")
        seen.add(s.key)
        exts = [c.ext for c in s.components]
        if len(set(exts)) != len(exts):
            dup = next(e for e in exts if exts.count(e) > 1)
            raise CorruptShardError(f"{source}: sample {s.key!r} has two {dup!r} members")


def _tar_length(fileobj: IO[bytes]) -> int:
    fileobj.seek(0, io.SEEK_END)
    return fileobj.tell()
