"""A training script that spawned reader processes cannot run again gets one error that says
what is wrong and how to fix it, not DALI's "Workers initialization failed": real scripts,
run as their own processes, with real DALI reader processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from flashfeed.loader.image.spawncheck import unguarded_line

from support.loader_helpers import make_image_dataset

LOADER = (
    'Loader({url!r}, batch_size=4, image_size=16, device="cpu", py_workers=1, '
    'num_threads=1, reader_start="spawn")'
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    url = str(tmp_path_factory.mktemp("spawnguard") / "ds")
    make_image_dataset(url, [8, 8], size=16)
    return url


def run_script(path: Path, *, stdin: bool = False) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-"] if stdin else [sys.executable, str(path)]
    return subprocess.run(
        args,
        input=path.read_text() if stdin else None,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=path.parent,
    )


def write(tmp_path: Path, name: str, body: str, url: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).format(loader=LOADER.format(url=url)))
    return path


def last_line(r: subprocess.CompletedProcess[str]) -> str:
    return r.stderr.strip().splitlines()[-1]


def test_a_script_without_a_main_guard_is_told_which_line_to_guard(tmp_path, dataset):
    script = write(
        tmp_path,
        "train.py",
        """\
        from flashfeed.loader import Loader

        loader = {loader}
        print("delivered", sum(len(b["__key__"]) for b in loader))
        """,
        dataset,
    )
    r = run_script(script)
    assert r.returncode == 1, r.stdout + r.stderr
    err = last_line(r)
    assert err.startswith("flashfeed.loader.image.spawncheck.SpawnError:"), r.stderr
    assert f"{script} line 3" in err
    assert 'if __name__ == "__main__":' in err and 'reader_start="fork"' in err
    assert "Workers initialization failed" not in r.stderr.replace(
        "DALI then says only 'Workers initialization failed'", ""
    )
    assert "delivered" not in r.stdout


def test_the_same_script_with_a_guard_delivers_every_sample(tmp_path, dataset):
    script = write(
        tmp_path,
        "train.py",
        """\
        from flashfeed.loader import Loader


        def main() -> None:
            loader = {loader}
            print("delivered", sum(len(b["__key__"]) for b in loader))
            loader.close()


        if __name__ == "__main__":
            main()
        """,
        dataset,
    )
    r = run_script(script)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["delivered", "16"]


def test_a_script_read_from_stdin_is_told_to_be_a_file(tmp_path, dataset):
    script = write(
        tmp_path,
        "train.py",
        """\
        from flashfeed.loader import Loader

        if __name__ == "__main__":
            loader = {loader}
            print("delivered", sum(len(b["__key__"]) for b in loader))
        """,
        dataset,
    )
    r = run_script(script, stdin=True)
    assert r.returncode == 1, r.stdout + r.stderr
    err = last_line(r)
    assert "SpawnError" in err and "not read from a file (<stdin>)" in err, r.stderr
    assert "save it as a file" in err


def test_dalis_failure_to_start_readers_names_the_main_script(tmp_path, dataset):
    """The loader is guarded, but the script starts a helper process at its top level, which
    cannot happen again inside a spawned reader process: DALI's readers fail to start, and
    the error names the script and the guard."""
    script = write(
        tmp_path,
        "train.py",
        """\
        import multiprocessing

        from flashfeed.loader import Loader

        helper = multiprocessing.get_context("spawn").Process(target=int)
        helper.start()
        helper.join()


        def main() -> None:
            loader = {loader}
            print("delivered", sum(len(b["__key__"]) for b in loader))


        if __name__ == "__main__":
            main()
        """,
        dataset,
    )
    r = run_script(script)
    assert r.returncode == 1, r.stdout + r.stderr
    err = last_line(r)
    assert err.startswith("flashfeed.loader.image.spawncheck.SpawnError:"), r.stderr
    assert "failed to start" in err and str(script) in err
    assert 'if __name__ == "__main__":' in err
    assert "Workers initialization failed" in r.stderr  # DALI's own error, kept as the cause


@pytest.mark.parametrize(
    ("line", "unguarded"),
    [(1, True), (2, True), (5, False), (6, False), (8, True), (10, False)],
)
def test_which_lines_run_again_in_a_spawned_process(line: int, unguarded: bool) -> None:
    source = textwrap.dedent(
        """\
        import x
        def f():
            return 1
        if __name__ == "__main__":
            f()
            f()
        else:
            f()
        if "__main__" == __name__:
            f()
        """
    )
    assert unguarded_line(source, line) is unguarded
