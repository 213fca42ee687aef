"""The table format's JSONL rows: the same rows and the same errors, word for word, as a
``json.loads`` of each line (the scanner-based parse must not change what a file means)."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flashfeed.ingest.sources.tables import _rows

URL = "mem://t.jsonl"


def reference(data: bytes) -> list[tuple[int, dict]] | str:
    """Rows by ``json.loads`` of each line (its newline kept), or the first error's text."""
    out = []
    for n, line in enumerate(io.StringIO(data.decode("utf-8")), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            return f"{URL}:{n}: not a JSON object ({exc})"
        if not isinstance(row, dict):
            return f"{URL}:{n}: a JSONL row must be an object, got {row!r:.60}"
        out.append((n, row))
    return out


def parsed(data: bytes) -> list[tuple[int, dict]] | str:
    try:
        return list(_rows(URL, "jsonl", data))
    except ValueError as exc:
        return str(exc)


LINES = [
    '{"text": "a"}',
    '{"text": "b"}  ',
    '  {"text": "lead"}',
    '{"text": "cr"}\r',
    "",
    "   ",
    "\u3000",
    "\x1c",
    '{"text": "x"} {"text": "y"}',
    '{"text": "x"}, 1',
    '{"text": "cut',
    '{"text": ',
    "[1, 2]",
    "3",
    '"str"',
    "\ufeff" + '{"text": "bom"}',
    '{"text": "\\ud800"}',
    '{"a": {"b": [1, 2, {"c": null}]}, "text": "nested"}',
    '{"text": "t\\u00e9"}',
    "{}",
    "nul\x00",
]


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("where", ["first", "middle", "last", "last-no-newline"])
def test_each_kind_of_line_as_json_loads_reads_it(line: str, where: str) -> None:
    good = '{"text": "ok"}'
    lines = {
        "first": [line, good, good],
        "middle": [good, line, good],
        "last": [good, good, line],
        "last-no-newline": [good, good, line],
    }[where]
    data = "\n".join(lines) + ("" if where == "last-no-newline" else "\n")
    assert parsed(data.encode()) == reference(data.encode())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([*LINES, '{"text": "ok"}']), max_size=8), st.booleans())
def test_any_mix_of_lines_as_json_loads_reads_it(lines: list[str], newline: bool) -> None:
    data = ("\n".join(lines) + ("\n" if newline else "")).encode()
    assert parsed(data) == reference(data)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_line_as_json_loads_reads_it(text: str) -> None:
    data = ('{"text": "ok"}\n' + text + "\n").encode("utf-8", "surrogatepass")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return  # not UTF-8: refused before any line is read, by both
    assert parsed(data) == reference(data)
