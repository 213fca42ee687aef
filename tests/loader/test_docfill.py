"""The document kernel ``TokenLoader`` calls (``loader/tokens/docrows.py``, compiled by
``loader/tokens/docfill.py``'s ``_compile``): its compiled code is cached on disk and read back by
the next process, and it still works where nothing is writable (a read-only install, no
cache directory). Its outputs are checked against a per-token walk in test_docrows.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

_RUN = """
import warnings, numpy as np
from types import SimpleNamespace
warnings.simplefilter("always")
from flashfeed.loader.tokens.docrows import DocRows, _fill_rows_jit, row_outputs
tab = (np.array([0, 2, 2], np.int32), np.array([[3, 1, 0], [5, 2, 0]], np.int64))
shard = SimpleNamespace(view=SimpleNamespace(columns={"tokens": [
    np.arange(16, dtype=np.uint16).reshape(2, 8)]}), firsts=np.zeros(1, np.int64),
    segments=lambda: [tab])
out = row_outputs(DocRows({0: shard}), np.zeros(2, np.int64), np.arange(2), ("labels",),
                  np.empty((2, 8), np.int64), lambda s, d: np.empty(s, d), where=str)
print(out["labels"].tolist())
st = _fill_rows_jit.stats
print(sum(st.cache_hits.values()), sum(st.cache_misses.values()))
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
    assert list((tmp_path / "numba").rglob("docrows._fill_rows-*.nbi"))
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
