"""The layout the README's "Layout" table describes, checked on the source: no folder of
more than 20 modules, no core module (``flashfeed/``) importing a component (``cache``,
``loader``, ``ingest``, ``monitor``), and a private name imported only by a module of the
folder that defines it. (Import circles: ``test_dependencies.py``.)"""

from __future__ import annotations

import ast
from pathlib import Path

from support import REPO

COMPONENTS = ("cache", "loader", "ingest", "monitor")


def _modules() -> dict[str, tuple[Path, bool]]:
    """Import name -> (file, is a package) of every product module."""
    out = {}
    for top in ("flashfeed", *COMPONENTS):
        for path in (REPO / top).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[0] in COMPONENTS:
                parts.insert(0, "flashfeed")
            package = parts[-1] == "__init__"
            out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _imports(name: str, path: Path, package: bool) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) of every import statement of a module."""
    here = name if package else name.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = here.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def _folder(name: str, modules: dict[str, tuple[Path, bool]]) -> str:
    return name if name in modules and modules[name][1] else name.rsplit(".", 1)[0]


def test_no_folder_holds_more_than_20_modules() -> None:
    folders: dict[Path, int] = {}
    for path, _ in _modules().values():
        if path.name != "__init__.py":
            folders[path.parent] = folders.get(path.parent, 0) + 1
    assert len(folders) > 10  # the walk found the product's folders
    assert {str(f.relative_to(REPO)): n for f, n in folders.items() if n > 20} == {}


def test_no_core_module_imports_a_component() -> None:
    modules = _modules()
    core = [n for n in modules if n.split(".")[1:2] not in ([c] for c in COMPONENTS)]
    assert "flashfeed.plan.plan" in core and "flashfeed.cache.shardcache" not in core
    bad = [
        (n, target)
        for n in core
        for target, _ in _imports(n, *modules[n])
        if any(
            target == f"flashfeed.{c}" or target.startswith(f"flashfeed.{c}.") for c in COMPONENTS
        )
    ]
    assert bad == []


def test_private_names_stay_in_the_folder_that_defines_them() -> None:
    modules = _modules()
    bad = [
        (n, target, name)
        for n in modules
        for target, names in _imports(n, *modules[n])
        for name in names
        if name.startswith("_")
        and not name.startswith("__")
        and _folder(n, modules) != _folder(target, modules)
    ]
    assert bad == []
