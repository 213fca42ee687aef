"""Make a bare GPU machine able to run ``benchmarks/gpu.sh`` without network: the wheels it
lacks from a wheelhouse, and flashfeed importable from the checkout without installing it.
Standard library only: this runs before numpy or flashfeed can be imported."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

__all__ = ["install_wheels", "make_shim", "merge_nvidia_namespace", "missing_wheels"]


def _dist_name(wheel: str) -> str:
    return re.sub(r"[-_.]+", "-", Path(wheel).name.split("-", 1)[0]).lower()


def missing_wheels(wheelhouse: str | Path, target: str | Path | None = None) -> list[Path]:
    """The wheels of ``wheelhouse`` whose distribution is neither installed in this Python
    nor already in ``target``."""
    paths = [Path(target)] if target else []
    have = {
        re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower()
        for d in importlib.metadata.distributions()
    }
    have |= {
        re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower()
        for d in importlib.metadata.distributions(path=[str(p) for p in paths])
    }
    return sorted(w for w in Path(wheelhouse).glob("*.whl") if _dist_name(w.name) not in have)


def install_wheels(wheels: list[Path], target: str | Path, *, use_pip: bool = True) -> str:
    """Install ``wheels`` into ``target`` with no index and no dependency resolution (the
    wheelhouse holds the dependencies); by unpacking them where this Python has no pip.
    Returns how."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    if not wheels:
        return "nothing missing"
    if (
        use_pip
        and subprocess.run(
            [sys.executable, "-m", "pip", "--version"], capture_output=True
        ).returncode
        == 0
    ):
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
        cmd += ["--disable-pip-version-check", "--target", str(target), *map(str, wheels)]
        subprocess.run(cmd, check=True)
        return "pip"
    for wheel in wheels:  # a wheel is a zip of what goes into site-packages
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
    return "unzip"


def make_shim(target: str | Path) -> Path | None:
    """Where flashfeed is not installed, a folder that makes it importable from this checkout
    (``flashfeed.loader`` is the top-level ``loader/`` folder, as pyproject's package-dir maps
    it); put ``target`` on PYTHONPATH. None when flashfeed already imports."""
    probe = "import flashfeed.loader, flashfeed.cache"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    extra = [
        p
        for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if p and Path(p) != Path(target)
    ]
    env["PYTHONPATH"] = os.pathsep.join(extra)
    root = Path(__file__).resolve().parent.parent
    if (
        subprocess.run(
            [sys.executable, "-c", probe], env=env, cwd="/", capture_output=True
        ).returncode
        == 0
    ):
        return None
    pkg = Path(target) / "flashfeed"
    if pkg.exists():
        shutil.rmtree(pkg)
    shutil.copytree(root / "flashfeed", pkg, symlinks=True)
    for sub in ("loader", "cache", "ingest"):
        (pkg / sub).symlink_to(root / sub, target_is_directory=True)
    return pkg


def merge_nvidia_namespace() -> None:
    """The ``nvidia`` package spread over several sys.path entries (wheels in the target
    folder, torch's CUDA wheels in site-packages) seen as one, even where one copy has an
    ``__init__.py``."""
    try:
        import nvidia
    except ImportError:
        return
    dirs = [str(Path(p) / "nvidia") for p in sys.path if p and (Path(p) / "nvidia").is_dir()]
    nvidia.__path__ = list(dict.fromkeys([*nvidia.__path__, *dirs]))
