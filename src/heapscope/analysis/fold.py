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
from operator import itemgetter
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
from heapscope.symbols.callsites import caller_counts
from heapscope.symbols.elf import ElfError, ElfInfo, search_path
from heapscope.symbols.rooted import resolve_in_root

# An address's site candidates (see _Folder._candidates) when it holds one frame.
_NONE, _OWN, _JNI, _DEPENDENCY, _PLAIN = (-1, -1, -1, -1), (0, -1, -1, -1), (-1, 0, -1, 0), \
    (-1, -1, 0, 0), (-1, -1, -1, 0)

SITE = "site"
RAW = "raw"
WRAPPER = "wrapper"
WRAPPER_CALLERS = 3  # distinct calling functions that make a thin allocating leaf a wrapper
CONSTRUCTOR_CALLERS = 2  # ... when it is the program's own code
CODE_CALLERS = 3  # ... or functions of the program's code calling it directly (callsites)
LEVELS = 4  # helpers over wrappers found from the profile, found one level at a time
DEPTH = 8  # addresses searched for a stack's first frame that is not a wrapper

# Per location, innermost first: (function name, class, named wrapper) of each frame.
_Info = tuple[tuple[str, str, bool], ...]
# What a head at frame k of an address says whatever its stack: (k, its function, whether it
# says anything of callers (not library code, a symbol with a function), its call site, its
# class, whether it is inlined into its caller (the next frame of the same address)).
_Facts = tuple[int, str, bool, object, str, bool]


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

    __slots__ = ("found", "in_code", "named", "series", "user")

    def __init__(self) -> None:
        self.named: set[str] = set()  # a well-known wrapper's name
        self.user: set[str] = set()  # matched --alloc-fn
        self.series: set[str] = set()  # found over the whole series (FramePolicy.known)
        self.found: dict[str, int] = {}  # from the profile: -> callers
        # ... of which those with too few callers in the profile: -> callers in the code
        self.in_code: dict[str, int] = {}

    def as_list(self) -> list[dict[str, object]]:
        """JSON-ready: one entry per wrapper folded, with the reason."""
        out: list[dict[str, object]] = [
            {"function": f, "why": "name"} for f in sorted(self.named)]
        out += [{"function": f, "why": "--alloc-fn"} for f in sorted(self.user)]
        out += [{"function": f, "why": "series"} for f in sorted(self.series - self.found.keys())]
        for f, n in sorted(self.found.items()):
            entry: dict[str, object] = {"function": f, "why": "profile", "callers": n}
            if f in self.in_code:
                entry["callers_in_code"] = self.in_code[f]
            elif _by_name(f, n):
                entry["constructor"] = True
            out.append(entry)
        return out

    def describe(self) -> str:
        """One line for ``-v``."""
        parts = sorted(self.named | self.user)
        parts += [f"{f} (over the series)" for f in sorted(self.series - self.found.keys())]
        for f, n in sorted(self.found.items()):
            why = f"{n} caller{'s' if n != 1 else ''}"
            if f in self.in_code:
                why += f" here, {self.in_code[f]} in the program's code"
            elif _by_name(f, n):
                why += ", constructor name"
            parts.append(f"{f} ({why})")
        return "folded as allocation wrappers: " + ", ".join(parts) if parts else ""

    def update(self, other: Wrappers) -> None:
        """Add what another fold found."""
        self.named |= other.named
        self.user |= other.user
        self.series |= other.series
        for f, n in other.found.items():
            self.found[f] = max(n, self.found.get(f, 0))
        for f, n in other.in_code.items():
            self.in_code[f] = max(n, self.in_code.get(f, 0))


def _module_file(path: str, build_id: str, pid: int | None) -> str:
    """The file of the module the dump maps from ``path``: inside the process's root while
    it runs (a container's file, not the host's of that name), else at ``path``, as the
    symbolizer takes it; with the dump's ``build_id`` when it recorded one. "" when there
    is none."""
    if pid is not None and os.path.isdir(f"/proc/{pid}/root"):
        inside = resolve_in_root(f"/proc/{pid}/root", path)
        tried = [inside] if inside is not None else []
    else:
        tried = [path]
    for cand in tried:
        if not build_id:
            if os.path.isfile(cand):
                return cand
            continue
        try:
            if ElfInfo.read(cand).build_id == build_id:
                return cand
        except ElfError:
            continue
    return ""


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


class _Leaves:
    """The leaves of a profile's stacks (see :meth:`_Folder.find_wrappers`): per leaf the
    callers its (leaf, caller) starts show (none for a stack of one address), and the
    indexes of its first start and of its first start with a caller: a head is counted by
    the index of the first start showing it (the order in which functions are judged)."""

    __slots__ = ("callers", "first", "first_call")

    def __init__(self, pairs: list[tuple[int, ...]]) -> None:
        self.callers: dict[int, list[int]] = {}
        get = self.callers.get
        for p in pairs:
            got = get(p[0])
            if got is None:
                self.callers[p[0]] = list(p[1:])
            else:
                got += p[1:]
        # Built from zip and dict alone (no loop of bytecode per start), last index first so
        # the first one stays.
        n = len(pairs)
        leaves = list(map(itemgetter(0), pairs))
        self.first = dict(zip(reversed(leaves), range(n - 1, -1, -1), strict=True))
        self.first_call = self.first if min(map(len, pairs), default=2) > 1 else \
            {p[0]: i for i, p in zip(range(n - 1, -1, -1), reversed(pairs), strict=True)
             if len(p) > 1}


class _Evidence:
    """What the heads counted so far say of each function (see :meth:`_Folder.find_wrappers`):
    the heads' places, and per function its callers, call sites, class (that of its first
    head counted, by the start's index), whether a name alone may not fold it, and which
    functions' evidence changed since they were last judged."""

    __slots__ = ("at", "callers", "changed", "kinds", "not_by_name", "sites")

    def __init__(self) -> None:
        self.at: set[tuple[int, int]] = set()  # (address, frame) of every head
        self.callers: dict[str, set[str]] = {}
        self.sites: dict[str, set[object]] = {}
        self.kinds: dict[str, tuple[int, str]] = {}  # -> (index of its first head, class)
        self.not_by_name: set[str] = set()
        self.changed: set[str] = set()

    def head(self, a: int, k: int, name: str) -> None:
        """A head at frame ``k`` of address ``a``, of function ``name``."""
        where = (a, k)
        if where not in self.at:
            self.at.add(where)
            self.changed.add(name)

    def add(self, n: int, name: str, callers: set[str], site: object, kind: str,
            not_by_name: bool) -> None:
        """What heads of ``name`` say of it, the first of them start ``n``."""
        got = self.callers.get(name)
        if got is None:
            self.callers[name] = callers
            self.sites[name] = {site}
            self.kinds[name] = (n, kind)
        else:
            got |= callers
            self.sites[name].add(site)
            if n < self.kinds[name][0]:
                self.kinds[name] = (n, kind)
        if not_by_name:
            self.not_by_name.add(name)
        self.changed.add(name)


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
        # A plain dict: looked up once or more per address, and the folded profile's own.
        self.locations: dict[int, Location] = dict(profile.locations)
        # Per one-frame address: its site candidates unless it is a wrapper (see _candidates).
        self.plain: dict[int, tuple[int, int, int, int]] = {}
        self.named: dict[str, bool] = {}  # see _named
        self.first_frame: dict[int, int] = {}  # see _first_frame
        self.facts: dict[int, _Facts] = {}  # see _facts, for the address's current head
        # Per address: whether its first frame that is not a constructor is main's (2),
        # another function's (1), or it has none (0).
        self.ends_in_main: dict[int, int] = {}
        self.headed: dict[str, list[int]] = {}  # function -> addresses it is the first of
        self.candidates: dict[int, tuple[int, int, int, int]] = {}
        self.via_of: dict[int, tuple[ViaFrame, ...]] = {}
        self.module_files: dict[str, str] = {}  # see _code_callers
        self.vias: dict[tuple[tuple[int, ...], int], tuple[ViaFrame, ...]] = {}  # see fold

    def _vetoed(self, name: str) -> bool:
        got = self.not_wrapper.get(name)
        if got is None:
            got = self.not_wrapper[name] = any(rx.search(name) for rx in self.not_alloc_fn)
        return got

    def _named(self, name: str) -> bool:
        """Whether the user (``--alloc-fn``), a well-known wrapper's name or the series
        makes function ``name`` a wrapper; the reason is recorded the first time."""
        got = self.named.get(name)
        if got is None:
            got = False
            if not (self.not_alloc_fn and self._vetoed(name)):
                if self.alloc_fn and any(rx.search(name) for rx in self.alloc_fn):
                    got = True
                    self.wrappers.user.add(name)
                elif is_wrapper_name(name):
                    got = True
                    self.wrappers.named.add(name)
                elif name in self.known:
                    got = True
                    self.wrappers.series.add(name)
            self.named[name] = got
        return got

    def _info(self, a: int) -> _Info:
        got = self.info.get(a)
        if got is not None:
            return got
        loc = self.locations.get(a)
        if loc is None:
            loc = Location(a)
        frame_class = self.classifier.frame_class
        frames = loc.frames
        if len(frames) > 1:
            got = tuple((f.function or loc.fallback_name, frame_class(loc, f),
                         bool(f.function) and self._named(f.function)) for f in frames)
            self.info[a] = got
            return got
        # One frame (or none): what a head there would say is known now (see _facts).
        f = frames[0] if frames else None
        name = f.function if f is not None else ""
        label = name or loc.fallback_name
        kind = frame_class(loc, f)
        # Most names are no wrapper's: a cheap look first (_named records why one is).
        wrapper = bool(name) and (bool(self.alloc_fn) or name in self.known
                                  or is_wrapper_name(name)) and self._named(name)
        got = self.info[a] = ((label, kind, wrapper),)
        self.plain[a] = _OWN if kind == OWN else _JNI if is_jni_entry(label) else \
            _DEPENDENCY if kind == DEPENDENCY else _PLAIN
        if f is None or kind == LIBRARY or not name:
            self.facts[a] = (0, label, False, None, kind, False)
        else:
            if kind == OWN and self.by_default is not self.classifier:
                kind = self.by_default.frame_class(loc, f)
            # One call site is one line (inlining and code layout may copy a call to several
            # addresses), or one address when lines are unknown.
            self.facts[a] = (0, label, True, (f.file, f.line) if f.line else (a, 0), kind, False)
        return got

    def find_wrappers(self) -> None:
        """Mark as wrappers the functions the profile shows to be thin allocating helpers,
        level by level: a helper over a wrapper found at one level (``sdsnewlen`` over
        ``zmalloc``) can be found at the next.

        A stack's head is in its leaf address unless that address is all wrappers, so the
        stacks are looked at as leaves: each leaf once, with the callers its stacks show,
        gathered once. A stack whose leaf is all wrappers has its head among its next
        ``DEPTH - 1`` addresses, which alone say what the head is: each distinct run of them
        is looked at once. What the heads say is kept per function across levels; each
        level looks again only at the leaves and runs whose head the last one found to be a
        wrapper, and judges only the functions whose evidence changed."""
        samples = self.profile.samples
        # Each distinct (leaf, caller) start once: dumps repeat them across many stacks.
        pairs = core.leaf_pairs(samples) if core is not None else \
            list(dict.fromkeys(s.stack[:2] for s in samples if s.stack))
        leaves = _Leaves(pairs)
        ev = _Evidence()
        leaves_of: dict[str, list[int]] = {}  # head function -> the leaves it heads
        runs_of: dict[str, list[tuple[int, tuple[int, ...]]]] = {}  # ... the runs it heads
        seen: set[tuple[int, ...]] = set()
        todo_leaves: list[int] = list(leaves.callers)
        todo_runs: list[tuple[int, tuple[int, ...]]] = []
        count = len(pairs)  # starts so far: runs are numbered after the pairs
        for _ in range(LEVELS):
            wrapped = self._count_leaves(todo_leaves, leaves, ev, leaves_of)
            if wrapped:
                # The runs above the leaves that are all wrappers, in the order of the
                # stacks; a run seen at an earlier level is counted already.
                runs = core.runs_above(samples, wrapped, DEPTH) if core is not None else \
                    list(dict.fromkeys(s.stack[1:DEPTH + 1] for s in samples
                                       if s.stack and s.stack[0] in wrapped))
                todo_runs += [(n, run) for n, run in enumerate(runs, count)
                              if run and run not in seen]
                seen.update(runs)
                count += len(runs)
            self._count_runs(todo_runs, ev, runs_of)
            found = self._find_level(ev)
            if not found:
                return
            # The stacks these headed have their head further up now.
            cached = self.first_frame
            for name in found:
                for a in self.headed.pop(name, ()):
                    del cached[a]
            todo_leaves = [a for name in found for a in leaves_of.pop(name, ())]
            todo_runs = [x for name in found for x in runs_of.pop(name, ())]

    def _count_leaves(self, todo: list[int], leaves: _Leaves, ev: _Evidence,
                      leaves_of: dict[str, list[int]]) -> set[int]:
        """Count what the stacks of the leaves ``todo`` say of their heads; the leaves that
        are all wrappers (their stacks' heads are further up)."""
        info, info_get = self._info, self.info.get
        at, changed = ev.at, ev.changed
        callers, sites, kinds, not_by_name = ev.callers, ev.sites, ev.kinds, ev.not_by_name
        head_fact = self._head_fact
        callers_of, first_call = leaves.callers, leaves.first_call
        wrapped = set()
        for a in todo:
            fact = head_fact(a)
            if fact is None:
                wrapped.add(a)
                continue
            k, name, says, site, kind, inlined = fact
            got = leaves_of.get(name)
            if got is None:
                leaves_of[name] = [a]
            else:
                got.append(a)
            where = (a, k)
            if where not in at:
                at.add(where)
                changed.add(name)
            if not says:
                continue
            if inlined or k:
                self._leaf_head(a, fact, leaves, ev)
                continue
            cs = callers_of[a]
            if not cs:
                continue
            # The head is the leaf's innermost frame: a name alone cannot fold a function
            # that calls the allocator itself (see _leaf_head). As ev.add:
            names = {(info_get(c) or info(c))[0][0] for c in cs}
            n = first_call[a]
            got_callers = callers.get(name)
            if got_callers is None:
                callers[name] = names
                sites[name] = {site}
                kinds[name] = (n, kind)
            else:
                got_callers |= names
                sites[name].add(site)
                if n < kinds[name][0]:
                    kinds[name] = (n, kind)
            not_by_name.add(name)
            changed.add(name)
        return wrapped

    def _count_runs(self, todo: list[tuple[int, tuple[int, ...]]], ev: _Evidence,
                    runs_of: dict[str, list[tuple[int, tuple[int, ...]]]]) -> None:
        """Count what the runs ``todo`` (numbered, see :meth:`find_wrappers`) say of their
        heads. A run's head is nearly always in its first address: looked at here; the
        others in :meth:`_run_head`."""
        info, info_get = self._info, self.info.get
        at, changed = ev.at, ev.changed
        callers, sites, kinds, not_by_name = ev.callers, ev.sites, ev.kinds, ev.not_by_name
        head_fact = self._head_fact
        ends_in_main = self.ends_in_main.get
        for n, run in todo:
            a = run[0]
            fact = head_fact(a)
            if fact is None:
                self._run_head(n, run, ev, runs_of)
                continue
            k, name, says, site, kind, inlined = fact
            got = runs_of.get(name)
            if got is None:
                runs_of[name] = [(n, run)]
            else:
                got.append((n, run))
            where = (a, k)
            if where not in at:
                at.add(where)
                changed.add(name)
            if not says:
                continue
            if inlined or len(run) == 1:
                self._run_head(n, run, ev, None)
                continue
            # As ev.add, for a head in the run's first address, not inlined: its caller is
            # the next address.
            caller = (info_get(run[1]) or info(run[1]))[0][0]
            by_main = ends_in_main(run[1])
            if not by_main:
                by_main = 2 if self._ends_in_main(run, 0, k) else 1
            got_callers = callers.get(name)
            if got_callers is None:
                callers[name] = {caller}
                sites[name] = {site}
                kinds[name] = (n, kind)
            else:
                got_callers.add(caller)
                sites[name].add(site)
                if n < kinds[name][0]:
                    kinds[name] = (n, kind)
            if by_main == 2:
                not_by_name.add(name)
            changed.add(name)

    def _head_fact(self, a: int) -> _Facts | None:
        """:meth:`_fact_of`, known at once for an address of one frame: its facts were
        found with the address, and it heads the stacks unless it is a wrapper."""
        got_info = self.info.get(a) or self._info(a)
        if len(got_info) == 1:
            name, _, wrapper = got_info[0]
            return None if wrapper or name in self.wrapper_names else self.facts[a]
        return self._fact_of(a)

    def _fact_of(self, a: int) -> _Facts | None:
        """What a head in address ``a`` says (see :data:`_Facts`), None when the address
        is all wrappers."""
        k = self.first_frame.get(a)
        if k is None:
            k = self._first_frame(a)
        if k < 0:
            return None
        got = self.facts.get(a)
        return got if got is not None and got[0] == k else self._facts(a, k)

    def _first_frame(self, a: int) -> int:
        """Index of the first frame of address ``a`` that is not a wrapper (-1: none)."""
        found = self.wrapper_names
        got = -1
        for k, (name, _, wrapper) in enumerate(self.info.get(a) or self._info(a)):
            if not (wrapper or name in found):
                got = k
                headed = self.headed.get(name)
                if headed is None:
                    self.headed[name] = [a]
                else:
                    headed.append(a)
                break
        self.first_frame[a] = got
        return got

    def _facts(self, a: int, k: int) -> _Facts:
        """What a head at frame ``k`` of address ``a`` says whatever its stack (see
        :data:`_Facts`)."""
        loc = self.locations.get(a)
        info = self._info(a)
        name, kind, _ = info[k]
        if kind == LIBRARY or loc is None or not loc.frames or not loc.frames[k].function:
            got: _Facts = (k, name, False, None, kind, False)
        else:
            f = loc.frames[k]
            # One call site is one line (inlining and code layout may copy a call to several
            # addresses), or one address when lines are unknown.
            site: object = (f.file, f.line) if f.line else (a, k)
            if kind == OWN and self.by_default is not self.classifier:
                kind = self.by_default.frame_class(loc, f)
            got = (k, name, True, site, kind, k + 1 < len(info))
        self.facts[a] = got
        return got

    def _leaf_head(self, a: int, fact: _Facts, leaves: _Leaves, ev: _Evidence) -> None:
        """Count what the starts of leaf ``a`` say of their head (``fact``) when it is not
        the address's innermost frame or is inlined into its caller."""
        k, name, _, site, kind, inlined = fact
        callers = leaves.callers[a]
        # Where a name alone cannot fold a function: when it calls the allocator itself (a
        # function that fills a table, named worker_alloc, looks the same from a dump), and
        # when the constructors' callers end in main, which as the site would say nothing.
        # Every start is looked at (each looks at its own caller's frames).
        if inlined:
            # The caller is the next frame of the same address.
            by_main = [True] if not k else \
                [self._ends_in_main((a, c), 0, k) for c in callers] \
                or [self._ends_in_main((a,), 0, k)]
            ev.add(leaves.first[a], name, {self._info(a)[k + 1][0]}, site, kind,
                   any(by_main))
        elif callers:
            names = {self._info(c)[0][0] for c in callers}
            by_main = [self._ends_in_main((a, c), 0, k) for c in callers]
            ev.add(leaves.first_call[a], name, names, site, kind, any(by_main))

    def _run_head(self, n: int, run: tuple[int, ...], ev: _Evidence,
                  runs_of: dict[str, list[tuple[int, tuple[int, ...]]]] | None) -> None:
        """Count what run ``n`` says of its head: the first frame that is not a wrapper
        among the first ``DEPTH - 1`` addresses above a leaf that is all wrappers
        (``runs_of`` None: the run is listed and its head's place counted already)."""
        for i in range(min(len(run), DEPTH - 1)):
            fact = self._fact_of(run[i])
            if fact is not None:
                break
        else:
            return
        a = run[i]
        k, name, says, site, kind, inlined = fact
        if runs_of is not None:
            runs_of.setdefault(name, []).append((n, run))
            ev.head(a, k, name)
        if not says:
            return
        if inlined:
            caller = self._info(a)[k + 1][0]
        elif i + 1 < len(run):
            caller = self._info(run[i + 1])[0][0]
        else:
            return
        ev.add(n, name, {caller}, site, kind, self._ends_in_main(run, i, k))

    def _ends_in_main(self, st: tuple[int, ...], i: int, k: int) -> bool:
        """Whether the first frame above frame ``k`` of ``st[i]`` that is not a constructor
        (:func:`is_constructor_name`) is main's (a chain of constructors called by main)."""
        for name, _, _ in self._info(st[i])[k + 1:]:
            if not is_constructor_name(name):
                return name == "main"
        main = self.ends_in_main
        for j in range(i + 1, len(st)):
            got = main.get(st[j])
            if got is None:
                got = 0
                for name, _, _ in self._info(st[j]):
                    if not is_constructor_name(name):
                        got = 2 if name == "main" else 1
                        break
                main[st[j]] = got
            if got:
                return got == 2
        return False

    def _find_level(self, ev: _Evidence) -> list[str]:
        """One level of :meth:`find_wrappers`: the functions whose evidence changed that it
        shows to be wrappers, in the order their first heads were counted."""
        # A wrapper calls the allocator (or a wrapper) from one place, for many callers;
        # the program's own code needs fewer callers, or none but its name.
        cands: list[tuple[int, str, int]] = []
        in_code: list[tuple[int, str, int]] = []
        callers, sites, kinds, not_by_name = ev.callers, ev.sites, ev.kinds, ev.not_by_name
        vetoed = self._vetoed if self.not_alloc_fn else None
        for name in ev.changed:
            got_callers = callers.get(name)
            if got_callers is None or len(sites[name]) != 1 or name == "main" \
                    or (vetoed is not None and vetoed(name)):
                continue
            n = len(got_callers)
            first, kind = kinds[name]
            if n >= WRAPPER_CALLERS or (kind == OWN and (
                    n >= CONSTRUCTOR_CALLERS
                    or (name not in not_by_name and is_constructor_name(name)))):
                cands.append((first, name, n))
            elif kind == OWN and name not in not_by_name:
                # One caller here, but maybe many in the program: asked of its code below.
                in_code.append((first, name, n))
        ev.changed.clear()
        if not cands and not in_code:
            return []
        # ... and is never anything but a head: not a caller of other allocating code, nor
        # a frame that inlined some. Every frame of the candidates (of every address, looked
        # at or not), found in one pass.
        frames_at: dict[str, list[tuple[int, int]]] = {
            name: [] for _, name, _ in itertools.chain(cands, in_code)}
        if core is not None:
            core.frames_named(self.profile.addresses(), self.locations, frames_at)
        else:
            locations = self.locations.get
            for a in self.profile.addresses():
                loc = locations(a)
                if loc is not None:
                    for k, f in enumerate(loc.frames):
                        if f.function in frames_at:
                            frames_at[f.function].append((a, k))
        in_program: dict[str, int] = {}
        for first, name, n in in_code:
            got = self._code_callers(name, frames_at[name])
            if got >= CODE_CALLERS:
                in_program[name] = got
                cands.append((first, name, n))
        new: list[str] = []
        at = ev.at
        for _, name, n in sorted(cands):
            if all(x in at for x in frames_at[name]):
                self.wrapper_names.add(name)
                self.wrappers.found[name] = n
                if name in in_program:
                    self.wrappers.in_code[name] = in_program[name]
                new.append(name)
        return new

    def _code_callers(self, name: str, frames: list[tuple[int, int]]) -> int:
        """How many functions of its module's code call ``name`` directly (0: unknown): read
        from the module's file (:func:`_module_file`; a file whose build-id differs from the
        one the dump recorded says nothing)."""
        for a, k in frames:
            loc = self.locations.get(a)
            if loc is None or loc.mapping is None or k >= len(loc.frames):
                continue
            frame = loc.frames[k]
            if frame.inlined or k != len(loc.frames) - 1:
                continue  # the real function of the address: its symbol is what is called
            path, build_id = loc.mapping.path, loc.mapping.build_id
            if loc.mapping.deleted or not path.startswith("/"):
                return 0
            if path not in self.module_files:
                self.module_files[path] = _module_file(path, build_id, self.profile.pid)
            found = self.module_files[path]
            return caller_counts(found).get(frame.system_name or frame.function) if found else 0
        return 0

    def _candidates(self, a: int) -> tuple[int, int, int, int]:
        """Frame indexes in address ``a`` of its first own, JNI entry, dependency and any
        frame that is not a wrapper (-1: none)."""
        got = self.candidates.get(a)
        if got is not None:
            return got
        found = self.wrapper_names
        info = self.info.get(a) or self._info(a)
        if len(info) == 1:
            name, _, wrapper = info[0]
            got = self.candidates[a] = _NONE if wrapper or name in found else self.plain[a]
            return got
        own = jni = dep = plain = -1
        for k, (name, kind, wrapper) in enumerate(info):
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
        loc = self.locations.get(a) or Location(a)
        found = self.wrapper_names
        new = tuple.__new__  # ViaFrame's own __new__ is a Python function: the same, slower
        info = self.info.get(a) or self._info(a)
        if len(info) == 1:
            (name, kind, wrapper), f = info[0], loc.frames[0] if loc.frames else None
            got = (new(ViaFrame, (name, f.file if f else "", f.line if f else 0, loc.module,
                                  WRAPPER if wrapper or name in found else kind)),)
        else:
            got = tuple(new(ViaFrame, (name, f.file, f.line, loc.module,
                                       WRAPPER if wrapper or name in found else kind))
                        for (name, kind, wrapper), f in zip(info, loc.frames, strict=True))
        self.via_of[a] = got
        return got

    def _via(self, stack: tuple[int, ...], i: int, k: int) -> tuple[ViaFrame, ...]:
        """A new via chain for a stack cut at frame ``k`` of ``stack[i]``: the frames of its
        addresses below, then the first ``k`` of ``stack[i]``."""
        frames_via = self._frames_via
        parts = list(map(frames_via, stack[:i]))
        if k:
            parts.append(frames_via(stack[i])[:k])
        return tuple(itertools.chain.from_iterable(parts))

    def fold(self, memo: dict[tuple[int, ...], tuple[tuple[int, ...], int, tuple[ViaFrame, ...]]]
             ) -> Profile:
        self.find_wrappers()
        trims: dict[int, int] = {}
        given = self.profile.samples
        if core is not None:
            # The compiled loop picks each stack's site, asking for an address's candidates
            # only when its search reaches it (those of the one-frame addresses classified
            # so far are known already); only the stacks whose site is not the leaf's
            # innermost frame change.
            found, info = self.wrapper_names, self.info
            self.candidates.update({
                a: _NONE if (one := info[a][0])[2] or one[0] in found else c
                for a, c in self.plain.items()})
            codes = core.sites(given, self.candidates, self._candidates)
            # The loop below, compiled: the same memo, chains and trims, the same objects.
            samples = core.fold_cut(given, codes, memo, self.vias, self.via_of,
                                    self._frames_via, self._via, trims, Sample)
            return self._trimmed(samples, trims)
        samples = list(given)
        memo_get = memo.get
        # Equal chains share one tuple, so reports can count them by identity: one per
        # distinct (addresses up to the site, frame).
        vias, vias_get = self.vias, self.vias.get
        via_of_get, frames_via = self.via_of.get, self._frames_via
        new = tuple.__new__  # as Sample(...), without its Python __new__
        for n, s in enumerate(given):
            st = s.stack
            got = memo_get(st)
            if got is None:
                if not st:
                    got = (st, 0, ())
                else:
                    i, k = self._site(st)
                    if i or k:
                        key = (st[:i + 1], k)
                        via = vias_get(key)
                        if via is None:
                            # Most often the leaf alone is folded: its frames, a new tuple.
                            via = vias[key] = (*(via_of_get(st[0]) or frames_via(st[0])),) \
                                if i == 1 and not k else self._via(st, i, k)
                        got = (st[i:], k, via)
                    else:
                        got = (st, 0, ())
                memo[st] = got
            cut, k, via = got
            if k:
                trims[cut[0]] = k
            if via or cut is not st:
                samples[n] = new(Sample, (cut, s.values, s.threads, via))
        return self._trimmed(samples, trims)

    def _trimmed(self, samples: list[Sample], trims: dict[int, int]) -> Profile:
        """The folded profile: ``samples``, and each address in ``trims`` without its
        innermost frames below the site (``trims[address]`` of them)."""
        locations = self.locations
        for a, k in trims.items():
            locations[a] = _trimmed(locations.get(a) or Location(a), k)
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
