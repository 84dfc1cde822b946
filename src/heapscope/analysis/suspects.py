"""Leak suspects from one dump taken at exit: every site still holding memory, ranked.

A site is the first frame after allocator pruning (function, file, line, module). Everything
live at exit is a candidate; allocations made by language runtimes while they start up
(libstdc++'s emergency exception pool, stdio buffers, thread-local storage, code run by the
dynamic loader) are marked ``expected`` rather than ``leak``. Values must be unsampled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from heapscope.model import INUSE_OBJECTS, INUSE_SPACE, Location, Profile, Sample

LEAK = "leak"
EXPECTED = "expected"

_LOADER = re.compile(r"^ld(?:-linux[\w.-]*|64)?\.so(?:\.\d+)*$")
_RUNTIME_FUNCTIONS = frozenset(
    """
    _IO_file_doallocate _IO_doallocbuf __libc_setlocale setlocale _nl_find_locale
    _nl_load_locale_from_archive _dl_allocate_tls _dl_allocate_tls_init allocate_dtv
    __new_exitfn __cxa_thread_atexit_impl __libc_dlopen_mode _dl_open dlopen
    """.split()
)


@dataclass(frozen=True)
class Suspect:
    """One allocation site with live memory, in the shape of report.json."""

    pid: int | None
    function: str
    file: str
    line: int
    module: str
    stack: tuple[str, ...]  # "function file:line", leaf first, inlined frames included
    bytes: float
    objects: float
    verdict: str

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form (report.json ``suspects`` entries)."""
        return {"pid": self.pid, "function": self.function, "file": self.file,
                "line": self.line, "module": self.module, "stack": list(self.stack),
                "bytes": self.bytes, "objects": self.objects, "verdict": self.verdict}


def frame_text(loc: Location) -> list[str]:
    """How a location is written in a suspect's stack: one string per (inlined) frame."""
    if not loc.frames:
        return [loc.fallback_name]
    out = []
    for f in loc.frames:
        where = f" {f.file}:{f.line}" if f.file else ""
        out.append(f"{f.function}{where}")
    return out


def is_expected(profile: Profile, sample: Sample) -> bool:
    """True when the allocation comes from a runtime's start-up, not the program's logic."""
    for a in sample.stack:
        loc = profile.location(a)
        if _LOADER.match(loc.module):
            return True
        if any(f.function in _RUNTIME_FUNCTIONS for f in loc.frames):
            return True
    return False


def _site(loc: Location) -> tuple[str, str, int, str]:
    if loc.frames:
        f = loc.frames[0]
        return f.function, f.file, f.line, loc.module
    return loc.fallback_name, "", 0, loc.module


def suspects(profile: Profile, max_stack: int = 24) -> list[Suspect]:
    """Live allocation sites of one unsampled, pruned profile, largest first."""
    bytes_by: dict[tuple[str, str, int, str, bool], float] = {}
    objs_by: dict[tuple[str, str, int, str, bool], float] = {}
    biggest: dict[tuple[str, str, int, str, bool], tuple[float, Sample]] = {}
    for s in profile.samples:
        b = s.values[INUSE_SPACE]
        if b <= 0 or not s.stack:
            continue
        key = (*_site(profile.location(s.stack[0])), is_expected(profile, s))
        bytes_by[key] = bytes_by.get(key, 0.0) + b
        objs_by[key] = objs_by.get(key, 0.0) + s.values[INUSE_OBJECTS]
        if key not in biggest or b > biggest[key][0]:
            biggest[key] = (b, s)
    out = []
    for key, total in bytes_by.items():
        function, file, line, module, expected = key
        sample = biggest[key][1]
        stack: list[str] = []
        for a in sample.stack:
            stack.extend(frame_text(profile.location(a)))
        out.append(Suspect(profile.pid, function, file, line, module,
                           tuple(stack[:max_stack]), total, objs_by[key],
                           EXPECTED if expected else LEAK))
    out.sort(key=rank)
    return out


def rank(s: Suspect) -> tuple[int, float, str]:
    """Order: leaks before expected allocations, then by bytes, then by name."""
    return (0 if s.verdict == LEAK else 1, -s.bytes, s.function)
