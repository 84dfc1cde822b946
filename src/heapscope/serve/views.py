"""Every view the viewer shows, as JSON-ready data, from the same functions as the commands.

One path from a dump to a view: a dump is prepared by :func:`heapscope.prepare.prepare`
(read, unsampled, symbolized, pruned, folded; stored in the cache folder so the next start
reads it back), then the top table is :func:`heapscope.analysis.top.build_table` and
:func:`heapscope.render.json.table_dict` (``heapscope top --format json``), the flame graph
:func:`heapscope.analysis.tree.build_tree` and :func:`heapscope.render.flamegraph.
flamegraph_data` (``heapscope flamegraph``), the call graph :func:`heapscope.analysis.graph.
build_graph` and :func:`heapscope.render.callgraph.to_dot` (``heapscope graph``), the leak
report :func:`heapscope.inputs.judge` (``heapscope leaks --format json``) and the chart
:func:`heapscope.render.timeline.timeline_of` (``heapscope timeline``).

A view is of a :class:`Target`: one dump, or a merged set of dumps added together, minus a
base for a diff, folded with a frame policy (the command line's ``--own``/``--alloc-fn``,
or the page's). Prepared profiles (per dump and policy) and leak reports are kept in memory
(a few, newest first) and computed one at a time: two pages asking for the same dump wait
for one preparation, not two.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypeVar

from heapscope.analysis.fold import FramePolicy, Wrappers
from heapscope.analysis.graph import GraphOptions
from heapscope.analysis.top import View, build_table, filtered
from heapscope.model import Profile
from heapscope.prepare import Prepared, prepare
from heapscope.serve.catalog import FILE, SESSION, Catalog, Dump
from heapscope.symbols import SymbolOptions

T = TypeVar("T")
RAW = FramePolicy(mode="raw")


class Settings(NamedTuple):
    """What the command line said: where symbols and sources are, how frames are folded."""

    options: SymbolOptions
    frames: FramePolicy
    source_paths: tuple[str, ...] = ()


class Target(NamedTuple):
    """What a view shows: one dump, or several added together (a merged set, as ``top
    --merge``), minus a base dump for a diff, with stacks folded as ``frames`` says."""

    dumps: tuple[Dump, ...]
    base: Dump | None
    frames: FramePolicy


class _Lru:
    """A small map that forgets its oldest entries."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.items: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        got = self.items.get(key)
        if got is not None:
            self.items.move_to_end(key)
        return got

    def put(self, key: Any, value: Any) -> None:
        self.items[key] = value
        self.items.move_to_end(key)
        while len(self.items) > self.keep:
            self.items.popitem(last=False)


class Workbench:
    """The views of the catalog's dumps and inputs, computed once and kept a while."""

    def __init__(self, catalog: Catalog, settings: Settings, *, keep: int = 8) -> None:
        self.catalog = catalog
        self.settings = settings
        self.lock = threading.RLock()
        self._prepared = _Lru(keep)
        self._results = _Lru(4 * keep)
        self._reports = _Lru(keep)

    # -- profiles ------------------------------------------------------------------------

    def _cached(self, key: Any, make: Callable[[], T]) -> T:
        with self.lock:
            got = self._results.get(key)
            if got is None:
                got = make()
                self._results.put(key, got)
            return got  # type: ignore[no-any-return]

    def prepared(self, dump: Dump, raw: bool = False, frames: FramePolicy | None = None
                 ) -> Prepared:
        """The dump prepared as ``top`` (folded to sites as ``frames``, by default the
        command line's, says) or, with ``raw``, as pictures draw it (every frame)."""
        policy = RAW if raw else frames or self.settings.frames
        # The policy is part of the key: another --own or --alloc-fn is another fold.
        key = (dump.path, dump.size, dump.time, policy)
        with self.lock:
            got: Prepared | None = self._prepared.get(key)
            if got is None:
                got = prepare(dump.path, self.settings.options, frames=policy)
                aliases = self._aliases(dump.input)
                if aliases:
                    from heapscope.analysis.ownership import alias_modules

                    got = got._replace(profile=alias_modules(got.profile, aliases))
                self._prepared.put(key, got)
            return got

    def _aliases(self, input_id: int) -> dict[str, str]:
        inp = self.catalog.input(input_id)
        if inp.kind != SESSION:
            return {}
        from heapscope.inputs import session_aliases

        return session_aliases([inp.path])

    def profile(self, dump: Dump, raw: bool = False, frames: FramePolicy | None = None
                ) -> Profile:
        """The prepared profile of ``dump``."""
        return self.prepared(dump, raw, frames).profile

    def _stamp(self, dump: Dump | None) -> Any:
        return None if dump is None else (dump.path, dump.size, dump.time)

    def _key(self, target: Target, frames: bool = True) -> Any:
        """What a view of ``target`` depends on (``frames``: the fold as well)."""
        return (tuple(self._stamp(d) for d in target.dumps), self._stamp(target.base),
                target.frames if frames else None)

    def _input_paths(self, dumps: Sequence[Dump]) -> list[str]:
        paths = [self.catalog.input(d.input).path for d in dumps]
        return list(dict.fromkeys(paths))

    def _pictures(self, target: Target) -> tuple[list[Profile], list[Profile] | None,
                                                 list[str]]:
        """Every frame of the target's profiles as ``heapscope flamegraph`` and ``graph``
        draw them (several processes: each its own memory under a root frame, no root in
        a diff), its base's, and the processes' labels."""
        from heapscope.inputs import per_process

        raw = [self.profile(d, raw=True) for d in target.dumps]
        profiles, labels = per_process(self._input_paths(target.dumps), raw,
                                       roots=target.base is None)
        base = None
        if target.base is not None:
            base = per_process(self._input_paths([target.base]),
                               [self.profile(target.base, raw=True)], roots=False)[0]
        return profiles, base, labels

    # -- one dump, a merged set, or a diff -------------------------------------------------

    def top(self, target: Target, view: View) -> dict[str, Any]:
        """``heapscope top DUMP… --merge --format json`` (with ``--base``: the growth from
        the base)."""
        from heapscope.render.json import table_dict

        def make() -> dict[str, Any]:
            preps = [self.prepared(d, frames=target.frames) for d in target.dumps]
            base = ([self.profile(target.base, frames=target.frames)]
                    if target.base is not None else None)
            table, rows = build_table([p.profile for p in preps], view, base)
            wrappers = Wrappers()
            for p in preps:
                wrappers.update(p.wrappers)
            doc = table_dict(table, rows)
            doc["sources"] = [p.profile.source for p in preps]
            doc["wrappers"] = wrappers.as_list()
            doc["diff"] = target.base is not None
            doc["notes"] = _warnings(preps)
            return doc

        return self._cached(("top", self._key(target), view), make)

    def flame(self, target: Target, view: View) -> dict[str, Any]:
        """The flame graph data of ``heapscope flamegraph DUMP…`` (every frame, each saying
        whose code it is), with the view's focus, ignore, hide and show."""
        from heapscope.analysis.tree import build_tree
        from heapscope.render.flamegraph import default_title, flamegraph_data

        key = ("flame", self._key(target), view.focus, view.ignore, view.hide, view.show,
               view.sample)

        def make() -> dict[str, Any]:
            loaded, loaded_base, labels = self._pictures(target)
            profiles = [filtered(p, view) for p in loaded]
            base = [filtered(p, view) for p in loaded_base] if loaded_base is not None else None
            policy = target.frames
            tree = build_tree(profiles, base=base,
                              frames=policy if policy.mode == "site" else None)
            sources = [d.key for d in target.dumps]
            base_sources = [target.base.key] if target.base is not None else []
            # Titled as heapscope flamegraph titles it: program, processes, dump time.
            title = default_title([d.path for d in target.dumps],
                                  [target.base.path] if target.base is not None else [],
                                  labels)
            return flamegraph_data(tree, title=title, sources=sources, sample=view.sample,
                                   base_sources=base_sources)

        return self._cached(key, make)

    def peek(self, target: Target, view: View, name: str) -> dict[str, Any]:
        """Callers and callees of the function ``name`` (every frame, as the call graph)."""
        from heapscope.analysis.peek import function_sums, peek_sums

        def sums() -> Any:
            profiles, base, _ = self._pictures(target)
            return function_sums(profiles, view, base)

        # Every frame, whatever the fold: the key leaves the frame policy out.
        s = self._cached(("sums", self._key(target, frames=False), view.sample, view.focus,
                          view.ignore, view.hide, view.show), sums)
        p = peek_sums(s, name)
        return {"function": p.name, "flat": p.flat, "cum": p.cum, "total": p.total,
                "sample_type": p.sample_type, "unit": p.unit, "files": list(p.files),
                "callers": [{"name": c.name, "value": c.value} for c in p.callers],
                "callees": [{"name": c.name, "value": c.value} for c in p.callees],
                "diff": target.base is not None}

    def graph(self, target: Target, options: GraphOptions) -> dict[str, Any]:
        """``heapscope graph DUMP… --format dot`` (with ``--base``: the change), the SVG
        Graphviz draws from it and each node's box (:func:`~heapscope.serve.callgraph.
        graph_doc`)."""
        from heapscope.analysis.graph import build_graph
        from heapscope.serve.callgraph import graph_doc

        def make() -> dict[str, Any]:
            profiles, base, _ = self._pictures(target)
            policy = target.frames
            graph = build_graph(profiles, options, base,
                                frames=policy if policy.mode == "site" else None)
            return graph_doc(graph)

        return self._cached(("graph", self._key(target), options), make)

    def source(self, target: Target, view: View, file: str) -> dict[str, Any] | None:
        """The source view of ``file``, or None when the profiles name no such file."""
        from heapscope.serve.source import candidates, line_values, read_source, source_doc

        own = [self.profile(d, frames=target.frames) for d in target.dumps]
        raw = [self.profile(d, raw=True) for d in target.dumps]
        # The path opened is the profile's own string: a request only picks one of them.
        named = {f.file: f.file for p in (*own, *raw) for loc in p.locations.values()
                 for f in loc.frames if f.file}
        path = named.get(file)
        if path is None:
            return None
        base = target.base
        base_own = [self.profile(base, frames=target.frames)] if base is not None else None
        base_raw = [self.profile(base, raw=True)] if base is not None else None
        space, objects = _pair(view.sample)
        lines = view._replace(granularity="lines", nodecount=0)
        tables = [build_table(ps, lines._replace(sample=s), bs)[0]
                  for ps, bs, s in ((own, base_own, space), (own, base_own, objects),
                                    (raw, base_raw, space), (raw, base_raw, objects))]
        values = line_values(path, *tables)
        settings = self.settings
        found = read_source(path, settings.source_paths, settings.options.sysroot)
        looked = candidates(path, settings.source_paths, settings.options.sysroot)
        doc = source_doc(path, found, values, looked)
        doc["diff"] = base is not None
        doc["sample_type"] = space
        return doc

    # -- a session (or folder) -------------------------------------------------------------

    def report(self, input_id: int, frames: FramePolicy | None = None
               ) -> tuple[list[Any], Any, list[Dump]]:
        """The series and leak report of an input's dumps, as ``heapscope leaks`` makes
        them (folded as ``frames``, by default the command line's, says); computed again
        when its dumps changed (a running session)."""
        from heapscope.errors import InputError

        try:
            return self._report(input_id, frames)
        except InputError:
            # A dump listed a moment ago may be gone (the agent drops the oldest of its
            # window): list the folder again and judge what is there now, once.
            self.catalog.refresh(force=True)
            return self._report(input_id, frames)

    def _report(self, input_id: int, frames: FramePolicy | None
                ) -> tuple[list[Any], Any, list[Dump]]:
        from heapscope.inputs import judge

        inp = self.catalog.input(input_id)
        dumps = list(self.catalog.input_dumps(input_id))
        policy = frames or self.settings.frames
        key = (input_id, tuple(self._stamp(d) for d in dumps), policy)
        with self.lock:
            got = self._reports.get(key)
            if got is None:
                series, report = judge([inp.path], [d.path for d in dumps],
                                       self.settings.options, policy)
                if inp.ignored:
                    from heapscope.inputs import left_out_note

                    report.notes.append(left_out_note(inp.ignored))
                got = (series, report, dumps)
                self._reports.put(key, got)
            return got  # type: ignore[no-any-return]

    def leaks(self, input_id: int, frames: FramePolicy | None = None) -> dict[str, Any]:
        """``heapscope leaks --format json INPUT``, plus each suspect's evidence in words,
        each process's title and its dumps' numbers."""
        from heapscope.render.leaks import evidence

        if not self.catalog.input_dumps(input_id):
            return {"processes": [], "suspects": [], "notes": [
                self.catalog.input(input_id).problem or "no dumps yet"], "wrappers": [],
                "evidence": [], "titles": {}, "dumps": {}}
        series, report, dumps = self.report(input_id, frames)
        doc: dict[str, Any] = report.as_dict()
        doc["evidence"] = [evidence(f, report.window) for f in report.findings]
        doc["titles"] = self._titles(input_id, series)
        by_pid: dict[str, list[int]] = {}
        for d in dumps:
            by_pid.setdefault(str(d.pid), []).append(d.id)
        doc["dumps"] = by_pid
        return doc

    def _titles(self, input_id: int, series: list[Any]) -> dict[str, str]:
        from heapscope.analysis.ownership import fill_images
        from heapscope.inputs import session_facts

        inp = self.catalog.input(input_id)
        facts = fill_images(session_facts([inp.path]),
                            [s.profile for s in series if s.profile is not None])
        return {str(pid): f.title for pid, f in facts.items()}

    def timeline(self, input_id: int, frames: FramePolicy | None = None) -> dict[str, Any]:
        """The lines of ``heapscope timeline INPUT``, each point with its dump's number."""
        inp = self.catalog.input(input_id)
        if inp.kind == FILE or not self.catalog.input_dumps(input_id):
            return {"title": inp.title, "lines": [], "notes": [
                "one dump file: no series to draw" if inp.kind == FILE else "no dumps yet"]}
        from heapscope.capture.session import read_manifest
        from heapscope.render.timeline import timeline_of

        series, report, dumps = self.report(input_id, frames)
        manifest = read_manifest(inp.path) if inp.kind == SESSION else {}
        with self.lock:
            tl = timeline_of(inp.path, manifest, series, report, top=5)
        ids = {d.path: d.id for d in dumps}
        return {"title": tl.title, "notes": tl.notes, "lines": [
            {"label": line.label, "kind": line.kind, "pid": line.pid, "detail": line.detail,
             "points": [[t, v, ids.get(path) if k < len(line.dumps) else None]
                        for k, ((t, v), path) in enumerate(zip(
                            line.points, line.dumps or [""] * len(line.points),
                            strict=False))]}
            for line in tl.lines]}


def _pair(sample: str) -> tuple[str, str]:
    """The bytes and objects sample types of the family ``sample`` belongs to."""
    family = "alloc" if sample.startswith("alloc") else "inuse"
    return f"{family}_space", f"{family}_objects"


def _warnings(preps: Sequence[Prepared]) -> list[str]:
    from heapscope.terminal import clean

    seen: dict[str, None] = {}
    for prep in preps:
        for d in prep.diagnostics:
            if d.level == "warning":
                seen[clean(str(d))] = None
    return list(seen)
