"""``heapscope graph``: a call graph image, the replacement for ``jeprof --svg/--pdf/--dot``."""

from __future__ import annotations

import argparse
import os
import sys

from heapscope.analysis.aggregate import GRANULARITIES
from heapscope.analysis.graph import Graph, GraphOptions, build_graph
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_focus_options,
    add_frame_filter_options,
    add_frame_options,
    add_input_options,
    add_output_options,
    add_sample_options,
    add_symbol_options,
    add_top_option,
    find_dumps,
    frame_policy,
    load_profiles,
    per_process,
    session_aliases,
    wrote,
)
from heapscope.errors import UsageError
from heapscope.files import check_output
from heapscope.progress import DelayedProgress
from heapscope.render.callgraph import (
    FORMATS,
    find_dot,
    format_value,
    output_format,
    write_graph,
)
from heapscope.units import plural


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= v < 1.0:
        raise argparse.ArgumentTypeError(f"must be at least 0 and below 1: {text}")
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
    add_output_options(p, "FILE", "output file; its extension picks the format (.svg, .png, "
                                  ".pdf, .gif, .dot); '-' writes DOT to stdout")
    p.add_argument("--format", choices=FORMATS, help="output format, whatever the extension")
    add_sample_options(p)
    g = p.add_mutually_exclusive_group()
    for gran in GRANULARITIES:
        g.add_argument("--" + gran, dest="granularity", action="store_const", const=gran,
                       help=f"a node per {gran[:-1] if gran != 'addresses' else 'address'}"
                            + (" (default)" if gran == "functions" else ""))
    p.set_defaults(granularity="functions")
    add_top_option(p, 80, "nodes, the largest by |cum|", zero="no limit")
    p.add_argument("--nodefraction", type=_fraction, default=0.005, metavar="F",
                   help="drop nodes with |cum| <= F of the total (default 0.005)")
    p.add_argument("--edgefraction", type=_fraction, default=0.001, metavar="F",
                   help="drop edges with |value| <= F of the total (default 0.001)")
    add_focus_options(p)
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
              f"-n/--top) and {graph.dropped_edges} of {graph.all_edges} edges",
              file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope graph``."""
    fmt = output_format(args.output, args.format)
    # Fail before the (possibly slow) symbolization: no Graphviz, or nowhere to write.
    if fmt != "dot":
        find_dot()
    check_output(args.output, args.force)
    options = GraphOptions(args.sample, args.granularity, args.top, args.nodefraction,
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
    if args.output != "-":
        wrote(args.output, os.path.getsize(args.output),
              f"{plural(len(graph.nodes), 'node')}, {plural(len(graph.edges), 'edge')}")
    return 0
