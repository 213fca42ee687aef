"""The compiled document kernel (``loader/docfill.py``): its outputs equal a plain per-token
walk of random rows for every mix of outputs and token types; bad segments are refused;
its compiled code is cached on disk and read back by the next process; and it still works
where nothing is writable (a read-only install, no cache directory)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flashfeed.errors import CorruptShardError
from flashfeed.loader.segments import (
    DOC_OUTPUTS,
    IGNORE_INDEX,
    Segments,
    document_outputs,
    mapped_rows,
)

from support import REPO


def _random_batch(
    rng: np.random.Generator, rows: int, seq: int, dtype: str
) -> tuple[Segments, np.ndarray]:
    """``rows`` rows of ``seq`` tokens: each a few segments of random length, some padded,
    some full, some padding only."""
    counts, lengths = [], []
    for _ in range(rows):
        left, c = seq, 0
        while left > 0 and rng.random() > 0.15:
            n = int(rng.integers(1, left + 1))
            lengths.append(n)
            left -= n
            c += 1
        counts.append(c)
    s = len(lengths)
    seg = Segments(
        np.array(counts), np.array(lengths, np.int64), rng.integers(0, 10**9, s),
        rng.integers(0, 10**6, s),
    )  # fmt: skip
    info = np.iinfo(dtype)
    tokens = rng.integers(0, min(info.max, 2**31 - 1), (rows, seq)).astype(dtype)
    return seg, tokens


def _walk(seg: Segments, tokens: np.ndarray) -> dict[str, list]:
    """Every output by a plain loop over the rows' segments, token by token."""
    rows, seq = tokens.shape
    ref: dict[str, list] = {n: [] for n in ("position_ids", "document_ids", "labels")}
    ref["document_offsets"], cu, j = [], [0], 0
    for r in range(rows):
        pos, doc, lab, off = [], [], [], []
        for _ in range(int(seg.counts[r])):
            n, d = int(seg.lengths[j]), int(seg.ids[j])
            first = int(seg.starts[j]) if seg.starts is not None else 0
            for k in range(n):
                at = len(pos)
                pos.append(k)
                doc.append(d)
                lab.append(IGNORE_INDEX if k == 0 else int(tokens[r, at]))
                off.append(first + k)
            cu.append(cu[-1] + n)
            j += 1
        if len(pos) < seq:
            pad = seq - len(pos)
            pos += list(range(pad))
            doc += [-1] * pad
            lab += [IGNORE_INDEX] * pad
            off += [-1] * pad
            cu.append(cu[-1] + pad)
        for name, got in zip(ref, (pos, doc, lab, off), strict=True):
            ref[name].append(got)
    ref["cu_seqlens"] = cu
    ref["max_seqlen"] = int(np.diff(cu).max()) if rows else 0  # type: ignore[assignment]
    return ref


@pytest.mark.parametrize("dtype", ["uint16", "int32", "uint32"])
@pytest.mark.parametrize(
    "outputs",
    [DOC_OUTPUTS, ("labels",), ("position_ids", "cu_seqlens"), ("document_ids", "max_seqlen")],
)
def test_the_kernel_equals_a_per_token_walk(dtype, outputs):
    rng = np.random.default_rng(len(outputs) * 31 + len(dtype))
    for rows, seq in ((1, 1), (5, 7), (16, 64), (3, 300)):
        seg, tokens = _random_batch(rng, rows, seq, dtype)
        ref = _walk(seg, tokens)
        wide = np.full(tokens.shape, 7, np.int64)
        out = document_outputs(
            seg, seq, tokens, outputs, lambda s, d: np.full(s, 7, d), tokens_out=wide
        )
        assert wide.tolist() == tokens.astype(np.int64).tolist()
        assert set(out) == set(outputs)
        for name in outputs:
            got = out[name]
            assert (got.tolist() if isinstance(got, np.ndarray) else got) == ref[name], name
            if isinstance(got, np.ndarray):
                assert got.dtype == (np.int32 if name == "cu_seqlens" else np.int64)


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_rows_read_in_place_from_several_arrays_equal_the_gathered_rows(dtype):
    rng = np.random.default_rng(7)
    seg, tokens = _random_batch(rng, 24, 50, dtype)
    # the batch's rows lie, out of order, in record batches of three shards
    spots = [(s, c, i) for s in range(3) for c in range(2) for i in range(9)]
    arrays = {s: [rng.integers(0, 99, (9, 50)).astype(dtype) for _ in range(2)] for s in range(3)}
    at = [spots[k] for k in rng.permutation(len(spots))[:24].tolist()]
    for r, (s, c, i) in enumerate(at):
        arrays[s][c][i] = tokens[r]
    mapped = mapped_rows(arrays, at)
    assert mapped is not None and mapped.shape == tokens.shape
    ref = _walk(seg, tokens)
    wide = np.full(tokens.shape, 7, np.int64)
    out = document_outputs(
        seg, 50, mapped, DOC_OUTPUTS, lambda s, d: np.full(s, 7, d), tokens_out=wide
    )
    assert wide.tolist() == tokens.astype(np.int64).tolist()
    for name in DOC_OUTPUTS:
        got = out[name]
        assert (got.tolist() if isinstance(got, np.ndarray) else got) == ref[name], name


def test_rows_not_in_place_or_out_of_range_are_not_read_by_address():
    a = np.zeros((4, 6), np.uint16)
    assert mapped_rows({0: [a[:, ::2]]}, [(0, 0, 1)]) is None  # not contiguous: gathered
    with pytest.raises(IndexError, match="row 4 of a record batch of 4"):
        mapped_rows({0: [a]}, [(0, 0, 4)])


def test_a_batch_of_no_rows_gives_empty_outputs():
    seg = Segments(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    out = document_outputs(
        seg, 4, np.zeros((0, 4), np.uint16), ("position_ids", "cu_seqlens", "max_seqlen"),
        lambda s, d: np.empty(s, d),
    )  # fmt: skip
    assert out["position_ids"].shape == (0, 4)
    assert out["cu_seqlens"].tolist() == [0] and out["max_seqlen"] == 0


@pytest.mark.parametrize(
    ("counts", "lengths", "says"),
    [
        ([2, 1], [3, 3, 2], "segments of 6 tokens in a row of 4"),  # row 0 overfull
        ([1, 1], [4, 0], "segments of 0 tokens"),  # an empty segment
        ([1, 1], [4, -2], "segments of 0 tokens"),  # a negative length
        ([1, 2], [4, 2], "segments of 0 tokens"),  # more segments than the columns hold
    ],
)
def test_segments_that_do_not_fit_are_refused(counts, lengths, says):
    seg = Segments(np.array(counts), np.array(lengths), np.arange(len(lengths)))
    with pytest.raises(CorruptShardError, match=f"shard x: .*do not fit the rows.*{says}"):
        document_outputs(
            seg, 4, np.zeros((2, 4), np.uint16), ("labels",), lambda s, d: np.empty(s, d),
            where="shard x",
        )  # fmt: skip


_RUN = """
import warnings, numpy as np
warnings.simplefilter("always")
from flashfeed.loader.segments import Segments, document_outputs
seg = Segments(np.array([2, 0]), np.array([3, 5]), np.array([1, 2]))
out = document_outputs(seg, 8, np.arange(16, dtype=np.uint16).reshape(2, 8), ("labels",),
                       lambda s, d: np.empty(s, d))
from flashfeed.loader.docfill import _fill_jit
print(out["labels"].tolist())
print(sum(_fill_jit.stats.cache_hits.values()), sum(_fill_jit.stats.cache_misses.values()))
"""
_LABELS = "[[-100, 1, 2, -100, 4, 5, 6, 7], [-100, -100, -100, -100, -100, -100, -100, -100]]"


def _run(env: dict[str, str], prefix: list[str] | None = None) -> tuple[list[str], str]:
    proc = subprocess.run(
        [*(prefix or []), sys.executable, "-c", _RUN], capture_output=True, text=True,
        timeout=300, cwd=REPO, env={**os.environ, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines(), proc.stderr


def test_the_compiled_kernel_is_cached_on_disk_and_read_back(tmp_path: Path):
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    (labels, counts), _ = _run(env)
    assert labels == _LABELS and counts == "0 1"  # compiled, written to the cache
    assert list((tmp_path / "numba").rglob("docfill._fill-*.nbi"))
    (labels, counts), _ = _run(env)
    assert labels == _LABELS and counts == "1 0"  # read back, not compiled again


def test_with_no_writable_cache_directory_it_compiles_in_memory_and_says_so():
    env = {"NUMBA_CACHE_DIR": "/dev/null/numba"}  # not a directory, and only it is tried
    env["NUMBA_CACHE_LOCATOR_CLASSES"] = "UserProvidedCacheLocator"
    (labels, counts), err = _run(env)
    assert labels == _LABELS and counts.split()[0] == "0"  # nothing read from a cache
    assert err.count("no writable numba cache directory") == 1


def test_a_read_only_install_works(tmp_path: Path):
    """The repository (the installed package) bind-mounted read-only, no cache directory
    given, the user's cache directory inside it too: nothing can be written anywhere."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare to mount the package read-only")
    repo = str(REPO)
    script = f'mount --bind -o ro {repo} {repo} && exec "$@"'
    env = {"XDG_CACHE_HOME": f"{repo}/.no-cache", "HOME": f"{repo}/.no-home"}
    env["NUMBA_CACHE_DIR"] = ""
    (labels, counts), err = _run(env, ["unshare", "--mount", "sh", "-c", script, "sh"])
    assert labels == _LABELS and counts.split()[0] == "0"
    assert "no writable numba cache directory" in err


def test_segments_are_gathered_from_several_tables_in_row_order():
    from flashfeed.loader.docfill import gather_segments

    rng = np.random.default_rng(4)
    tables = []
    for rows in (5, 9):
        lens = rng.integers(0, 4, rows)
        offsets = np.zeros(rows + 1, np.int32)  # Arrow's list offsets: int32
        np.cumsum(lens, out=offsets[1:])
        tables.append((offsets, rng.integers(0, 10**6, (int(offsets[-1]), 3))))
    group = rng.integers(0, 2, 40)
    inner = np.array([rng.integers(0, len(tables[g][0]) - 1) for g in group])
    counts, seg = gather_segments(group, inner, tables)
    want = [
        tables[g][1][tables[g][0][i] : tables[g][0][i + 1]]
        for g, i in zip(group, inner, strict=True)
    ]
    assert counts.tolist() == [len(w) for w in want]
    assert seg.tolist() == np.concatenate(want).tolist()
    with pytest.raises(IndexError, match="row 5 is not within"):
        gather_segments(np.array([0]), np.array([5]), tables)  # table 0 holds rows 0..4
    with pytest.raises(ValueError, match="one width"):
        gather_segments(
            np.array([0, 1]), np.array([0, 0]), [tables[0], (tables[1][0], tables[1][1][:, :2])]
        )
