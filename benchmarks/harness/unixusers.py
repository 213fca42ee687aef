"""Real Unix users for stages with several tenants (the node service tells tenants apart by
the kernel's ``SO_PEERCRED``): made for a run and removed after it (only those it made),
and programs of this checkout run as them on this venv's packages. Needs root."""

from __future__ import annotations

import functools
import os
import pwd
import subprocess
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from flashfeed.runtime import lifeline

__all__ = ["BOOT", "SITE", "UserProgram", "unix_users", "user_env", "user_python"]

#: this venv's site-packages (its .pth files too): what a user's process imports from
SITE = sysconfig.get_paths()["purelib"]
#: ``python -c BOOT SITE SCRIPT ARGS...``: this venv's packages (their .pth files read), then
#: SCRIPT as __main__. Run it with ``PYTHONPATH`` starting at SITE (``user_env``): the venv's
#: packages then go before the system's (a system ``_cffi_backend`` of another version, under
#: numba's kernels, must not shadow the venv's own)
BOOT = (
    "import site, sys, runpy; site.addsitedir(sys.argv[1]); sys.argv = sys.argv[2:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
_PROBE = (
    "import site, sys; site.addsitedir(sys.argv[1]); "
    "import flashfeed.cache.node, flashfeed.loader.shard_dataset"
)


def user_env(*first: str) -> dict[str, str]:
    """The environment entries a user's process of this venv needs: ``PYTHONPATH`` of the
    folders ``first``, then SITE."""
    return {"PYTHONPATH": os.pathsep.join([*first, SITE])}


@contextmanager
def unix_users(names: Sequence[str]) -> Iterator[tuple[str, ...]]:
    """The users ``names``, made (``useradd -m``) where missing and removed again at the end
    (those made here only: an existing user is reused as it is)."""
    if os.geteuid() != 0:
        raise PermissionError("making Unix users for the tenants needs root")
    made: list[str] = []
    try:
        for name in names:
            try:
                pwd.getpwnam(name)
            except KeyError:
                subprocess.run(
                    ["useradd", "-m", "-s", "/bin/false", name], check=True, capture_output=True
                )
                made.append(name)
        yield tuple(names)
    finally:
        for name in made:
            subprocess.run(["userdel", "-r", name], check=False, capture_output=True)


@functools.cache
def user_python(user: str) -> str | None:
    """A Python of this minor version that ``user`` may run and import flashfeed with: this
    one, else the system's (this venv's may live under a home only root enters)."""
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for candidate in (sys.executable, f"/usr/bin/{minor}", f"/usr/local/bin/{minor}"):
        if not os.path.exists(candidate):
            continue
        try:
            r = subprocess.run(
                [candidate, "-c", _PROBE, SITE],
                env={**os.environ, **user_env()},
                user=user,
                capture_output=True,
                group=pwd.getpwnam(user).pw_gid,
                cwd="/",
            )
        except OSError:
            continue
        if r.returncode == 0:
            return candidate
    return None


class UserProgram:
    """Runs a script of this checkout as ``user`` with ``env`` and a HOME of its own (it
    imports flashfeed from this venv); each process started dies with this one."""

    def __init__(self, user: str, env: dict[str, str]) -> None:
        python = user_python(user)
        if python is None:
            raise RuntimeError(f"no Python that user {user} may run flashfeed with")
        pw = pwd.getpwnam(user)
        self.user, self.python, self.uid, self.gid = user, python, pw.pw_uid, pw.pw_gid
        self.env = {
            "PATH": "/usr/bin:/bin",
            "HOME": pw.pw_dir,
            "PYTHONDONTWRITEBYTECODE": "1",
            **user_env(),
            **env,
        }

    def start(self, script: str, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
        cmd = [self.python, "-c", BOOT, SITE, script, *args]
        return lifeline.popen(
            cmd,
            user=self.uid,
            group=self.gid,
            cwd="/",
            env=self.env,
            stdin=subprocess.DEVNULL,
            **popen,
        )
