"""The compiled building blocks of the document kernel (``docrows.py``): how a kernel is
compiled, the loops it writes a row's outputs with, and the pointers it reads shards by.

One pass that writes every output of a row while the row is in cache is what brings the
loader to memcpy speed; each separate numpy pass reads or writes the whole batch again.

A kernel is compiled on first use and cached on disk (numba's cache: ``NUMBA_CACHE_DIR``,
else the package's ``__pycache__``, else the user's cache directory); where none of those
is writable (a read-only install, no home) it is compiled in memory, once per process.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["DOCUMENTS", "LABELS", "OFFSETS", "POSITIONS", "TOKENS"]

#: which outputs the kernel writes (a bit each)
TOKENS, POSITIONS, DOCUMENTS, LABELS, OFFSETS = 1, 2, 4, 8, 16


def _compile(fn: Callable[..., Any]) -> Any:
    """``fn`` compiled without the GIL, cached on disk where a cache directory is writable
    (else compiled in memory, said once per process)."""
    try:
        return njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # numba found no writable cache directory
        if not _UNCACHED:
            warnings.warn(
                "flashfeed: no writable numba cache directory (NUMBA_CACHE_DIR, the "
                "package's __pycache__, the user's cache): the document kernel compiles "
                "once per process",
                RuntimeWarning,
                stacklevel=2,
            )
        _UNCACHED.append(fn.__name__)
        return njit(nogil=True)(fn)


_UNCACHED: list[str] = []  # functions compiled without a disk cache


def _widen_py(src: np.ndarray, dst: np.ndarray) -> None:
    """``dst[:] = src``, any integer types (a loop the compiler vectorises)."""
    for k in range(len(dst)):
        dst[k] = src[k]


def _ramp_py(dst: np.ndarray, first: int) -> None:
    """``dst[:] = first, first + 1, ...`` (indices from 0 within the slice, so vectorised)."""
    for k in range(len(dst)):
        dst[k] = first + k


def _const_py(dst: np.ndarray, value: int) -> None:
    """``dst[:] = value`` (a loop: numba compiles a broadcast slice assignment slowly)."""
    for k in range(len(dst)):
        dst[k] = value


_widen = _compile(_widen_py)
_const = _compile(_const_py)
_ramp = _compile(_ramp_py)


def _at_like_typed(typingctx: Any, address: Any, like: Any) -> Any:  # pragma: no cover
    """A pointer to ``like``'s item type at ``address`` (an address numpy gave)."""
    sig = types.CPointer(like.dtype)(address, like)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


_at_like: Any = intrinsic(_at_like_typed)


def _int64_at_typed(typingctx: Any, address: Any) -> Any:  # pragma: no cover - compiled
    """The int64 array at ``address`` (an address numpy gave) as a pointer."""
    sig = types.CPointer(types.int64)(address)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

    return sig, codegen


_int64_at: Any = intrinsic(_int64_at_typed)
