"""flashfeed's own modules need neither webdataset (a test and benchmark peer) nor filelock
(the cache has its own fcntl locks): every module imports with both made unimportable. And
every module imports first, into an interpreter that holds no flashfeed module yet: an
import circle shows as a module that cannot be the first one imported."""

from __future__ import annotations

import subprocess
import sys

#: every module's name, as the walk of the product's packages finds them: ``names``
_WALK = """
import importlib, pkgutil, sys
names = set()
for pkg in ("flashfeed", "flashfeed.ingest", "flashfeed.cache", "flashfeed.loader",
            "flashfeed.monitor"):
    mod = importlib.import_module(pkg)
    names.update(i.name for i in pkgutil.walk_packages(mod.__path__, pkg + "."))
"""

_BLOCKED = """
failed = {}
for name in sorted(names):
    try:
        importlib.import_module(name)
    except ImportError as e:
        if getattr(e, "name", None) in ("webdataset", "filelock"):
            failed[name] = str(e)
print(len(names), failed)
"""

_FIRST = """
failed = {}
for name in sorted(names):
    for loaded in [m for m in sys.modules if m == "flashfeed" or m.startswith("flashfeed.")]:
        del sys.modules[loaded]  # this module is the first of flashfeed's to be imported
    try:
        importlib.import_module(name)
    except ImportError as e:
        failed[name] = str(e)
print(len(names), failed)
"""


def _walk(code: str, *, before: str = "") -> tuple[int, str]:
    """(modules walked, the failures ``code`` printed) in a fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", before + _WALK + code], capture_output=True,
                         text=True, timeout=600, check=True)  # fmt: skip
    count, failed = out.stdout.strip().split(" ", 1)
    return int(count), failed


def test_every_flashfeed_module_imports_without_webdataset_or_filelock() -> None:
    block = 'import sys\nfor b in ("webdataset", "filelock"):\n    sys.modules[b] = None\n'
    count, failed = _walk(_BLOCKED, before=block)  # any import of them raises ImportError
    assert count > 200  # the walk found the product's modules
    assert failed == "{}"


def test_every_module_imports_first_so_no_import_circles() -> None:
    count, failed = _walk(_FIRST)
    assert count > 200  # the walk found the product's modules
    assert failed == "{}"


def test_every_package_folder_is_listed_for_a_wheel_install() -> None:
    """The editable install finds sub-packages by path; a wheel ships only the listed ones."""
    import tomllib

    from support import REPO

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = set()
    for name, folder in dirs.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *rel)))
    assert found == listed, f"add {sorted(found - listed)} / drop {sorted(listed - found)}"
