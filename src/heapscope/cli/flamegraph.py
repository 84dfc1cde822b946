"""``heapscope flamegraph``: an interactive flame graph as one self-contained HTML file."""

from __future__ import annotations

import argparse
import sys

from heapscope.analysis.top import View, filtered
from heapscope.analysis.tree import build_tree
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
    processes_title,
    session_aliases,
)
from heapscope.errors import UsageError
from heapscope.progress import DelayedProgress
from heapscope.render.flamegraph import default_title, write_flamegraph
from heapscope.terminal import clean
from heapscope.units import human_bytes


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
    p.add_argument("-o", "--output", required=True, metavar="FILE.html",
                   help="the HTML file to write")
    p.add_argument("--base", metavar="DUMP",
                   help="show the change from this base dump (new - base; growth red)")
    add_sample_options(p)
    p.add_argument("--thread", metavar="ID|NAME", help="only what this thread allocated")
    p.add_argument("--focus", metavar="RE", help="keep only stacks with a frame matching RE")
    p.add_argument("--ignore", metavar="RE", help="drop stacks with a frame matching RE")
    add_frame_filter_options(p)
    p.add_argument("--title", help="title shown on the page (default: the dump's name)")
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope flamegraph``."""
    if not args.output.lower().endswith((".html", ".htm")):
        raise UsageError("-o must name an .html file")
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
            title=args.title or (processes_title(labels) if labels and not args.base
                                 else default_title(paths, base_paths)),
            sources=paths, sample=args.sample, base_sources=base_paths)
    if all(p.total(2) == 0 and p.total(3) == 0 for p in profiles) and \
            args.sample.startswith("alloc"):
        print("heapscope: note: no allocation totals in this dump; they are recorded only with "
              "MALLOC_CONF=prof_accum:true", file=sys.stderr)
    print(f"heapscope: wrote {clean(args.output)} ({human_bytes(size)}, {len(tree)} frames)",
          file=sys.stderr)
    return 0
