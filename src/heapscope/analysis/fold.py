"""Fold library, dependency and wrapper frames into the code that called them: the site.

After :mod:`heapscope.analysis.prune` a stack starts at the first frame outside the
allocator, which in C++ and Rust is nearly always a container (``std::vector``, ``Vec``), in
C often a program's own allocation wrapper (``xmalloc``, ``zmalloc``) or a third-party
library. The *site* of an allocation is the first frame of the program's own code
(:mod:`heapscope.analysis.classify`), skipping allocation wrappers; where a stack has none,
the first JNI entry point (the Java method that called native code), then the first
dependency frame, then the first frame that is not a wrapper, then the leaf. The stack is cut
at the site; the frames before it are kept on the sample as its ``via`` chain, so reports can
say ``Registry::insert cpp_templates.cpp:41 via std::vector<char>``.

Allocation wrappers are named (:func:`heapscope.analysis.classify.is_wrapper_name`, the
user's ``--alloc-fn``) or recognised from the profile. A stack's *head* is its first frame
that is not a wrapper; a function F is a wrapper (a thin helper: ``mem_alloc``, or a
constructor such as ``sdsnewlen`` or ``createObject``) when

- F is never anything but a head: every frame of F in every stack sits directly above the
  allocator or above wrappers (F does not call other allocating code, nor inline it);
- F makes its allocating calls from one call site (one source line; one address without
  lines): a function that allocates in several places does more than wrap;
- F is called from at least ``WRAPPER_CALLERS`` functions; for the program's own code, from
  ``CONSTRUCTOR_CALLERS``, or from one when its name says it makes something new
  (:func:`heapscope.analysis.classify.is_constructor_name`: ``node_new``, ``createObject``)
  and it allocates through a wrapper, not the allocator itself (``createObject`` over
  ``zmalloc``: a layer of the program's allocation API; a ``worker_alloc`` that calls
  calloc in a loop to fill a table is a leak's own line), unless its callers, past any
  other constructors, are ``main`` (the site would say nothing).

Found wrappers are skipped when the heads are looked for again, so a helper over a wrapper
(``sdsnewlen`` over ``zmalloc``) is found at the next level, for ``LEVELS`` levels.
``--not-alloc-fn`` overrides all of this, and ``main`` is never a wrapper.

What a dump cannot tell: whether F returns the memory it allocated (a function that
allocates and keeps the memory, say in a global table, looks the same as a constructor),
and whether one caller's memory grows while another's is freed. Each profile is folded
alone: in a dump where only one of a helper's callers has memory left, the helper calling
the allocator itself stays the site (the series of a run or ``leaks``, folded as one, sees
every caller). A single-caller function is left as the site when uncertain: its caller is
still the next frame of its stack. A folded function is never hidden: it stays in the site's
``via`` chain, and ``-v`` lists what was folded and why.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Iterable
from types import MappingProxyType
from typing import NamedTuple

from heapscope.analysis.classify import (
    DEPENDENCY,
    LIBRARY,
    OWN,
    Classifier,
    is_constructor_name,
    is_jni_entry,
    is_wrapper_name,
)
from heapscope.analysis.ownership import PROCESS_MODULE, main_image
from heapscope.errors import UsageError
from heapscope.model import Frame, Location, Profile, Sample, ViaFrame
from heapscope.native import core
from heapscope.symbols.elf import search_path

SITE = "site"
RAW = "raw"
WRAPPER = "wrapper"
WRAPPER_CALLERS = 3  # distinct calling functions that make a thin allocating leaf a wrapper
CONSTRUCTOR_CALLERS = 2  # ... when it is the program's own code
LEVELS = 4  # helpers over wrappers found from the profile, found one level at a time
DEPTH = 8  # addresses searched for a stack's first frame that is not a wrapper

# Per location, innermost first: (function name, class, named wrapper) of each frame.
_Info = tuple[tuple[str, str, bool], ...]
# What one stack says of its head (see _Folder._head).
_Head = tuple[tuple[int, int], str, str | None, object, str, bool]


# FramePolicy is a NamedTuple, Wrappers and Folded plain classes, not dataclasses:
# `heapscope top` must not import dataclasses (start-up time).
class FramePolicy(NamedTuple):
    """How stacks are shown: folded to their site (default) or raw, and the user's say on
    what is their own code and which functions are allocation wrappers (regexes)."""

    mode: str = SITE
    own: tuple[str, ...] = ()
    alloc_fn: tuple[str, ...] = ()
    not_alloc_fn: tuple[str, ...] = ()
    # Functions a whole series showed to be wrappers (a session's report): one dump alone
    # may not show it (at exit only one of a helper's two callers may still hold memory).
    known: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, mode: str = SITE, own: Iterable[str] = (), alloc_fn: Iterable[str] = (),
                 not_alloc_fn: Iterable[str] = ()) -> FramePolicy:
        """A policy from options plus ``$HEAPSCOPE_OWN`` and ``$HEAPSCOPE_ALLOC_FN`` (each
        one regular expression; the options add to them)."""
        env_own = os.environ.get("HEAPSCOPE_OWN", "")
        env_alloc = os.environ.get("HEAPSCOPE_ALLOC_FN", "")
        policy = cls(mode, (*([env_own] if env_own else []), *own),
                     (*([env_alloc] if env_alloc else []), *alloc_fn), tuple(not_alloc_fn))
        policy.compiled()  # fail early, naming the option
        return policy

    def compiled(self) -> tuple[tuple[re.Pattern[str], ...], ...]:
        """The three lists of expressions, compiled (a bad one is a usage error)."""
        out = []
        for option, texts in (("--own", self.own), ("--alloc-fn", self.alloc_fn),
                              ("--not-alloc-fn", self.not_alloc_fn)):
            got = []
            for t in texts:
                try:
                    got.append(re.compile(t))
                except re.error as e:
                    raise UsageError(f"{option} {t!r}: invalid regular expression: {e}") \
                        from None
            out.append(tuple(got))
        return tuple(out)


class Wrappers:
    """The functions a fold treated as allocation wrappers, and why."""

    __slots__ = ("found", "named", "series", "user")

    def __init__(self) -> None:
        self.named: set[str] = set()  # a well-known wrapper's name
        self.user: set[str] = set()  # matched --alloc-fn
        self.series: set[str] = set()  # found over the whole series (FramePolicy.known)
        self.found: dict[str, int] = {}  # from the profile: -> callers

    def as_list(self) -> list[dict[str, object]]:
        """JSON-ready: one entry per wrapper folded, with the reason."""
        out: list[dict[str, object]] = [
            {"function": f, "why": "name"} for f in sorted(self.named)]
        out += [{"function": f, "why": "--alloc-fn"} for f in sorted(self.user)]
        out += [{"function": f, "why": "series"} for f in sorted(self.series - self.found.keys())]
        for f, n in sorted(self.found.items()):
            entry: dict[str, object] = {"function": f, "why": "profile", "callers": n}
            if _by_name(f, n):
                entry["constructor"] = True
            out.append(entry)
        return out

    def describe(self) -> str:
        """One line for ``-v``."""
        parts = sorted(self.named | self.user)
        parts += [f"{f} (over the series)" for f in sorted(self.series - self.found.keys())]
        for f, n in sorted(self.found.items()):
            why = f"{n} caller{'s' if n != 1 else ''}"
            parts.append(f"{f} ({why}, constructor name)" if _by_name(f, n) else f"{f} ({why})")
        return "folded as allocation wrappers: " + ", ".join(parts) if parts else ""

    def update(self, other: Wrappers) -> None:
        """Add what another fold found."""
        self.named |= other.named
        self.user |= other.user
        self.series |= other.series
        for f, n in other.found.items():
            self.found[f] = max(n, self.found.get(f, 0))


def _by_name(function: str, callers: int) -> bool:
    """Whether a wrapper found from the profile needed its constructor name (too few callers
    to be one without it)."""
    return callers < CONSTRUCTOR_CALLERS and is_constructor_name(function)


class Folded:
    """A folded profile and the wrappers the fold used."""

    __slots__ = ("profile", "wrappers")

    def __init__(self, profile: Profile, wrappers: Wrappers) -> None:
        self.profile = profile
        self.wrappers = wrappers


class _Folder:
    """One profile's fold: classifies each location once, then cuts each stack once."""

    def __init__(self, profile: Profile, policy: FramePolicy) -> None:
        own, alloc_fn, not_alloc_fn = policy.compiled()
        self.profile = profile
        main = main_image(profile)
        private = search_path(main) if main else ()
        self.classifier = Classifier(main, own, private)
        # Code that is own only by --own is a library the user reads as its author: only
        # the strict rule folds its helpers.
        self.by_default = Classifier(main, (), private) if own else self.classifier
        self.alloc_fn = alloc_fn
        self.not_alloc_fn = not_alloc_fn
        self.known = frozenset(policy.known)
        self.info: dict[int, _Info] = {}
        self.wrappers = Wrappers()
        self.wrapper_names: set[str] = set()
        self.not_wrapper: dict[str, bool] = {}
        self.frames_at: dict[str, list[tuple[int, int]]] | None = None
        self.candidates: dict[int, tuple[int, int, int, int]] = {}
        self.via_of: dict[int, tuple[ViaFrame, ...]] = {}
        # Equal chains share one tuple, so reports can count them by identity.
        self.vias: dict[tuple[tuple[int, ...], int, int], tuple[ViaFrame, ...]] = {}

    def _vetoed(self, name: str) -> bool:
        got = self.not_wrapper.get(name)
        if got is None:
            got = self.not_wrapper[name] = any(rx.search(name) for rx in self.not_alloc_fn)
        return got

    def _info(self, a: int) -> _Info:
        got = self.info.get(a)
        if got is not None:
            return got
        loc = self.profile.location(a)
        cls = self.classifier
        out = []
        if not loc.frames:
            out.append((loc.fallback_name, cls.frame_class(loc, None), False))
        for f in loc.frames:
            name = f.function
            wrapper = False
            if name and not self._vetoed(name):
                if any(rx.search(name) for rx in self.alloc_fn):
                    wrapper = True
                    self.wrappers.user.add(name)
                elif is_wrapper_name(name):
                    wrapper = True
                    self.wrappers.named.add(name)
                elif name in self.known:
                    wrapper = True
                    self.wrappers.series.add(name)
            out.append((name or loc.fallback_name, cls.frame_class(loc, f), wrapper))
        got = self.info[a] = tuple(out)
        return got

    def find_wrappers(self) -> None:
        """Mark as wrappers the functions the profile shows to be thin allocating helpers,
        level by level: a helper over a wrapper found at one level (``sdsnewlen`` over
        ``zmalloc``) can be found at the next.

        Each level looks again only at what the last one changed: the stacks whose head
        (first frame that is not a wrapper) it found to be a wrapper, and the leaves that
        may now be wrappers through and through."""
        samples = self.profile.samples
        # Each distinct (leaf, caller) pair once: dumps repeat them across many stacks.
        pairs = core.leaf_pairs(samples) if core is not None else \
            list(dict.fromkeys(s.stack[:2] for s in samples if s.stack))
        starts: list[tuple[tuple[int, ...], int]] = [(p, 1) for p in pairs]
        heads: list[_Head | None] = []
        by_head: dict[str, list[int]] = {}  # head function -> the starts it heads
        leaves = list(dict.fromkeys(p[0] for p in pairs))
        leaves_of: dict[str, list[int]] = {}  # function -> leaf addresses showing it
        for a in leaves:
            for name, _, _ in self._info(a):
                leaves_of.setdefault(name, []).append(a)
        deep: set[int] = set()
        fresh: set[str] | None = None  # what the last level found (None before the first)
        todo: list[int] = []
        for _ in range(LEVELS):
            # Stacks whose leaf is all wrappers have their first other frame further up:
            # look at their first DEPTH addresses (and one more, for that frame's caller).
            maybe = leaves if fresh is None else \
                list(dict.fromkeys(a for n in fresh for a in leaves_of.get(n, ())))
            wrapped = {a for a in maybe if a not in deep and self._all_wrappers(a)}
            if fresh is not None:
                todo = [i for n in fresh for i in by_head.pop(n, ())]
            if wrapped:
                deep |= wrapped
                more = dict.fromkeys(s.stack[:DEPTH + 1] for s in samples
                                     if s.stack and s.stack[0] in wrapped)
                todo += range(len(starts), len(starts) + len(more))
                starts += [(st, min(len(st), DEPTH)) for st in more]
                heads += [None] * len(more)
            if fresh is None:
                todo = list(range(len(starts)))
                heads = [None] * len(starts)
            for i in todo:
                st, n = starts[i]
                if n == 1 and st[0] in deep:
                    # A leaf that is all wrappers heads nothing: the deeper start of the
                    # same stacks, added above, looks further up.
                    heads[i] = None
                    continue
                got = heads[i] = self._head(st, n)
                if got is not None:
                    by_head.setdefault(got[1], []).append(i)
            found = self._find_level(heads)
            if not found:
                return
            fresh = found

    def _head(self, st: tuple[int, ...], n: int) -> _Head | None:
        """What one stack says of its head, the first frame that is not a wrapper among its
        first ``n`` addresses: ((address, frame), function, its caller, its call site, its
        class, whether a name alone may not fold it); None without a head. The caller is
        None where the head says nothing of callers (library code, no symbol, no caller)."""
        found = self.wrapper_names
        head = None
        for i in range(n):
            for k, (name, _, wrapper) in enumerate(self._info(st[i])):
                if not (wrapper or name in found):
                    head = i, k
                    break
            if head is not None:
                break
        if head is None:
            return None
        i, k = head
        a = st[i]
        info = self._info(a)
        loc = self.profile.location(a)
        name, kind, _ = info[k]
        if kind == LIBRARY or not loc.frames or not loc.frames[k].function:
            return (a, k), name, None, None, kind, False
        if k + 1 < len(info):
            caller = info[k + 1][0]
        elif i + 1 < len(st):
            caller = self._info(st[i + 1])[0][0]
        else:
            return (a, k), name, None, None, kind, False
        f = loc.frames[k]
        # One call site is one line (inlining and code layout may copy a call to several
        # addresses), or one address when lines are unknown.
        site: object = (f.file, f.line) if f.line else (a, k)
        if kind == OWN and self.by_default is not self.classifier:
            kind = self.by_default.frame_class(loc, f)
        # Where a name alone cannot fold a function: when it calls the allocator itself (a
        # function that fills a table, named worker_alloc, looks the same from a dump), and
        # when the constructors' callers end in main, which as the site would say nothing.
        return (a, k), name, caller, site, kind, i == k == 0 or self._ends_in_main(st, i, k)

    def _all_wrappers(self, a: int) -> bool:
        return all(w or name in self.wrapper_names for name, _, w in self._info(a))

    def _ends_in_main(self, st: tuple[int, ...], i: int, k: int) -> bool:
        """Whether the first frame above frame ``k`` of ``st[i]`` that is not a constructor
        (:func:`is_constructor_name`) is main's (a chain of constructors called by main)."""
        for j in range(i, len(st)):
            for name, _, _ in self._info(st[j])[k + 1 if j == i else 0:]:
                if not is_constructor_name(name):
                    return name == "main"
        return False

    def _find_level(self, heads: list[_Head | None]) -> set[str]:
        """One level of :meth:`find_wrappers` over what each stack says of its head; the
        functions it found to be wrappers."""
        at: set[tuple[int, int]] = set()
        callers: dict[str, set[str]] = {}
        sites: dict[str, set[object]] = {}
        kinds: dict[str, str] = {}
        not_by_name: set[str] = set()
        for got in heads:
            if got is None:
                continue
            where, name, caller, site, kind, nbn = got
            at.add(where)
            if caller is None:
                continue
            callers.setdefault(name, set()).add(caller)
            sites.setdefault(name, set()).add(site)
            kinds.setdefault(name, kind)
            if nbn:
                not_by_name.add(name)
        # A wrapper calls the allocator (or a wrapper) from one place, for many callers;
        # the program's own code needs fewer callers, or none but its name.
        cands: dict[str, int] = {}
        for name, got_callers in callers.items():
            if len(sites[name]) != 1 or name == "main" or self._vetoed(name):
                continue
            n = len(got_callers)
            if n >= WRAPPER_CALLERS or (kinds[name] == OWN and (
                    n >= CONSTRUCTOR_CALLERS
                    or (is_constructor_name(name) and name not in not_by_name))):
                cands[name] = n
        if not cands:
            return set()
        # ... and is never anything but a head: not a caller of other allocating code, nor
        # a frame that inlined some.
        if self.frames_at is None:
            frames_at: dict[str, list[tuple[int, int]]] = {}
            for a in self.profile.addresses():
                for k, f in enumerate(self.profile.location(a).frames):
                    frames_at.setdefault(f.function, []).append((a, k))
            self.frames_at = frames_at
        new: set[str] = set()
        for name, n in cands.items():
            if all(x in at for x in self.frames_at.get(name, ())):
                self.wrapper_names.add(name)
                self.wrappers.found[name] = n
                new.add(name)
        return new

    def _candidates(self, a: int) -> tuple[int, int, int, int]:
        """Frame indexes in address ``a`` of its first own, JNI entry, dependency and any
        frame that is not a wrapper (-1: none)."""
        got = self.candidates.get(a)
        if got is not None:
            return got
        found = self.wrapper_names
        own = jni = dep = plain = -1
        for k, (name, kind, wrapper) in enumerate(self._info(a)):
            if wrapper or name in found:
                continue
            if kind == OWN:
                own = k
                break
            if jni < 0 and is_jni_entry(name):
                jni = k
            elif dep < 0 and kind == DEPENDENCY:
                dep = k
            if plain < 0:
                plain = k
        got = self.candidates[a] = (own, jni, dep, plain)
        return got

    def _site(self, stack: tuple[int, ...]) -> tuple[int, int]:
        """(address index, frame index) of the stack's site."""
        jni = dep = plain = None
        candidates = self._candidates
        for i, a in enumerate(stack):
            own, j, d, p = candidates(a)
            if own >= 0:
                return i, own
            if jni is None and j >= 0:
                jni = (i, j)
            if dep is None and d >= 0:
                dep = (i, d)
            if plain is None and p >= 0:
                plain = (i, p)
        return jni or dep or plain or (0, 0)

    def _frames_via(self, a: int) -> tuple[ViaFrame, ...]:
        """Every frame of address ``a`` as a via entry (built once per address)."""
        got = self.via_of.get(a)
        if got is not None:
            return got
        loc = self.profile.location(a)
        out = []
        for m, (name, kind, wrapper) in enumerate(self._info(a)):
            f = loc.frames[m] if loc.frames else None
            out.append(ViaFrame(name, f.file if f else "", f.line if f else 0, loc.module,
                                WRAPPER if wrapper or name in self.wrapper_names else kind))
        got = self.via_of[a] = tuple(out)
        return got

    def _via(self, stack: tuple[int, ...], i: int, k: int) -> tuple[ViaFrame, ...]:
        key = (stack[:i], stack[i], k)
        got = self.vias.get(key)
        if got is None:
            parts = [self._frames_via(a) for a in stack[:i]]
            parts.append(self._frames_via(stack[i])[:k])
            got = self.vias[key] = tuple(itertools.chain.from_iterable(parts))
        return got

    def fold(self, memo: dict[tuple[int, ...], tuple[tuple[int, ...], int, tuple[ViaFrame, ...]]]
             ) -> Profile:
        self.find_wrappers()
        trims: dict[int, int] = {}
        if core is not None:
            # The compiled loop picks each stack's site, asking for an address's candidates
            # (classified once) only when its search reaches it; only the stacks whose site
            # is not the leaf's innermost frame change.
            codes = core.sites(self.profile.samples, self.candidates, self._candidates)
            cut_at: Iterable[int] = [n for n, c in enumerate(codes) if c]
        else:
            codes = None
            cut_at = range(len(self.profile.samples))
        samples = list(self.profile.samples)
        for n in cut_at:
            s = self.profile.samples[n]
            st = s.stack
            got = memo.get(st)
            if got is None:
                if not st:
                    got = (st, 0, ())
                else:
                    i, k = divmod(codes[n], 1 << 16) if codes is not None else self._site(st)
                    got = (st[i:], k, self._via(st, i, k) if (i or k) else ())
                memo[st] = got
            cut, k, via = got
            if k:
                trims[cut[0]] = k
            if via or cut is not st:
                samples[n] = Sample(cut, s.values, s.threads, via)
        locations = dict(self.profile.locations)
        for a, k in trims.items():
            locations[a] = _trimmed(self.profile.location(a), k)
        return self.profile.with_(samples=tuple(samples),
                                  locations=MappingProxyType(locations))


def frame_kinds(profile: Profile, policy: FramePolicy | None = None
                ) -> Callable[[int], tuple[str, ...]]:
    """For the pictures: the kind of each frame of an address of ``profile``, innermost
    first: ``own``, ``library``, ``dependency`` or ``wrapper`` ('' for a process's root)."""
    folder = _Folder(profile, policy or FramePolicy())
    folder.find_wrappers()
    found = folder.wrapper_names
    memo: dict[int, tuple[str, ...]] = {}

    def kinds(a: int) -> tuple[str, ...]:
        got = memo.get(a)
        if got is None:
            if profile.location(a).module == PROCESS_MODULE:
                got = ("",)
            else:
                got = tuple(WRAPPER if wrapper or name in found else kind
                            for name, kind, wrapper in folder._info(a))
            memo[a] = got
        return got

    return kinds


def _trimmed(loc: Location, k: int) -> Location:
    """The location without its ``k`` innermost (inlined) frames."""
    frames: tuple[Frame, ...] = loc.frames[k:]
    if len(frames) == 1 and frames[0].inlined:
        f = frames[0]
        frames = (Frame(f.function, f.file, f.line, False, f.full_name, f.system_name),)
    return Location(loc.address, loc.mapping, loc.module, loc.offset, frames)


def fold(profile: Profile, policy: FramePolicy | None = None,
         memo: dict[tuple[int, ...], tuple[tuple[int, ...], int, tuple[ViaFrame, ...]]]
         | None = None) -> Folded:
    """The profile with each stack cut at its site (``policy.mode == "raw"``: unchanged).

    ``memo`` may be shared by profiles with the same locations and stacks (the dumps of one
    process), so each stack is folded once.
    """
    policy = policy or FramePolicy()
    if policy.mode == RAW:
        return Folded(profile, Wrappers())
    folder = _Folder(profile, policy)
    return Folded(folder.fold({} if memo is None else memo), folder.wrappers)
