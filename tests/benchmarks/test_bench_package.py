"""benchmarks/ is a package run with ``python -m``: no module edits ``sys.path``, no module is
named like a package it could shadow, and every module imports in a fresh interpreter whose
only way to the repository root is ``-m`` (as the suite runs its stages)."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from support import REPO

BENCH = REPO / "benchmarks"
MODULES = sorted(
    ".".join(p.relative_to(REPO).with_suffix("").parts)
    for p in BENCH.rglob("*.py")
    if p.name != "__init__.py" and "results" not in p.parts
)
STAGES = [m for m in MODULES if m.startswith("benchmarks.stages.")]
# an insert, append or extend on sys.path, or an assignment to it or to a slice of it
_PATH_EDIT = re.compile(r"sys\.path\s*(\.\s*(insert|append|extend)|\[[^\]]*\]\s*=|\+=)")


def test_the_folders_are_packages() -> None:
    for folder in (BENCH, BENCH / "harness", BENCH / "stages"):
        assert (folder / "__init__.py").is_file(), folder


def test_no_benchmark_file_edits_sys_path() -> None:
    edits = [
        f"{p.relative_to(REPO)}:{n}"
        for p in [*BENCH.rglob("*.py"), *BENCH.rglob("*.sh")]
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if _PATH_EDIT.search(line)
    ]
    assert not edits, edits


def test_the_check_sees_a_sys_path_edit() -> None:
    assert _PATH_EDIT.search("sys.path.insert(0, HERE)")
    assert _PATH_EDIT.search("sys.path[:0] = [x]")
    assert not _PATH_EDIT.search("for p in sys.path if p")


def test_no_module_shares_a_name_with_an_importable_package() -> None:
    # run flat (``python benchmarks/x.py``), benchmarks/cache.py hid the repository's cache
    # package; names must stay clear of every top-level module or package this Python finds
    clashes = {}
    for m in MODULES:
        leaf = m.rsplit(".", 1)[1]
        spec = importlib.util.find_spec(leaf)
        if spec is not None:
            clashes[m] = spec.origin or "namespace package"
    assert not clashes, clashes


def test_every_module_imports_in_a_fresh_interpreter_from_the_repository_root() -> None:
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    run = subprocess.run(
        [sys.executable, "-c", code, *MODULES],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.parametrize("module", ["benchmarks.suite", *STAGES])
def test_each_stage_answers_help_when_run_with_dash_m(module: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "usage:" in run.stdout
