"""``heapscope flamegraph``: an interactive flame graph as one self-contained HTML file."""

from __future__ import annotations

import argparse
import sys

from heapscope.analysis.top import View, filtered
from heapscope.analysis.tree import build_tree
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_focus_options,
    add_frame_filter_options,
    add_frame_options,
    add_input_options,
    add_output_options,
    add_sample_options,
    add_symbol_options,
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
from heapscope.render.flamegraph import default_title, write_flamegraph
from heapscope.units import plural


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``flamegraph`` subcommand."""
    p = sub.add_parser(
        "flamegraph", help=summary("flamegraph"),
        description="Write an interactive flame graph of heap dumps as one self-contained "
                    "HTML file: hover for details, click to zoom, search, inverted (callers) "
                    "view, the four sample types, and a diff against --base. Several dumps are "
                    "added up.")
    p.add_argument("dumps", nargs="+", metavar="DUMP",
                   help="jemalloc heap dump (.heap, .heap.gz), a folder of dumps or a session")
    add_output_options(p, "FILE.html", "the HTML file to write")
    p.add_argument("--base", metavar="DUMP",
                   help="show the change from this base dump (new - base; growth red)")
    add_sample_options(p)
    p.add_argument("--thread", metavar="ID|NAME", help="only what this thread allocated")
    add_focus_options(p)
    add_frame_filter_options(p)
    p.add_argument("--title",
                   help="title shown on the page (default: the program, process and dump time)")
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope flamegraph``."""
    if not args.output.lower().endswith((".html", ".htm")):
        raise UsageError("-o must name an .html file")
    check_output(args.output, args.force)
    paths = find_dumps(args, args.dumps, latest=True)
    base_paths = find_dumps(args, [args.base], latest=True) if args.base else []
    with DelayedProgress() as bar:
        view = View(focus=args.focus, ignore=args.ignore, hide=args.hide, show=args.show)
        loaded, labels = per_process(
            args.dumps, load_profiles(paths, args, bar.update,
                                      aliases=session_aliases(args.dumps), fold=False),
            roots=not args.base)
        profiles = [filtered(p, view) for p in loaded]
        base = ([filtered(p, view) for p in per_process(
            [args.base], load_profiles(base_paths, args, bar.update, fold=False),
            roots=False)[0]]
                if args.base else None)
        bar.update("building the call tree", 0, 0)
        # Every frame is drawn; by default each says whose code it is (own code in warm
        # colours, libraries and wrappers grey, dependencies blue).
        policy = frame_policy(args)
        tree = build_tree(profiles, base=base, frames=policy if policy.mode == "site" else None)
        bar.update(f"writing {args.output}", 0, 0)
        size = write_flamegraph(
            args.output, tree,
            title=args.title or default_title(paths, base_paths, labels),
            sources=paths, sample=args.sample, base_sources=base_paths, force=args.force)
    if all(p.total(2) == 0 and p.total(3) == 0 for p in profiles) and \
            args.sample.startswith("alloc"):
        print("heapscope: note: no allocation totals in this dump; they are recorded only with "
              "MALLOC_CONF=prof_accum:true", file=sys.stderr)
    wrote(args.output, size, plural(len(tree), "frame"))
    return 0
