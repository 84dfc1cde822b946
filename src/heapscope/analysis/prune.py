"""Remove allocator frames so that a stack's first frame is the code that asked for memory.

Stacks recorded by jemalloc start inside jemalloc itself (``prof_backtrace_impl``,
``imalloc_body``, ``malloc_default``, …), then the public entry point (``malloc``, ``operator
new``, a Rust shim, a thin libc wrapper such as ``strdup``). jeprof drops only exact names and
so leaves jemalloc 5.3's internal frames, prefixed ``_rjem_`` builds and unsymbolized frames on
top. We drop the leading run of frames that are inside the jemalloc image (by module, for
shared builds) or whose function is an allocator (by name, which also covers jemalloc linked
statically), and stop at the first frame that is neither. An unnamed frame (a static function
of a stripped binary) in that leading run is dropped only when a named allocator frame follows
it: it is then inside the allocator (PostgreSQL's AllocSetAlloc under palloc, say), and a
named frame of the program is never skipped. In Rust the whole ``alloc`` crate
(``Box``, ``Vec``, ``RawVec``, ``String`` internals) and rustc's ``__rustc::__rust_alloc``
shims are allocation machinery, so their frames are skipped too; C++ containers stay visible
and only the allocator shims go.
"""

from __future__ import annotations

import re
from types import MappingProxyType

from heapscope.model import Frame, Location, Profile, Sample
from heapscope.native import core

_EXACT = frozenset(
    """
    malloc calloc realloc free cfree memalign posix_memalign aligned_alloc valloc pvalloc
    reallocarray malloc_usable_size mallocx rallocx xallocx sdallocx dallocx nallocx
    __libc_malloc __libc_calloc __libc_realloc __libc_memalign __libc_valloc __libc_pvalloc
    __posix_memalign __malloc __calloc __realloc
    strdup strndup __strdup __strndup __GI___strdup __GI___strndup wcsdup __wcsdup
    asprintf vasprintf __asprintf __vasprintf __vasprintf_internal __asprintf_chk __vasprintf_chk
    newImpl fallbackNewImpl fallback_impl tc_malloc tc_calloc tc_realloc tc_new tc_newarray
    tc_new_nothrow tc_newarray_nothrow tc_memalign tc_posix_memalign tc_valloc tc_pvalloc
    __rust_alloc __rust_alloc_zeroed __rust_realloc __rdl_alloc __rdl_alloc_zeroed __rdl_realloc
    __rg_alloc __rg_alloc_zeroed __rg_realloc
    """.split()
) | {"operator new", "operator new[]"}

_PATTERNS = re.compile(
    r"""^(?:
        _?je_.* | _rjem_.* | prof_backtrace.* | prof_alloc_prep | prof_tctx_create
      | prof_malloc.* | prof_realloc | imalloc.* | ialloc.* | iralloc.* | irallocx.* | ixalloc.*
      | .*malloc_default | do_rallocx | do_xallocx | fallback.*NewImpl.*
      | operator\ new.* | tcmalloc::.* | TCMalloc.*
      | <?alloc::.* | __rustc::.*
      | <.*\ as\ core::alloc::global::GlobalAlloc>::.* | tikv_jemallocator::.*
      | __gnu_cxx::new_allocator<.*>::allocate | std::__new_allocator<.*>::allocate
      | std::allocator<.*>::allocate | std::allocator_traits<.*>::allocate
    )$""",
    re.VERBOSE,
)

# Thin malloc wrappers inside particular runtimes, pruned only in that module: HotSpot's
# NMT entry points would otherwise be the leaf of every JVM-native stack.
_POSTGRES = frozenset(
    "palloc palloc0 palloc_extended palloc_aligned repalloc repalloc0 repalloc_extended"
    " repalloc_huge MemoryContextAlloc MemoryContextAllocZero MemoryContextAllocZeroAligned"
    " MemoryContextAllocExtended MemoryContextAllocHuge MemoryContextAllocAligned"
    " MemoryContextStrdup pstrdup pnstrdup AllocSetAlloc AllocSetAllocLarge"
    " AllocSetAllocFromNewBlock AllocSetAllocChunkFromBlock AllocSetRealloc GenerationAlloc"
    " GenerationRealloc SlabAlloc BumpAlloc".split()
)
_MODULE_WRAPPERS: dict[str, frozenset[str]] = {
    "libjvm.so": frozenset(
        "os::malloc os::realloc os::strdup os::strdup_check_oom AllocateHeap ReallocateHeap"
        " AllocateHeap_or_null".split()
    ),
    # PostgreSQL's memory contexts are its allocator: palloc() is its malloc().
    "postgres": _POSTGRES,
    "postmaster": _POSTGRES,
}

_JEMALLOC_MODULE = re.compile(r"^lib(?:jemalloc|tcmalloc)[\w.-]*\.so(?:\.\d+)*$")


def is_allocator_name(name: str) -> bool:
    """True when ``name`` is an allocation entry point, shim or jemalloc internal."""
    return name in _EXACT or _PATTERNS.match(name) is not None


def is_allocator_module(module: str) -> bool:
    """True when ``module`` is a shared jemalloc (or tcmalloc) image."""
    return _JEMALLOC_MODULE.match(module) is not None


def is_allocator_location(loc: Location) -> bool:
    """True when the whole location is allocator code (by module, else by its real function)."""
    if loc.module and is_allocator_module(loc.module):
        return True
    if not loc.frames:
        return False
    name = loc.frames[-1].function
    wrappers = _MODULE_WRAPPERS.get(loc.module)
    if wrappers is not None and name in wrappers:
        return True
    return is_allocator_name(name)


def _trim_frames(loc: Location) -> Location:
    """Drop inlined allocator shims at the inner end of the new leaf location."""
    frames: tuple[Frame, ...] = loc.frames
    k = 0
    while k < len(frames) - 1 and is_allocator_name(frames[k].function):
        k += 1
    if k == 0:
        return loc
    trimmed = frames[k:]
    first = trimmed[0]
    if len(trimmed) == 1 and first.inlined:
        trimmed = (Frame(first.function, first.file, first.line, False, first.full_name,
                         first.system_name),)
    return Location(loc.address, loc.mapping, loc.module, loc.offset, trimmed)


# What prune's loop does at an address of a stack's leaf end: cut it, look further, stop.
ALLOCATOR, UNNAMED, OTHER = 1, 2, 0


def _cut(profile: Profile, memo: dict[tuple[int, ...], tuple[int, ...]]
         ) -> tuple[list[Sample], set[int]]:
    """Every stack without its leading allocator frames, and the new leaf addresses (the
    reference for the compiled loop ``cut_leading``)."""
    verdict: dict[int, bool] = {}
    unnamed: dict[int, bool] = {}
    location = profile.location
    leaves: set[int] = set()
    samples: list[Sample] = []
    append = samples.append
    for s in profile.samples:
        stack = s.stack
        pruned = memo.get(stack)
        if pruned is None:
            cut = 0
            for i in range(len(stack) - 1):  # the outermost frame is always kept
                a = stack[i]
                v = verdict.get(a)
                if v is None:
                    loc = location(a)
                    v = verdict[a] = is_allocator_location(loc)
                    unnamed[a] = not v and not loc.frames
                if v:
                    cut = i + 1
                elif not unnamed[a]:
                    break
            pruned = memo[stack] = stack[cut:] if cut else stack
        if pruned is not stack:
            s = Sample(pruned, s.values, s.threads, s.via)
        if pruned:
            leaves.add(pruned[0])
        append(s)
    return samples, leaves


def prune(profile: Profile,
          memo: dict[tuple[int, ...], tuple[int, ...]] | None = None) -> Profile:
    """Return a profile whose stacks start at the first non-allocator frame.

    ``memo`` maps raw stacks to pruned ones and may be shared by profiles that have the same
    locations (the dumps of one process), so that each stack is pruned once.
    """
    if core is not None:
        # The compiled loop cuts every stack, asking what an address is (once) when it
        # reaches it.
        def code(a: int) -> int:
            loc = profile.location(a)
            return ALLOCATOR if is_allocator_location(loc) else \
                UNNAMED if not loc.frames else OTHER

        cut_samples, leaves = core.cut_leading(profile.samples, {}, code, memo, Sample)
        samples = cut_samples
    else:
        samples, leaves = _cut(profile, {} if memo is None else memo)
    locations = dict(profile.locations)
    for a in leaves:
        known = locations.get(a)
        if known is not None and len(known.frames) > 1:
            locations[a] = _trim_frames(known)
    return profile.with_(samples=tuple(samples), locations=MappingProxyType(locations))
