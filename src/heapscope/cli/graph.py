"""``heapscope graph``: a call graph image, the replacement for ``jeprof --svg/--pdf/--dot``."""

from __future__ import annotations

import argparse
import sys

from heapscope.analysis.aggregate import GRANULARITIES
from heapscope.analysis.graph import Graph, GraphOptions, build_graph
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_frame_filter_options,
    add_frame_options,
    add_input_options,
    add_sample_options,
    add_symbol_options,
    find_dumps,
    frame_policy,
    load_profiles,
    per_process,
    session_aliases,
)
from heapscope.errors import UsageError
from heapscope.progress import DelayedProgress
from heapscope.render.callgraph import (
    FORMATS,
    check_output,
    find_dot,
    format_value,
    output_format,
    write_graph,
)


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1: {text}")
    return v


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 (no limit) or more: {text}")
    return v


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``graph`` subcommand."""
    p = sub.add_parser(
        "graph", help=summary("graph"),
        description="Draw the call graph of one or more heap dumps (added together) with "
                    "Graphviz: a box per function with its flat and cumulative value, "
                    "edges weighted by the value allocated through each call.")
    p.add_argument("dumps", nargs="+", metavar="DUMP",
                   help="jemalloc heap dump (.heap, .heap.gz) or a folder of dumps")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="output file; its extension picks the format "
                        "(.svg, .png, .pdf, .gif, .dot); '-' writes DOT to stdout")
    p.add_argument("--format", choices=FORMATS, help="output format, whatever the extension")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    add_sample_options(p)
    g = p.add_mutually_exclusive_group()
    for gran in GRANULARITIES:
        g.add_argument("--" + gran, dest="granularity", action="store_const", const=gran,
                       help=f"a node per {gran[:-1] if gran != 'addresses' else 'address'}"
                            + (" (default)" if gran == "functions" else ""))
    p.set_defaults(granularity="functions")
    p.add_argument("--nodecount", type=_count, default=80, metavar="N",
                   help="draw at most N nodes, the largest by |cum| (0 = no limit; default 80)")
    p.add_argument("--nodefraction", type=_fraction, default=0.005, metavar="F",
                   help="drop nodes with |cum| <= F of the total (default 0.005)")
    p.add_argument("--edgefraction", type=_fraction, default=0.001, metavar="F",
                   help="drop edges with |value| <= F of the total (default 0.001)")
    p.add_argument("--focus", metavar="RE", help="keep only stacks with a frame matching RE")
    p.add_argument("--ignore", metavar="RE", help="drop stacks with a frame matching RE")
    add_frame_filter_options(p)
    p.add_argument("--thread", metavar="ID|NAME", help="only what this thread allocated")
    p.add_argument("--base", metavar="DUMP",
                   help="draw the difference from this base dump (growth red, shrinkage green)")
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def _notes(graph: Graph, sample: str) -> None:
    if graph.total == 0 and not graph.nodes and sample.startswith("alloc"):
        print("heapscope: note: no allocation totals in this dump; they are recorded only with "
              "MALLOC_CONF=prof_accum:true", file=sys.stderr)
    if graph.dropped_nodes or graph.dropped_edges:
        # jeprof says this on stderr too ("Dropping nodes with <= …").
        print(f"heapscope: dropped {graph.dropped_nodes} of {graph.all_nodes} nodes "
              f"(|cum| <= {format_value(graph.node_cutoff, graph.unit)} or beyond "
              f"--nodecount) and {graph.dropped_edges} of {graph.all_edges} edges",
              file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope graph``."""
    fmt = output_format(args.output, args.format)
    # Fail before the (possibly slow) symbolization: no Graphviz, or nowhere to write.
    if fmt != "dot":
        find_dot()
    check_output(args.output, args.force)
    options = GraphOptions(args.sample, args.granularity, args.nodecount, args.nodefraction,
                           args.edgefraction, args.focus, args.ignore, args.hide, args.show)
    paths = find_dumps(args, args.dumps, latest=True)
    if not paths:
        raise UsageError("no dumps given")
    with DelayedProgress() as bar:
        profiles = per_process(args.dumps, load_profiles(
            paths, args, bar.update, aliases=session_aliases(args.dumps), fold=False),
            roots=not args.base)[0]
        base = (per_process([args.base], load_profiles(find_dumps(args, [args.base], latest=True),
                                                       args, bar.update, fold=False),
                            roots=False)[0]
                if args.base else None)
    # Every frame is drawn; by default each node also says whose code it is.
    policy = frame_policy(args)
    graph = build_graph(profiles, options, base,
                        frames=policy if policy.mode == "site" else None)
    write_graph(graph, args.output, fmt, force=args.force)
    _notes(graph, args.sample)
    return 0
