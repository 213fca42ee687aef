"""The document kernels warmed in a daemon thread from ``TokenLoader``'s construction
(``loader/tokens/docwarm.py``): construction does not wait for it, the first batch does and equals
one made with the kernels already compiled; an error in it is the first batch's error; a
process that exits while it compiles exits cleanly."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from flashfeed.loader import TokenLoader
from flashfeed.loader.tokens.segments import DOC_OUTPUTS
from flashfeed.loader.tokens.tokens import docwarm

from support import REPO
from support.token_docs import byte_bpe, make_doc_token_dataset, mixed_documents

SEQ = 64
DOCS = mixed_documents(60, seed=4)


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> str:
    tok = byte_bpe(tmp_path_factory.mktemp("tok") / "tok.json", DOCS)
    out = str(tmp_path_factory.mktemp("docs") / "ds")
    make_doc_token_dataset(out, DOCS, tok, seq_len=SEQ, packing="best-fit", docs_per_shard=20)
    return out


def _first(prefix: str, **kw) -> dict:
    loader = TokenLoader(prefix, batch_size=8, seed=2, device="cpu", **kw)
    return next(iter(loader))


def _gated(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """The warm-up made to wait for ``release`` before its work (and to say it started)."""
    started, release = threading.Event(), threading.Event()
    real = docwarm._warm

    def gated(rows, tokens):
        started.set()
        release.wait()
        real(rows, tokens)

    monkeypatch.setattr(docwarm, "_warm", gated)
    monkeypatch.setattr(docwarm, "_STARTED", {})
    return started, release


def test_construction_returns_while_the_kernels_compile_and_batch_one_waits(prefix, monkeypatch):
    expected = _first(prefix, outputs=DOC_OUTPUTS)  # warm-up not gated: compiled already
    started, release = _gated(monkeypatch)
    loader = TokenLoader(prefix, batch_size=8, seed=2, device="cpu", outputs=DOC_OUTPUTS)
    warm = loader._warm
    assert warm is not None and started.wait(30)
    assert warm.thread.daemon and warm.thread.is_alive() and not warm.done.is_set()
    release.set()
    got = next(iter(loader))
    assert warm.done.is_set() and not warm.thread.is_alive() and loader._warm is None
    assert set(got) == set(expected)
    for name, value in expected.items():
        if isinstance(value, list | int):
            assert got[name] == value, name
        else:
            np.testing.assert_array_equal(got[name].numpy(), value.numpy(), err_msg=name)
    tokens_only = _first(prefix)
    assert TokenLoader(prefix, batch_size=8, device="cpu")._warm is None
    np.testing.assert_array_equal(got["tokens"].numpy(), tokens_only["tokens"].numpy())


def test_one_warm_up_per_type_pair_in_a_process(prefix, monkeypatch):
    _, release = _gated(monkeypatch)
    release.set()
    a = TokenLoader(prefix, batch_size=8, device="cpu", outputs=DOC_OUTPUTS)._warm
    b = TokenLoader(prefix, batch_size=8, device="cpu", outputs=("labels",))._warm
    c = TokenLoader(prefix, batch_size=8, device="cpu", outputs=DOC_OUTPUTS, dtype="int32")._warm
    assert a is b and a is not c and (a.rows, a.tokens) == (np.dtype("uint16"), np.int64)
    for w in (a, c):
        w.wait()


def test_an_error_in_the_warm_up_is_the_first_batchs_error(prefix, monkeypatch):
    def broken(rows, tokens):
        raise ImportError("No module named 'numba'")

    monkeypatch.setattr(docwarm, "_warm", broken)
    monkeypatch.setattr(docwarm, "_STARTED", {})
    loader = TokenLoader(prefix, batch_size=8, device="cpu", outputs=DOC_OUTPUTS)
    with pytest.raises(ImportError, match="No module named 'numba'"):
        next(iter(loader))
    # a later loader tries again (the kernels themselves are fine)
    monkeypatch.undo()
    monkeypatch.setattr(docwarm, "_STARTED", {})
    assert "position_ids" in _first(prefix, outputs=DOC_OUTPUTS)


@pytest.mark.parametrize("schema, want", [
    ("fixed_size_list<item: uint16>[2048]", "uint16"),
    ("fixed_size_list<int32>[64]", "int32"),
    ("list<element: uint32>", "uint32"),
    ("list<item: string>", None),
    (None, None),
])  # fmt: skip
def test_the_stored_type_is_read_from_the_schema(schema, want):
    got = docwarm.stored_dtype(schema)
    assert (got if got is None else got.name) == want


def test_a_process_that_exits_while_the_kernels_compile_exits_cleanly(prefix, tmp_path: Path):
    code = (
        "from flashfeed.loader import TokenLoader; from flashfeed.loader.tokens.segments import "
        f"DOC_OUTPUTS; l = TokenLoader({prefix!r}, batch_size=8, device='cpu', "
        "outputs=DOC_OUTPUTS); print('alive', l._warm.thread.is_alive())"
    )
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}  # empty: compiles
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "alive True" and "Fatal" not in run.stderr, run.stderr
