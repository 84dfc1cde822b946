"""Memory that goes back to the system as soon as it is dropped.

A long series' arrays are hundreds of MB, read in one step and reduced in the next. What
``free`` gives back is the allocator's call: glibc keeps freed blocks below its (moving)
threshold in its heaps, and each thread that scanned dumps has heaps of its own, so the
process's size would hold the arrays of both steps at once. Arrays made here are mapped
pages of their own, unmapped when the last view of them goes; :func:`give_back` asks glibc
to return what its heaps hold free.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import os
from collections.abc import Callable
from typing import Any

import numpy as np

HUGE = 4 << 20  # bytes from which an array is worth huge pages


def returnable(shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A new array of zeros whose pages go back to the system when its last view is dropped.
    """
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if size == 0:
        return np.zeros(shape, dtype=dtype)
    # Anonymous pages start as zeros and are unmapped when the mmap object is collected,
    # which happens when no array made from it is left. Private: mmap's default is shared
    # memory, which takes no huge pages.
    pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if size >= HUGE and hasattr(mmap, "MADV_HUGEPAGE"):
        # Where the kernel leaves huge pages to those who ask: a fault per 2 MB rather than
        # per 4 KB (numpy asks the same for its own big arrays).
        pages.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(pages, dtype=dtype).reshape(shape)


def give_back() -> None:
    """Return the free memory of glibc's heaps (all threads') to the system; nothing
    where the C library is not glibc."""
    trim = _trim()
    if trim is not None:
        trim(0)


@functools.cache
def _trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, when this process runs on glibc's malloc."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        # With another malloc preloaded this is still glibc's, trimming heaps that hold
        # little: harmless.
        fn = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, ValueError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    result: Callable[[int], int] = fn
    return result
