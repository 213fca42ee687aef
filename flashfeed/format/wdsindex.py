"""DALI's WebDataset index format (``v1.2``), written beside every tar shard.

First line ``v1.2 <num_samples>``; then one line per sample holding, for each of its
components, ``<ext> <data_offset> <size> <member_name>``. DALI's ``fn.readers.webdataset``
takes these files as ``index_paths``; flashfeed uses them for random access by sample.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from flashfeed.errors import CorruptShardError

__all__ = ["Component", "SampleIndex", "format_index", "parse_index", "split_name"]

VERSION = "v1.2"


@dataclass(frozen=True)
class Component:
    ext: str
    offset: int
    size: int
    name: str


@dataclass(frozen=True)
class SampleIndex:
    """Where one sample's members lie in its tar."""

    key: str
    components: tuple[Component, ...]

    @property
    def start(self) -> int:
        return min(c.offset for c in self.components)

    @property
    def end(self) -> int:
        return max(c.offset + c.size for c in self.components)


def split_name(name: str) -> tuple[str, str]:
    """``"dir/abc.seg.jpg"`` -> ``("dir/abc", "seg.jpg")``: the key ends at the first dot of
    the last path component (the WebDataset convention, also DALI's)."""
    dot = name.find(".", name.rfind("/") + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


def format_index(samples: Sequence[SampleIndex]) -> str:
    lines = [f"{VERSION} {len(samples)}"]
    for s in samples:
        lines.append(" ".join(f"{c.ext} {c.offset} {c.size} {c.name}" for c in s.components))
    return "\n".join(lines) + "\n"


def parse_index(text: str | bytes, *, source: str = "index") -> list[SampleIndex]:
    """Parse an index; anything malformed is a ``CorruptShardError`` naming ``source``."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CorruptShardError(f"{source}: index is not UTF-8 text ({exc})") from None
    lines = text.splitlines()
    if not lines:
        raise CorruptShardError(f"{source}: index is empty")
    head = lines[0].split()
    if len(head) != 2 or head[0] != VERSION or not _is_count(head[1]):
        raise CorruptShardError(
            f"{source}: index must start with '{VERSION} <num_samples>', got {lines[0][:80]!r}"
        )
    expected = int(head[1])
    body = [ln for ln in lines[1:] if ln.strip()]
    if len(body) != expected:
        raise CorruptShardError(
            f"{source}: index header says {expected} samples but {len(body)} lines follow"
        )
    return [_parse_line(ln, lineno, source) for lineno, ln in enumerate(body, start=2)]


def _is_count(text: str) -> bool:
    """ASCII digits only: ``str.isdigit`` also takes ``'²'``, which ``int`` refuses."""
    return text.isascii() and text.isdigit()


def _parse_line(line: str, lineno: int, source: str) -> SampleIndex:
    fields = line.split()
    if not fields or len(fields) % 4:
        raise CorruptShardError(
            f"{source}:{lineno}: expected groups of '<ext> <offset> <size> <name>'"
        )
    comps = []
    for i in range(0, len(fields), 4):
        ext, off, size, name = fields[i : i + 4]
        if not (_is_count(off) and _is_count(size)):
            raise CorruptShardError(f"{source}:{lineno}: offset and size must be integers")
        comps.append(Component(ext, int(off), int(size), name))
    return SampleIndex(split_name(comps[0].name)[0], tuple(comps))


def samples_from_members(members: Iterable[tuple[str, int, int]]) -> list[SampleIndex]:
    """Group ``(member_name, data_offset, size)`` of a tar into index entries, adjacent
    members with the same key forming one sample (as DALI's ``wds2idx`` does)."""
    out: list[SampleIndex] = []
    current: list[Component] = []
    current_key: str | None = None
    for name, offset, size in members:
        key, ext = split_name(name)
        if not key or key.endswith("/"):
            continue  # hidden files such as ``.DS_Store``
        if key != current_key and current:
            out.append(SampleIndex(current_key or "", tuple(current)))
            current = []
        current_key = key
        current.append(Component(ext, offset, size, name))
    if current:
        out.append(SampleIndex(current_key or "", tuple(current)))
    return out
