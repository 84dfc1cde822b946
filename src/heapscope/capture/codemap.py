"""Where in a live process's code a thread must not be when it runs heapscope's calls, where
``mallctl`` is, and where the C library's signal-return trampoline is; read from the memory
map and the ELF files it maps, without stopping the process.

A thread may run the calls only when no code on its stack holds a lock the calls take: not
the allocator (a jemalloc library, or jemalloc's functions linked into a program), not the
dynamic loader or the unwinder (a sampled allocation inside the calls walks the stack, which
takes the loader's lock), not fork. ``ptracer`` looks for return addresses into these ranges
in the stopped thread's stack.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from typing import NamedTuple

from heapscope.capture.stub import load_bias
from heapscope.model import Mapping
from heapscope.symbols.elfread import PT_LOAD, ElfError, ElfHeaders
from heapscope.symbols.symtab import SymbolTable

# Functions of the allocator, by name (jemalloc's public and internal names, with the
# je_/_rjem_ prefixes, glibc's malloc, Rust's allocator shims).
ALLOC_NAME = re.compile(
    r"^(_rjem_)?(je_|malloc|free|cfree|calloc|realloc|reallocarray|mallocx|rallocx|xallocx|"
    r"sdallocx|dallocx|nallocx|posix_memalign|aligned_alloc|memalign|valloc|pvalloc|mallctl|"
    r"malloc_|__libc_malloc|__libc_free|__libc_calloc|__libc_realloc|__libc_memalign|_int_malloc|"
    r"_int_free|_int_realloc|tcache_|arena_|prof_|extent_|extents_|emap_|edata_|ecache_|pac_|pa_|"
    r"sec_|hpa_|hpdata_|large_|bin_|base_|ckh_|tsd_|ctl_|witness_|background_thread|"
    r"imalloc|ifree|isfree|iralloc|ialloc|idalloc|ipalloc|sz_|eset_|rtree_|psset_|"
    r"__rust_alloc|__rust_dealloc|__rust_realloc|__rdl_|__rg_)")
# The loader, the unwinder and fork, where they live in other objects (libc, a static program).
UNSAFE_NAME = re.compile(r"^(_dl_|__GI__dl_|dl_iterate_phdr|__dl_iterate_phdr|_Unwind_|"
                         r"__libc_fork|_Fork|fork|__run_fork_handlers|__libc_dlopen|dlopen|"
                         r"dlclose|dlmopen|__libc_dlclose)")
# Whole objects: (pattern on the file name, what a thread in it is doing).
WHOLE = ((re.compile(r"jemalloc"), "allocator"),
         (re.compile(r"^(ld-linux|ld64\.so|ld-musl|ld-2\.)"), "loader"),
         (re.compile(r"^(libgcc_s|libunwind)"), "unwinder"))
# mov $15, %rax; syscall: rt_sigreturn, the trampoline a signal handler returns through.
RESTORER = b"\x48\xc7\xc0\x0f\x00\x00\x00\x0f\x05"
MALLCTL = ("_rjem_mallctl", "mallctl")


class CodeMap(NamedTuple):
    """What ``ptracer`` needs to know of one process's code."""

    unsafe: list[tuple[int, int, str]]  # sorted (start, end, what) address ranges
    mallctl: int  # 0 when not found
    symbol: str
    restorers: list[int]  # rt_sigreturn trampolines


def _functions(path: str, allocator: bool
               ) -> tuple[tuple[tuple[int, int, str], ...], tuple[tuple[str, int], ...]]:
    """Unsafe function ranges and mallctl of one file; allocator names count only where
    ``allocator`` (a program with jemalloc linked in: the C library's own malloc is not the
    one in use, and holds none of jemalloc's locks)."""
    try:
        table = SymbolTable.read(path)
    except ElfError:
        return (), ()
    unsafe = []
    found = []
    for start, end, name in table.functions():
        if allocator and ALLOC_NAME.match(name):
            unsafe.append((start, end, "allocator"))
        elif UNSAFE_NAME.match(name):
            unsafe.append((start, end, "loader, unwinder or fork"))
        if name in MALLCTL:
            found.append((name, start))
    return tuple(unsafe), tuple(found)


_Found = tuple[tuple[tuple[int, int, str], ...], tuple[tuple[str, int], ...], tuple[int, ...]]
_objects: dict[tuple[int, int, int, str], _Found] = {}


def _read_object(path: str, key: tuple[int, int, int], kind: str) -> _Found:
    """Unsafe function ranges, mallctl (file addresses) and signal-return trampolines of one
    file, as its ``kind`` calls for: the program (allocator names count: a jemalloc linked
    in), the C library (the loader's, unwinder's and fork's names only: its own malloc is
    not the one in use), anything else (mallctl only). Remembered by ``key`` (device, inode,
    mtime): each file is read once however many processes map it, a rebuilt one again."""
    found = _objects.get((*key, kind))
    if found is not None:
        return found
    if kind in ("program", "libc"):
        functions, mallctl = _functions(path, allocator=kind == "program")
    else:
        functions, mallctl = (), _functions(path, allocator=False)[1]
    restorers: list[int] = []
    if kind in ("program", "libc"):
        try:
            with ElfHeaders.open(path) as elf:
                for seg in elf.segments:
                    if seg.p_type == PT_LOAD and seg.p_flags & 1:
                        data = elf.segment_data(seg)
                        at = data.find(RESTORER)
                        while at >= 0:
                            restorers.append(seg.p_vaddr + at)
                            at = data.find(RESTORER, at + 1)
        except ElfError:
            pass
    if len(_objects) > 64:
        _objects.clear()
    found = _objects[(*key, kind)] = (functions, mallctl, tuple(restorers))
    return found


def code_map(pid: int, maps: Sequence[Mapping]) -> CodeMap:
    """The unsafe ranges, mallctl and the trampolines of ``pid`` (maps: its memory map)."""
    page = os.sysconf("SC_PAGE_SIZE")
    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        exe = ""
    by_path: dict[str, list[Mapping]] = {}
    for m in maps:
        if not m.anonymous:
            by_path.setdefault(m.path, []).append(m)
    unsafe: list[tuple[int, int, str]] = []
    candidates: list[tuple[int, str, int]] = []  # (preference, symbol, address)
    restorers: list[int] = []
    for path, ms in by_path.items():
        if not any(m.executable for m in ms):
            continue
        base = os.path.basename(path)
        whole = next((what for pattern, what in WHOLE if pattern.search(base)), None)
        if whole is not None:
            unsafe.extend((m.start, m.limit, whole) for m in ms if m.executable)
        libc = base.startswith(("libc.so", "libc-", "libc.musl"))
        program = path == exe
        if not (whole == "allocator" or libc or program):
            continue  # the loader and unwinder are covered whole; others looked at below
        kind = "program" if program else ("libc" if libc else "other")
        got = _placed(pid, ms, page, kind)
        if got is None:
            continue
        bias, (functions, mallctl, rest) = got
        unsafe.extend((bias + lo, bias + hi, what) for lo, hi, what in functions)
        restorers.extend(bias + r for r in rest)
        rank = 0 if whole == "allocator" else (1 if program else 2)
        candidates.extend((rank * 2 + MALLCTL.index(name), name, bias + addr)
                          for name, addr in mallctl)
    if not candidates:
        candidates = _elsewhere(pid, by_path, page)
    candidates.sort()
    unsafe.sort()
    return CodeMap(unsafe, candidates[0][2] if candidates else 0,
                   candidates[0][1] if candidates else "", sorted(restorers))


def _elsewhere(pid: int, by_path: dict[str, list[Mapping]], page: int
               ) -> list[tuple[int, str, int]]:
    """mallctl in any other object (a jemalloc linked into some library)."""
    out: list[tuple[int, str, int]] = []
    for ms in by_path.values():
        got = _placed(pid, ms, page, "other") if any(m.executable for m in ms) else None
        if got is not None:
            bias, (_f, mallctl, _r) = got
            out.extend((MALLCTL.index(name), name, bias + addr) for name, addr in mallctl)
    return out


def _placed(pid: int, ms: Sequence[Mapping], page: int, kind: str
            ) -> tuple[int, _Found] | None:
    """(load bias, what ``_read_object`` finds) of the object mapped at ``ms``, read
    through map_files (the very file the process has mapped); None when unreadable."""
    source = f"/proc/{pid}/map_files/{ms[0].start:x}-{ms[0].limit:x}"
    try:
        st = os.stat(source)
        with ElfHeaders.open(source) as elf:
            bias = load_bias(elf, ms, page)
    except (OSError, ElfError):
        return None
    if bias is None:
        return None
    return bias, _read_object(source, (st.st_dev, st.st_ino, st.st_mtime_ns), kind)
