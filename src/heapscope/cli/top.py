"""``heapscope top``: the flat/cumulative table, the replacement for ``jeprof --text``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from heapscope.analysis.aggregate import Table
from heapscope.analysis.top import View, build_diff, build_table
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_frame_options,
    add_input_options,
    add_symbol_options,
    add_view_options,
    find_dumps,
    load_profiles,
    session_aliases,
    view_from_args,
)
from heapscope.errors import UsageError
from heapscope.progress import DelayedProgress
from heapscope.render.json import render_json, table_dict
from heapscope.render.text import render_diff, render_table
from heapscope.terminal import clean


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``top`` subcommand."""
    p = sub.add_parser("top", help=summary("top"),
                       description="Print the top allocation sites of one or more heap dumps.")
    p.add_argument("dumps", nargs="+", metavar="DUMP",
                   help="jemalloc heap dump (.heap, .heap.gz) or a folder of dumps")
    add_view_options(p)
    p.add_argument("--thread", metavar="ID|NAME", help="only what this thread allocated")
    p.add_argument("--base", metavar="DUMP", help="show the difference from this base dump")
    p.add_argument("--merge", action="store_true", help="add several dumps into one report")
    p.add_argument("--format", choices=("text", "json"), default="text",
                       help="text for people (default), json for programs")
    p.add_argument("-i", "--interactive", action="store_true",
                   help="open an interactive shell (top, topN, --cum, focus, …)")
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def _warn_empty(table: Table, view: View) -> None:
    if table.total == 0 and view.sample.startswith("alloc"):
        print("heapscope: note: no allocation totals in this dump; they are recorded only with "
              "MALLOC_CONF=prof_accum:true", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope top``."""
    paths = find_dumps(args, args.dumps, latest=True)
    view = view_from_args(args)
    if args.interactive and (len(paths) > 1 and not args.merge):
        raise UsageError("-i works on one dump (or several with --merge)")
    with DelayedProgress() as bar:
        profiles = load_profiles(paths, args, bar.update,
                                 aliases=session_aliases(args.dumps))
        base_paths = find_dumps(args, [args.base], latest=True) if args.base else []
        base_profiles = load_profiles(base_paths, args, bar.update) if args.base else None
    if args.interactive:
        from heapscope.cli.shell import Shell, web_inputs

        Shell(profiles, view, base_profiles, web=web_inputs(args)).loop()
        return 0
    groups = [profiles] if args.merge or len(profiles) == 1 else [[p] for p in profiles]
    reports: list[dict[str, Any]] = []
    for k, group in enumerate(groups):
        diff = build_diff(group, view, base_profiles) if base_profiles else None
        table, rows = (diff.table, diff.rows) if diff else build_table(group, view)
        if args.format == "json":
            d = table_dict(table, rows)
            d["sources"] = [p.source for p in group]
            if diff and base_profiles:
                # Both sides' totals, and what the text's shares are parts of.
                d["base_sources"] = [p.source for p in base_profiles]
                d["base_total"] = diff.base_total
                d["new_total"] = diff.new_total
                d["growth"] = diff.growth
                d["shrinkage"] = diff.shrinkage
            d["wrappers"] = args.wrappers.as_list()
            reports.append(d)
            continue
        if len(groups) > 1:
            if k:
                sys.stdout.write("\n")
            p = group[0]
            pid = f" (pid {p.pid})" if p.pid is not None else ""
            sys.stdout.write(f"==> {clean(p.source)}{pid} <==\n")
        _warn_empty(table, view)
        title = f"t{args.thread}" if args.thread else ""
        if diff and base_profiles:
            render_diff(sys.stdout, diff, base_profiles, group, granularity=view.granularity,
                        show_bytes=view.show_bytes, title=title)
        else:
            render_table(sys.stdout, table, rows, granularity=view.granularity,
                         show_bytes=view.show_bytes, title=title)
    if args.format == "json":
        render_json(sys.stdout, reports[0] if len(reports) == 1 else {"reports": reports})
    return 0
