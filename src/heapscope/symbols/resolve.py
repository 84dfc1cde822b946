"""Symbolize a Profile: give every stack address a module, an offset and its frames.

For each distinct address: find the executable mapping that holds it, subtract 1 when it is a
return address (so it points into the call instruction, not after it), translate it to the
ELF virtual address of the file found for the mapping, then resolve all addresses of one
module in one batch: from the cache, else from DWARF (llvm-symbolizer, with inline chains),
else from the ELF symbol table. A name is only ever given when DWARF or a sized function
symbol vouches for it; otherwise the report prints ``module+0xoffset``. Addresses in
anonymous executable memory or outside every mapping are named from a perf map (``[jit]``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Iterable, Sequence
from types import MappingProxyType

from heapscope.errors import ToolError
from heapscope.files import Stamp, stamp
from heapscope.model import Frame, Location, Mapping, Profile
from heapscope.symbols.cache import CacheEntry, Chain, SymbolCache
from heapscope.symbols.debuginfo import DebugFinder
from heapscope.symbols.demangle import demangle
from heapscope.symbols.elf import ElfError, ElfInfo
from heapscope.symbols.llvm import Backend, BackendError, LlvmSymbolizer, RawFrame, discard_ahead
from heapscope.symbols.locate import Locator, Module
from heapscope.symbols.options import (
    NO_DEBUG_INFO,
    Diagnostic,
    Progress,
    Symbolized,
    SymbolOptions,
)
from heapscope.symbols.perfmap import PerfMap, find_perf_map, untrusted
from heapscope.symbols.symtab import SymbolTable

JIT = "[jit]"
# Addresses a module needs before its lookup is split across several symbolizer runs: below
# that, reading the debug file again in a second run costs more than the answers it shares.
CHUNK = 3000
# Below this many addresses a module shares its symbolizer run with other such modules.
SMALL = 500
UNKNOWN = "[unknown]"


def symbolize(
    profile: Profile,
    options: SymbolOptions,
    progress: Progress | None = None,
    *,
    backend: Backend | None = None,
) -> Symbolized:
    """Return ``profile`` with ``locations`` filled for every stack address, plus diagnostics.

    ``backend`` replaces llvm-symbolizer (tests use it to count or fake lookups).
    """
    with contextlib.ExitStack() as stack:
        download_dir = None
        if options.cache_dir is not None:
            download_dir = options.cache_dir
        elif options.debuginfod_urls:
            # No cache: debuginfod downloads live only as long as this run.
            import tempfile  # only here: start-up time

            download_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="heapscope-"))
        run = _Run(profile, options, progress, backend or LlvmSymbolizer(), download_dir)
        return run.run()


# Written by hand, not as a dataclass: `heapscope top` must not import dataclasses (start-up
# time).
class _Plan:
    """One module's symbolization: its cache entry, the file to read DWARF from, the
    vaddrs not cached yet, and (once run) what the symbolizer answered."""

    __slots__ = ("best", "cacheable", "dwarf", "elf", "entry", "items", "key", "locations",
                 "missing", "mod", "result", "vaddr_of")

    def __init__(
        self,
        mod: Module,
        elf: ElfInfo,
        key: str,
        entry: CacheEntry,
        best: ElfInfo,  # the separate debug file when there is one, else the binary
        dwarf: bool,
        missing: list[int],
    ) -> None:
        self.mod = mod
        self.elf = elf
        self.key = key
        self.entry = entry
        self.best = best
        self.dwarf = dwarf
        self.missing = missing
        self.result: list[list[RawFrame]] | BackendError | ToolError | None = None
        # The module's addresses (address, lookup address, mapping) and the vaddr of those
        # that have one; then, once checked, the Locations of those and whether the entry may
        # be stored.
        self.items: list[tuple[int, int, Mapping]] = []
        self.vaddr_of: dict[int, int] = {}
        self.locations: dict[int, Location] = {}
        self.cacheable = False


class _Run:
    """The state of one symbolize() call."""

    def __init__(
        self,
        profile: Profile,
        options: SymbolOptions,
        progress: Progress | None,
        backend: Backend,
        download_dir: str | None,
    ) -> None:
        self.profile = profile
        self.options = options
        self.progress = progress
        self.backend = backend
        self.cache = SymbolCache(options.cache_dir)
        self.finder = DebugFinder(options, download_dir)
        self.diagnostics: list[Diagnostic] = []
        code = sorted((m for m in profile.mappings if m.executable), key=lambda m: m.start)
        self.code = code
        self.code_starts = [m.start for m in code]
        self.done = 0
        self.total = 0
        # Equal raw chains share one tuple of Frames (lines repeat across nearby addresses).
        self._frames_memo: dict[Chain, tuple[Frame, ...]] = {}
        # Frames by raw frame: the innermost ones of a chain, and the rest (``inlined``).
        self._frame_memo: dict[RawFrame, Frame] = {}
        self._inlined_memo: dict[RawFrame, Frame] = {}
        self.no_symbolizer: str = ""  # why the DWARF symbolizer cannot run, once known
        # Every file the names come from or were looked for, stamped before it is read
        # (Symbolized.depends); ``reusable`` turns False when the result may change without
        # any of them changing.
        self.depends: dict[str, Stamp] = {b: stamp(b) for b in options.binaries}
        self.reusable = True

    def run(self) -> Symbolized:
        """Symbolize every address of the profile."""
        if not self.profile.mappings and self.profile.samples:
            self.diagnostics.append(Diagnostic(
                "memory map", "warning",
                f"{self.profile.source or 'the dump'} has no memory map (MAPPED_LIBRARIES): "
                "its addresses cannot be named (a dump still being written looks like this "
                "too)"))
        callers = self.profile.caller_addresses()
        modules: dict[str, Module] = {}
        by_module: dict[str, list[tuple[int, int, Mapping]]] = {}
        outside: list[tuple[int, int, Mapping | None]] = []
        code, starts = self.code, self.code_starts
        last = -1  # the last code mapping starting at or below the lookup address
        for address in sorted(self.profile.addresses()):
            # Return addresses point after the call; address-1 is inside the call instruction
            # (and inside the right inline frame and line).
            lookup = address - 1 if address in callers and address > 0 else address
            # Lookup addresses only grow: the code mapping holding one is found by walking on
            # from the last one, not by a binary search per address.
            while last + 1 < len(starts) and starts[last + 1] <= lookup:
                last += 1
            mapping = code[last] if last >= 0 and code[last].contains(lookup) else None
            if mapping is None or mapping.anonymous:
                outside.append((address, lookup, mapping))
                continue
            if mapping.path not in modules:
                modules[mapping.path] = Module(mapping.path, [])
                by_module[mapping.path] = []
            by_module[mapping.path].append((address, lookup, mapping))
        for mod in modules.values():
            mod.mappings = sorted(
                {m for m in self.code if m.path == mod.path}, key=lambda m: m.start
            )
            mod.build_id = next((m.build_id for m in mod.mappings if m.build_id), "")

        main = next((m.path for m in self.profile.mappings if not m.anonymous), "")
        locator = Locator(self.options, list(modules.values()), main, self.profile.source)
        self.diagnostics.extend(locator.diagnostics)
        locations: dict[int, Location] = {}
        self.total = len(modules) + (1 if outside else 0)
        ordered = sorted(modules, key=lambda p: modules[p].mappings[0].start)
        plans: list[tuple[Module, dict[int, Location], _Plan | None]] = []
        for path in ordered:
            mod = modules[path]
            self._report(f"locating {mod.name}")
            self._depend(locator.candidates(mod))
            locator.locate(mod)
            out, vaddr_of = self._vaddrs(mod, by_module[path])
            plan = None
            if mod.elf is not None and vaddr_of:
                if not mod.elf.has_debug_info:
                    self._depend(path for path, _ in self.finder.candidates(mod.elf))
                plan = self._plan(mod, mod.elf, sorted(set(vaddr_of.values())))
                plan.items, plan.vaddr_of = by_module[path], vaddr_of
            plans.append((mod, out, plan))
        # The symbolizer runs of all modules at once (one process each, on every core); while
        # they run, this thread reads symbol tables and checks the answers already there.
        self._lookup_all([p for *_, p in plans if p is not None])
        for mod, out, plan in plans:
            # Diagnostics, cache entries and locations in module order, as they always were.
            self._report(f"symbolizing {mod.name}")
            if plan is not None:
                self._finish(plan)
                out.update(plan.locations)
            locations.update(out)
            self.diagnostics.extend(mod.diagnostics)
            self.done += 1
        if outside:
            self._report("naming JIT and unknown code")
            locations.update(self._outside_locations(outside))
            self.done += 1
        self._report("symbolized")
        # A process started ahead for this dump and not needed (the file had another
        # name here, or no addresses) would only wait for its input until heapscope exits.
        discard_ahead()
        result = self.profile.with_(locations=MappingProxyType(locations))
        self._shares(result)
        depends = tuple(self.depends.items()) if self.reusable else None
        return Symbolized(result, tuple(self.diagnostics), depends)

    def _shares(self, profile: Profile) -> None:
        """Put on each "no debug info" note the share of the dump's bytes (in use, else
        allocated) whose stacks pass through that module; for a profile without values (a
        series' union of stacks, its values kept elsewhere) the share of its stacks."""
        wanted = {d.path for d in self.diagnostics if d.path}
        if not wanted:
            return
        names = [t.type for t in profile.sample_types]
        index = next((names.index(n) for n in ("inuse_space", "alloc_space") if n in names),
                     len(names) - 1)
        total = 0.0
        through = dict.fromkeys(wanted, 0.0)
        stacks = dict.fromkeys(wanted, 0.0)
        # The addresses in those modules, by module: a stack is then matched with set
        # operations in C, not address by address (40,000 stacks: 0.15 s under cProfile).
        where: dict[str, set[int]] = {path: set() for path in wanted}
        for address, loc in profile.locations.items():
            if loc.mapping is not None and loc.mapping.path in wanted:
                where[loc.mapping.path].add(address)
        sets = [(path, frozenset(found)) for path, found in where.items() if found]
        for sample in profile.samples:
            value = sample.values[index] if index < len(sample.values) else 0.0
            total += value
            for path, found in sets:
                if not found.isdisjoint(sample.stack):
                    through[path] += value
                    stacks[path] += 1
        if total <= 0:
            through, total = stacks, float(len(profile.samples))
        self.diagnostics = [
            d._replace(share=through[d.path] / total if total > 0 else 0.0) if d.path else d
            for d in self.diagnostics]

    def _depend(self, paths: Iterable[str]) -> None:
        """Add files the result depends on, as they are now."""
        for path in paths:
            if path not in self.depends:
                self.depends[path] = stamp(path)

    def _report(self, what: str) -> None:
        """Tell the progress callback what runs now and how many modules are done."""
        if self.progress is not None:
            self.progress(what, self.done, self.total)

    def _vaddrs(self, mod: Module, items: list[tuple[int, int, Mapping]]
                ) -> tuple[dict[int, Location], dict[int, int]]:
        """Locations for the addresses no file vaddr can be found for, and the vaddr of
        every other address of the module."""
        out: dict[int, Location] = {}
        elf = mod.elf
        vaddr_of: dict[int, int] = {}
        deltas: dict[int, int | None] = {}  # by mapping start (hashing a Mapping is slower)
        for address, lookup, mapping in items:
            vaddr = None
            if elf is not None:
                if mapping.start not in deltas:
                    deltas[mapping.start] = elf.delta(mapping)
                delta = deltas[mapping.start]
                vaddr = lookup + delta if delta is not None else elf.to_vaddr(mapping, lookup)
            if vaddr is None:
                file_offset = lookup - mapping.start + mapping.offset
                out[address] = Location(address, mapping, mod.name, file_offset)
            else:
                vaddr_of[address] = vaddr
        return out, vaddr_of

    def _assemble(self, items: list[tuple[int, int, Mapping]], vaddr_of: dict[int, int],
                  name: str, chains: dict[int, Chain]) -> dict[int, Location]:
        """Locations with their frames for the addresses that have a vaddr."""
        out: dict[int, Location] = {}
        memo = self._frames_memo
        new = tuple.__new__
        for address, _lookup, mapping in items:
            if address in vaddr_of:
                vaddr = vaddr_of[address]
                chain = chains.get(vaddr, ())
                frames = memo.get(chain)
                if frames is None:
                    frames = memo[chain] = self._frames(chain)
                # tuple.__new__: every field given, without the NamedTuple's Python-level
                # __new__ (a third of the cost of 7,900 Locations and their Frames).
                out[address] = new(Location, (address, mapping, name, vaddr, frames))
        return out

    def _plan(self, mod: Module, elf: ElfInfo, vaddrs: list[int]) -> _Plan:
        """What one module needs: cached frames, and the vaddrs still to look up where."""
        key = self.cache.key(elf)
        entry = self.cache.load(key)
        if entry is not None and entry.dwarf and all(v in entry.frames for v in vaddrs):
            # warm: no debug-file search, no symtab, no llvm-symbolizer
            return _Plan(mod, elf, key, entry, elf, True, [])
        debug = None
        if not elf.has_debug_info:
            debug = self.finder.find(elf)
            for note in self.finder.notes:
                mod.info(note)
            self.finder.notes.clear()
        best = debug or elf
        self._depend([best.path])  # a debuginfod download is in no candidate list
        dwarf = best.has_debug_info
        if not dwarf:
            mod.diagnostics.append(Diagnostic(
                mod.name, "info", NO_DEBUG_INFO, path=mod.path,
                build_id=elf.build_id or mod.build_id))
            if self.options.debuginfod_urls:
                self.reusable = False  # a server may have it next time
        if entry is None or (dwarf and not entry.dwarf):
            entry = CacheEntry(dwarf)  # a symtab-only entry is stale once DWARF turns up
        missing = [v for v in vaddrs if v not in entry.frames]
        return _Plan(mod, elf, key, entry, best, dwarf, missing)

    def _lookup_all(self, plans: list[_Plan]) -> None:
        """Run the DWARF lookups of every plan that needs one, concurrently, and check every
        plan's answers (:meth:`_check`) as soon as they are there.

        A module with many addresses is looked up in parts, one run each (``CHUNK``
        addresses at least), when cores are left that no other run holds: each run reads
        the debug file again, but the answers, most of the work, come on every core. The
        runs most likely to take longest go first, so that one starts at once instead of
        waiting for a free core behind the small ones: the most addresses, then the biggest
        debug file (python3.11d's 24 MB of DWARF took 0.26 s, the other five modules
        0.05-0.1 s each). Plans that need no symbolizer are checked (symbol tables read)
        while the symbolizers run, and so are the answers that come first.
        """
        todo = [p for p in plans if p.dwarf and p.missing]
        if not todo:
            for p in plans:
                self._check(p)
            return
        cores = os.cpu_count() or 2
        Part = tuple[_Plan, int, int]  # a plan, first and end index of its missing vaddrs
        big: list[Part] = []
        small: list[_Plan] = []
        alone: list[_Plan] = []
        for p in todo:
            if len(p.missing) < SMALL and hasattr(self.backend, "lookup_many"):
                small.append(p)
            else:
                alone.append(p)
        # A module is split only across cores no other run holds (the small modules' shared
        # run counts as one), the most addresses first: a part beside the other runs on a
        # busy core ends no sooner, and re-reads the debug file (on 2 cores, the 21 MB
        # dump's program in 2 parts beside libc's run: all three done 0.03 s later than
        # with the program in one).
        spare = cores - len(alone) - (1 if small else 0)
        parts_of: dict[int, int] = {}
        for p in sorted(alone, key=lambda p: -len(p.missing)):
            extra = max(0, min(spare, len(p.missing) // CHUNK - 1))
            spare -= extra
            parts_of[id(p)] = 1 + extra
        for p in alone:
            size = -(-len(p.missing) // parts_of[id(p)])
            big += [(p, i, min(i + size, len(p.missing)))
                    for i in range(0, len(p.missing), size)]
        # Stable: equal keys keep module order.
        big.sort(key=lambda r: (-(r[2] - r[1]), -r[0].best.size))
        # Modules with few addresses share runs (a run's start-up costs as much as 2,000
        # answers): one per core that no big run holds, at least one; the biggest debug
        # files spread first.
        shared = min(max(1, cores - len(big)), len(small))
        groups: list[list[Part]] = [[] for _ in range(shared)]
        weight = [0] * len(groups)
        for p in sorted(small, key=lambda p: -p.best.size):
            k = weight.index(min(weight))
            groups[k].append((p, 0, len(p.missing)))
            weight[k] += p.best.size
        runs: list[list[Part]] = [[r] for r in big] + [g for g in groups if g]
        answers: dict[tuple[int, int], list[list[RawFrame]] | BackendError | ToolError] = {}
        starts: dict[int, list[int]] = {id(p): [] for p in todo}  # each plan's parts
        for run in runs:
            for p, lo, _ in run:
                starts[id(p)].append(lo)
        left = {k: len(v) for k, v in starts.items()}

        def one(run: list[Part]) -> None:
            if len(run) > 1:
                many = self.backend.lookup_many  # type: ignore[attr-defined]
                try:
                    got = many([(p.best.path, p.missing[lo:hi]) for p, lo, hi in run])
                except ToolError as exc:
                    got = [exc] * len(run)
                for (p, lo, _), answer in zip(run, got, strict=True):
                    answers[id(p), lo] = answer
                return
            p, lo, hi = run[0]
            try:
                answers[id(p), lo] = self.backend.lookup(p.best.path, p.missing[lo:hi])
            except (BackendError, ToolError) as exc:
                answers[id(p), lo] = exc

        # Plain threads and queues (concurrent.futures would add its and logging's imports
        # to every start-up): workers take runs in order and hand back each answer.
        tasks: queue.SimpleQueue[list[Part] | None] = queue.SimpleQueue()
        done: queue.SimpleQueue[list[Part]] = queue.SimpleQueue()
        for run in runs:
            tasks.put(run)
        failed: list[BaseException] = []

        def work() -> None:
            while (run := tasks.get()) is not None:
                try:
                    one(run)
                except BaseException as exc:  # raised again in the caller's thread
                    failed.append(exc)
                done.put(run)

        # Runs start together, up to two per core: a run waiting for a free core ends later
        # than one sharing a core (the 21 MB dump's two parts and shared run: 0.33-0.40 s
        # two at a time, 0.28-0.31 s all three at once); the bound keeps memory in check
        # when many modules need DWARF.
        threads = [threading.Thread(target=work, daemon=True)
                   for _ in range(min(len(runs), 2 * cores))]
        for t in threads:
            tasks.put(None)
            t.start()
        for p in plans:
            if id(p) not in left:
                self._check(p)
        for _ in runs:
            finished = done.get()
            if failed:
                raise failed[0]
            for p, _lo, _hi in finished:
                left[id(p)] -= 1
                if left[id(p)] == 0:
                    p.result = _joined([answers[id(p), lo] for lo in sorted(starts[id(p)])])
                    self._check(p)
        for t in threads:
            t.join()

    def _check(self, p: _Plan) -> None:
        """Raw frames for each missing vaddr of one module (DWARF answers checked against the
        symbol table, else the symbol table alone) into its entry, and its Locations.

        Runs as soon as the module's answer is there, in whatever order the symbolizers
        finish; what must keep module order (the run-wide diagnostics, cache writes) waits
        for :meth:`_finish`. Warnings about this module go to the module, in the order they
        always had.
        """
        entry, mod = p.entry, p.mod
        if p.missing:
            table = _LazySymbols(p.best, p.elf, mod)
            raw: list[list[RawFrame]] = [[] for _ in p.missing]
            # Only results as good as the entry claims to be may be cached: never symtab
            # answers in a DWARF entry (backend failure, or the debug file went away).
            cacheable = p.dwarf == entry.dwarf
            if isinstance(p.result, BackendError):
                mod.warn(f"{p.result}; using the symbol table")
                cacheable = False
                self.reusable = False
            elif isinstance(p.result, ToolError):
                # No symbolizer at all: names from symbol tables (functions, no lines) are
                # still names; never nothing. Said once for the whole run, in _finish.
                cacheable = False
                self.reusable = False
            elif p.result is not None:
                raw = p.result
            frames = entry.frames
            for vaddr, chain in zip(p.missing, raw, strict=True):
                frames[vaddr] = tuple(_checked(chain, vaddr, table))
            p.cacheable = cacheable
        p.locations = self._assemble(p.items, p.vaddr_of, mod.name, entry.frames)

    def _finish(self, p: _Plan) -> None:
        """The run-wide side of one checked module, in module order: the warning that there
        is no symbolizer (once, at the first module that needed one) and the cache write."""
        if p.missing and isinstance(p.result, ToolError) and not self.no_symbolizer:
            self.no_symbolizer = str(p.result)
            self.diagnostics.append(Diagnostic(
                "llvm-symbolizer", "warning",
                f"{p.result}. Names come from the ELF symbol tables for now "
                "(functions, no file:line, no inlined frames)"))
        if p.missing and p.cacheable:
            self.cache.store(p.key, p.entry)

    def _frames(self, chain: Sequence[RawFrame]) -> tuple[Frame, ...]:
        """Model frames from raw ones: demangled names, ``inlined`` on all but the last."""
        last = len(chain) - 1
        out = []
        for i, raw in enumerate(chain):
            inlined = i < last
            # Two memos keyed by the raw frame alone: no (raw, inlined) tuple built and
            # hashed per frame (a warm run makes 7,900 chains' frames).
            memo = self._inlined_memo if inlined else self._frame_memo
            frame = memo.get(raw)
            if frame is None:
                full, short = demangle(raw.function)
                frame = memo[raw] = tuple.__new__(
                    Frame, (short, raw.file, raw.line, inlined, full, raw.function))
            out.append(frame)
        return tuple(out)

    def _process_owners(self) -> set[int]:
        """Users the profiled process may have run as: the dump file's owner (the process
        wrote it) and whoever runs heapscope."""
        owners = {os.geteuid()}
        with contextlib.suppress(OSError):
            if self.profile.source and self.profile.source != "-":
                owners.add(os.stat(self.profile.source).st_uid)
        return owners

    def _outside_locations(
        self, items: list[tuple[int, int, Mapping | None]]
    ) -> dict[int, Location]:
        """Locations for addresses in anonymous code or outside every mapping."""
        source_dir = (
            os.path.dirname(os.path.abspath(self.profile.source))
            if (self.profile.source and self.profile.source != "-")
            else None
        )
        dirs = [*self.options.perf_map_dirs, *([source_dir] if source_dir else []), "/tmp"]
        if self.profile.pid is not None:
            self._depend(os.path.join(d, f"perf-{self.profile.pid}.map") for d in dirs)
        perf_path = find_perf_map(self.profile.pid, dirs)
        perf = PerfMap()
        why = untrusted(perf_path, self._process_owners()) if perf_path is not None else ""
        if perf_path is not None and why:
            self.diagnostics.append(Diagnostic(JIT, "warning", f"{perf_path} ignored: {why}"))
            perf_path = None
        if perf_path is not None:
            try:
                perf = PerfMap.read(perf_path)
            except OSError as exc:
                self.diagnostics.append(Diagnostic(JIT, "warning", f"{perf_path}: {exc}"))
        out: dict[int, Location] = {}
        unnamed = 0
        for address, lookup, mapping in items:
            hit = perf.lookup(lookup)
            if hit is not None:
                name, start = hit
                frame = Frame(name, full_name=name, system_name=name)
                out[address] = Location(address, mapping, JIT, lookup - start, (frame,))
            elif mapping is not None and mapping.path.startswith("["):
                # A kernel-provided region such as [vdso]: name it, offset from its start.
                out[address] = Location(address, mapping, mapping.name, lookup - mapping.start)
            else:
                unnamed += 1
                out[address] = Location(address, mapping, UNKNOWN, lookup)
        if unnamed:
            where = (
                f"in {perf_path}"
                if perf_path
                else (
                    f"perf-{self.profile.pid}.map not found in {', '.join(dirs)}"
                    if self.profile.pid is not None
                    else "no process id to find a perf map"
                )
            )
            self.diagnostics.append(
                Diagnostic(
                    UNKNOWN,
                    "info",
                    f"{unnamed} address{'es' if unnamed != 1 else ''} in anonymous memory or "
                    f"outside every mapping {'are' if unnamed != 1 else 'is'} not named ({where})",
                )
            )
        return out


def _joined(parts: list[list[list[RawFrame]] | BackendError | ToolError]
            ) -> list[list[RawFrame]] | BackendError | ToolError:
    """One module's answer from the answers of its runs, in order (the first failure, if
    any: the module then falls back to its symbol table as a whole)."""
    out: list[list[RawFrame]] = []
    for part in parts:
        if isinstance(part, (BackendError, ToolError)):
            return part
        out += part
    return out


class _LazySymbols:
    """The symbol table, read on first use (a fully DWARF-resolved module never needs it)."""

    def __init__(self, best: ElfInfo, binary: ElfInfo, mod: Module) -> None:
        self._best = best
        self._binary = binary
        self._mod = mod
        self._table: SymbolTable | None = None

    def get(self) -> SymbolTable:
        """The function symbols of the debug file if it has a .symtab, else of the binary."""
        if self._table is None:
            path = self._best.path if self._best.has_symtab else self._binary.path
            try:
                self._table = SymbolTable.read(path)
            except ElfError as exc:
                self._mod.warn(f"cannot read symbols: {exc}")
                self._table = SymbolTable([])
        return self._table


def _checked(chain: list[RawFrame], vaddr: int, table: _LazySymbols) -> list[RawFrame]:
    """The frames to keep for one address.

    DWARF chains with line information are trusted as they are. A bare name (symbol-table
    answer from the backend, or no DWARF at all) is kept only when a sized function symbol of
    that name contains the address; if not, whichever sized symbol contains it, else nothing.
    """
    for f in chain:  # a loop, not any(): 37,000 calls on a wide dump
        if f.file:
            break
    else:
        f = None
    if f is not None:
        if not chain[-1].function:
            name = table.get().lookup(vaddr)
            if name:
                chain = [*chain[:-1], RawFrame(name, chain[-1].file, chain[-1].line)]
        return chain
    symbols = table.get()
    name = chain[-1].function if chain else ""
    if name and symbols.covers(vaddr, name):
        return [RawFrame(name)]
    found = symbols.lookup(vaddr)
    return [RawFrame(found)] if found else []
