"""The call graph as data: nodes (functions, lines or files) and caller→callee edges.

A node's flat value is what was allocated with it as the first (non-allocator) frame, its cum
value what was allocated with it anywhere on the stack (once per stack, as in ``top``). An
edge's value is what was allocated through that call: the values of the stacks in which the
caller calls the callee, each stack counted once per edge even when recursion repeats the
call (self-calls are not edges). Keys are names (never addresses), so several profiles add
up and a ``--base`` diff is new − base by name.

Which nodes and edges are kept follows jeprof's ``PrintDot``: the top ``nodecount`` nodes by
|cum| above ``nodefraction`` of the total, edges between kept nodes above ``edgefraction`` of
the total (a node's heaviest incoming edge is always kept, so no kept node loses its only
visible caller). In a diff, percentages and cutoffs are shares of the base total, as with
pprof's ``-diff_base``. Nothing here renders; see ``render.callgraph``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from heapscope.analysis.aggregate import NO_STACK, Key, KeyTable, location_keys
from heapscope.analysis.fold import FramePolicy, frame_kinds
from heapscope.analysis.top import SAMPLE_INDEX, View, filtered
from heapscope.errors import UsageError
from heapscope.model import Profile


@dataclass(frozen=True)
class GraphOptions:
    """What shapes a graph: sample type, granularity, filters and jeprof's pruning limits."""

    sample: str = "inuse_space"
    granularity: str = "functions"
    nodecount: int = 80
    nodefraction: float = 0.005
    edgefraction: float = 0.001
    focus: str | None = None
    ignore: str | None = None
    hide: str | None = None
    show: str | None = None

    def view(self) -> View:
        """The top View with the same sample type, granularity and filters."""
        return View(self.sample, self.granularity, focus=self.focus, ignore=self.ignore,
                    hide=self.hide, show=self.show)


@dataclass(frozen=True, slots=True)
class Node:
    """One function (line, file) of the graph with its flat and cumulative value."""

    key: Key
    flat: float
    cum: float


@dataclass(frozen=True, slots=True)
class Edge:
    """A call from ``caller`` to ``callee`` and the value allocated through it."""

    caller: Key
    callee: Key
    value: float


@dataclass(frozen=True)
class Graph:
    """The kept nodes (by |cum| descending) and edges (by |value| descending), and what
    was dropped to get there. ``total`` is the profile total (new − base in a diff);
    ``denominator`` is what percentages and cutoffs are relative to."""

    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    total: float
    sample_type: str
    unit: str
    granularity: str = "functions"
    diff: bool = False
    sources: tuple[str, ...] = ()
    base_sources: tuple[str, ...] = ()
    focus: str | None = None
    ignore: str | None = None
    hide: str | None = None
    show: str | None = None
    all_nodes: int = 0
    all_edges: int = 0
    node_cutoff: float = 0.0
    edge_cutoff: float = 0.0
    denominator: float = 0.0
    dropped_by_count: int = 0
    kinds: Mapping[Key, str] = field(default_factory=dict)  # whose code each node is

    @property
    def dropped_nodes(self) -> int:
        """How many nodes with a non-zero value are not drawn."""
        return self.all_nodes - len(self.nodes)

    @property
    def dropped_edges(self) -> int:
        """How many edges with a non-zero value are not drawn."""
        return self.all_edges - len(self.edges)


@dataclass
class Sums:
    """Raw per-key and per-call sums before any pruning."""

    flat: dict[Key, float] = field(default_factory=dict)
    cum: dict[Key, float] = field(default_factory=dict)
    edges: dict[tuple[Key, Key], float] = field(default_factory=dict)
    total: float = 0.0
    sample_type: str = ""
    unit: str = ""


def accumulate(profiles: Iterable[Profile], index: int, granularity: str = "functions") -> Sums:
    """Sum flat, cum and edge values of one sample value over (symbolized) profiles."""
    table = KeyTable()
    key_id, keys, flat, cum = table.id, table.keys, table.flat, table.cum
    edges: dict[tuple[int, int], float] = {}
    out = Sums()

    chain = itertools.chain.from_iterable
    for p in profiles:
        vt = p.sample_types[index]
        out.sample_type, out.unit = vt.type, vt.unit
        per_addr: dict[int, tuple[int, ...]] = {
            a: tuple(key_id(k) for k in location_keys(p.location(a), granularity))
            for a in p.addresses()
        }
        no_stack = (key_id(Key(NO_STACK)),)
        for s in p.samples:
            v = s.values[index]
            if v == 0:
                continue
            out.total += v
            stack = tuple(chain(map(per_addr.__getitem__, s.stack))) or no_stack
            flat[stack[0]] += v
            for i in set(stack):
                cum[i] += v
            # Leaf first: stack[i + 1] calls stack[i]. A set: once per stack per edge.
            # Self-calls (recursion, or a function inlined into itself) are left out, as
            # pprof does: the node's cum already counts the stack once.
            for e in set(zip(stack[1:], stack[:-1], strict=True)):
                if e[0] != e[1]:
                    edges[e] = edges.get(e, 0.0) + v
    for i, key in enumerate(keys):
        if flat[i] or cum[i]:
            out.flat[key] = flat[i]
            out.cum[key] = cum[i]
    out.edges = {(keys[a], keys[b]): v for (a, b), v in edges.items() if v}
    return out


def subtract(new: Sums, base: Sums) -> Sums:
    """new − base, per key and per edge (by name)."""
    out = Sums(dict(new.flat), dict(new.cum), dict(new.edges), new.total - base.total,
               new.sample_type or base.sample_type, new.unit or base.unit)
    for k, v in base.flat.items():
        out.flat[k] = out.flat.get(k, 0.0) - v
    for k, v in base.cum.items():
        out.cum[k] = out.cum.get(k, 0.0) - v
    for e, v in base.edges.items():
        out.edges[e] = out.edges.get(e, 0.0) - v
    for gone in [k for k, c in out.cum.items() if not c and not out.flat.get(k, 0.0)]:
        del out.cum[gone]
        out.flat.pop(gone, None)
    out.edges = {e: v for e, v in out.edges.items() if v}
    return out


def _node_order(n: Node) -> tuple[float, float, str, str, int]:
    return (-abs(n.cum), -abs(n.flat), n.key.name, n.key.file, n.key.line)


def _edge_order(e: Edge) -> tuple[float, str, str, str, str]:
    return (-abs(e.value), e.caller.name, e.callee.name, e.caller.file, e.callee.file)


def _check(options: GraphOptions) -> None:
    if options.sample not in SAMPLE_INDEX:
        raise UsageError(f"unknown sample type {options.sample!r}")
    if options.nodecount < 0:
        raise UsageError("--nodecount must be 0 (no limit) or more")
    for name, v in (("--nodefraction", options.nodefraction),
                    ("--edgefraction", options.edgefraction)):
        if not 0.0 <= v < 1.0:
            raise UsageError(f"{name} must be at least 0 and below 1, not {v:g}")


def prune_graph(sums: Sums, options: GraphOptions, *, diff: bool = False,
                denominator: float | None = None) -> Graph:
    """Keep the nodes and edges worth drawing, as jeprof's dot output does.

    Percentages and cutoffs are relative to ``denominator``, by default |total| (or, for
    a zero total, the sum of |flat|).
    """
    _check(options)
    nodes = [Node(k, sums.flat.get(k, 0.0), c) for k, c in sums.cum.items()]
    nodes.sort(key=_node_order)
    denom = abs(denominator) if denominator else 0.0
    if not denom:
        denom = abs(sums.total) if sums.total else sum(abs(n.flat) for n in nodes)
    node_cutoff = options.nodefraction * denom
    edge_cutoff = options.edgefraction * denom
    above = [n for n in nodes if abs(n.cum) > node_cutoff]
    kept = above[: options.nodecount] if options.nodecount > 0 else above
    names = {n.key for n in kept}
    edges = [Edge(a, b, v) for (a, b), v in sums.edges.items() if a in names and b in names]
    edges.sort(key=_edge_order)
    has_caller: set[Key] = set()
    shown: list[Edge] = []
    for e in edges:
        # Keep an edge above the cutoff, and each node's heaviest incoming edge anyway.
        if abs(e.value) > edge_cutoff or e.callee not in has_caller:
            shown.append(e)
            has_caller.add(e.callee)
    return Graph(
        nodes=tuple(kept),
        edges=tuple(shown),
        total=sums.total,
        sample_type=sums.sample_type or options.sample,
        unit=sums.unit or ("bytes" if options.sample.endswith("space") else "count"),
        granularity=options.granularity,
        diff=diff,
        focus=options.focus,
        ignore=options.ignore,
        hide=options.hide,
        show=options.show,
        all_nodes=len(nodes),
        all_edges=len(sums.edges),
        node_cutoff=node_cutoff,
        edge_cutoff=edge_cutoff,
        denominator=denom,
        dropped_by_count=len(above) - len(kept),
    )


def node_kinds(profiles: Iterable[Profile], granularity: str,
               frames: FramePolicy | None = None) -> dict[Key, str]:
    """Whose code each node is (own, library, dependency, wrapper; see analysis.fold)."""
    out: dict[Key, str] = {}
    for p in profiles:
        kinds = frame_kinds(p, frames)
        for a in p.addresses():
            keys = location_keys(p.location(a), granularity)
            ks = kinds(a)
            if len(ks) != len(keys):  # addresses granularity: one key for the location
                ks = ks[-1:]
            for k, kind in zip(keys, ks, strict=False):
                out.setdefault(k, kind)
    return out


def build_graph(
    profiles: list[Profile],
    options: GraphOptions,
    base: list[Profile] | None = None,
    frames: FramePolicy | None = None,
) -> Graph:
    """The call graph of ``profiles`` added together (minus ``base`` when given); with
    ``frames`` each node also says whose code it is."""
    _check(options)
    index = SAMPLE_INDEX[options.sample]
    view = options.view()
    sums = accumulate([filtered(p, view) for p in profiles], index, options.granularity)
    denominator = None
    if base:
        base_sums = accumulate([filtered(p, view) for p in base], index, options.granularity)
        # As pprof's -diff_base: a change is a share of the base (else of the new) total,
        # not of the net change, which can be near zero while much moved.
        denominator = abs(base_sums.total) or abs(sums.total) or None
        sums = subtract(sums, base_sums)
    graph = prune_graph(sums, options, diff=bool(base), denominator=denominator)
    kinds = node_kinds([*profiles, *(base or [])], options.granularity, frames) \
        if frames is not None else {}
    return replace(graph, sources=tuple(p.source for p in profiles),
                   base_sources=tuple(p.source for p in base or ()), kinds=kinds)
