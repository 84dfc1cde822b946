"""Control jemalloc's heap profiler from inside a Python program, through its own mallctl.

For a Python service running under ``heapscope run`` (or ``LD_PRELOAD=libjemalloc.so.2`` with
``MALLOC_CONF=prof:true``)::

    import heapscope.jemalloc as je

    je.dump("/tmp/before.heap")          # a heap dump now
    with je.profiling():                 # sample only while the block runs
        handle_requests()
    je.dump("/tmp/after.heap")
    print(je.stats()["allocated"])

Every call raises :class:`JemallocError` (one clear line) when the process has no jemalloc,
or one built or started without profiling.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any, cast

from heapscope.capture.conf import lg2
from heapscope.errors import HeapscopeError

_STATS = ("allocated", "active", "metadata", "resident", "mapped", "retained")


class JemallocError(HeapscopeError):
    """jemalloc is missing from this process, or cannot do what was asked."""

    exit_code = 4


Mallctl = Callable[..., int]
if TYPE_CHECKING:
    CValue = ctypes._SimpleCData[Any]
else:  # ctypes' value types are generic only to the type checker
    CValue = ctypes._SimpleCData


@cache
def _mallctl() -> Mallctl:
    """This process's ``mallctl`` (or tikv-jemallocator's ``_rjem_mallctl``)."""
    process = ctypes.CDLL(None)
    for name in ("mallctl", "_rjem_mallctl"):
        try:
            fn = process[name]
        except AttributeError:
            continue
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                       ctypes.c_void_p, ctypes.c_size_t]
        return cast(Mallctl, fn)
    raise JemallocError(
        "no jemalloc in this process: start it under `heapscope run -- …`, or with "
        "LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF=prof:true")


def _call(name: str, old: CValue | None = None, new: CValue | None = None) -> int:
    size = ctypes.c_size_t(ctypes.sizeof(old)) if old is not None else None
    return int(_mallctl()(name.encode(),
                          ctypes.byref(old) if old is not None else None,
                          ctypes.byref(size) if size is not None else None,
                          ctypes.byref(new) if new is not None else None,
                          ctypes.sizeof(new) if new is not None else 0))


def _read(name: str, ctype: type[CValue]) -> object:
    value = ctype()
    rc = _call(name, old=value)
    if rc != 0:
        raise JemallocError(f"mallctl {name!r} failed: {os.strerror(rc)}")
    return value.value


def _require_profiling() -> None:
    _mallctl()  # no jemalloc at all says so, before anything else
    try:
        built = bool(_read("config.prof", ctypes.c_bool))
    except JemallocError:
        built = False
    if not built:
        raise JemallocError("this process's jemalloc was built without profiling "
                            "(config.prof is false); use Debian's libjemalloc2 or build with "
                            "--enable-prof")
    if not _read("opt.prof", ctypes.c_bool):
        raise JemallocError("this process was started without prof:true, and profiling "
                            "cannot be switched on later: restart it with "
                            "MALLOC_CONF=prof:true (or _RJEM_MALLOC_CONF for Rust builds)")


def version() -> str:
    """The jemalloc version string."""
    v = _read("version", ctypes.c_char_p)
    return v.decode() if isinstance(v, bytes) else ""


def enabled() -> bool:
    """True when the process runs with profiling (``opt.prof``)."""
    try:
        return bool(_read("opt.prof", ctypes.c_bool))
    except JemallocError:
        return False


def dump(path: str | None = None) -> str | None:
    """Write a heap dump to ``path`` (or jemalloc's automatic ``<prefix>.<pid>.<seq>.m<n>``)."""
    _require_profiling()
    name = ctypes.c_char_p(os.fsencode(path)) if path is not None else None
    rc = _call("prof.dump", new=name) if name is not None else _call("prof.dump")
    if rc != 0:
        where = path or "the automatic name (is prof_prefix empty?)"
        raise JemallocError(f"prof.dump to {where} failed: {os.strerror(rc)}")
    return path


def active(on: bool | None = None) -> bool:
    """Whether sampling is active; with ``on``, switch it and return the previous state."""
    _require_profiling()
    before = bool(_read("prof.active", ctypes.c_bool))
    if on is not None:
        rc = _call("prof.active", new=ctypes.c_bool(on))
        if rc == errno.ENOENT:
            raise JemallocError("prof.active cannot be set: profiling is off (start with "
                                "MALLOC_CONF=prof:true)")
        if rc != 0:
            raise JemallocError(f"setting prof.active failed: {os.strerror(rc)}")
    return before


def reset(sample: int | None = None) -> None:
    """Forget all samples (``prof.reset``); ``sample`` sets a new mean period in bytes."""
    _require_profiling()
    if sample is None:
        rc = _call("prof.reset")
    else:
        rc = _call("prof.reset", new=ctypes.c_size_t(lg2(max(1, int(sample)))))
    if rc != 0:
        raise JemallocError(f"prof.reset failed: {os.strerror(rc)}")


def sample_period() -> int:
    """The current mean sampling period in bytes (2**prof.lg_sample)."""
    lg = _read("prof.lg_sample", ctypes.c_size_t)
    return 1 << int(lg) if isinstance(lg, int) else 0


def stats() -> dict[str, int]:
    """Allocator totals in bytes: allocated, active, metadata, resident, mapped, retained."""
    _call("epoch", new=ctypes.c_uint64(1))  # refresh the cached statistics
    out = {}
    for name in _STATS:
        v = _read(f"stats.{name}", ctypes.c_size_t)
        out[name] = int(v) if isinstance(v, int) else 0
    return out


@contextmanager
def profiling(dump_to: str | None = None) -> Iterator[None]:
    """Sample allocations only inside the block; optionally dump when it ends."""
    before = active(True)
    try:
        yield
    finally:
        active(before)
        if dump_to is not None:
            dump(dump_to)
