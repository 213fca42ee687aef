"""The compiled building blocks of the document kernel (``docrows.py``): how a kernel is
compiled, the loops it writes a row's outputs with, and the pointers it reads shards by.

One pass that writes every output of a row while the row is in cache is what brings the
loader to memcpy speed; each separate numpy pass reads or writes the whole batch again.

A kernel is compiled on first use and cached on disk (numba's cache: ``NUMBA_CACHE_DIR``,
else the package's ``__pycache__``, else the user's cache directory); where none of those
is writable (a read-only install, no home) it is compiled in memory, once per process.
"""

from __future__ import annotations

import functools
import glob
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["DOCUMENTS", "LABELS", "OFFSETS", "POSITIONS", "TOKENS", "cache_bytes"]

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


@functools.cache
def cache_bytes() -> int:
    """The size of this machine's largest CPU cache in bytes (Linux's sysfs), 32 MiB where
    it does not say."""
    sizes = []
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            with open(path) as f:
                text = f.read().strip().upper()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=32 << 20)


def _stream_typed(typingctx: Any, arr: Any, index: Any, value: Any) -> Any:  # pragma: no cover
    """``arr[index] = value`` as a non-temporal store: written to memory without reading the
    line into the cache first (a normal store reads it: twice the memory traffic for a
    batch too big to stay in the cache, and it evicts what the cache held)."""
    sig = types.void(arr, index, value)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        at = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        value = context.cast(builder, args[2], signature.args[2], aryty.dtype)
        store = builder.store(value, at)
        one = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        store.set_metadata("nontemporal", one)
        return context.get_dummy_value()

    return sig, codegen


_stream: Any = intrinsic(_stream_typed)


def _fence_typed(typingctx: Any) -> Any:  # pragma: no cover - compiled
    """A memory fence: the non-temporal stores before it are visible to every thread after
    it (they are not ordered with other stores otherwise)."""
    sig = types.void()

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return sig, codegen


_fence: Any = intrinsic(_fence_typed)


def _prefetch_typed(typingctx: Any, address: Any) -> Any:  # pragma: no cover - compiled
    """A hint to fetch the cache line at ``address`` (an address numpy gave) for reading:
    a gather of pieces from shuffled places asks for the next ones while it copies this
    one, instead of waiting on each piece's first cache line in turn."""
    sig = types.void(address)

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        # a read (0), kept in every cache level (3), of data (1)
        builder.call(fn, [builder.inttoptr(args[0], i8p), i32(0), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


_prefetch: Any = intrinsic(_prefetch_typed)


def _widen_py(src: np.ndarray, dst: np.ndarray, stream: bool) -> None:
    """``dst[:] = src``, any integer types (a loop the compiler vectorises); ``stream``:
    with stores that bypass the cache (``_stream``)."""
    if stream:
        for k in range(len(dst)):
            _stream(dst, k, src[k])
    else:
        for k in range(len(dst)):
            dst[k] = src[k]


def _ramp_py(dst: np.ndarray, first: int, stream: bool) -> None:
    """``dst[:] = first, first + 1, ...`` (indices from 0 within the slice, so vectorised)."""
    if stream:
        for k in range(len(dst)):
            _stream(dst, k, first + k)
    else:
        for k in range(len(dst)):
            dst[k] = first + k


def _const_py(dst: np.ndarray, value: int, stream: bool) -> None:
    """``dst[:] = value`` (a loop: numba compiles a broadcast slice assignment slowly)."""
    if stream:
        for k in range(len(dst)):
            _stream(dst, k, value)
    else:
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
