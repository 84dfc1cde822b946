"""``heapscope leaks PATH…``: verdicts per allocation site over a series of dumps."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from heapscope.analysis.leaks import find_leaks
from heapscope.analysis.series import group_by_pid, load_series, unreadable_series
from heapscope.analysis.suppress import read_file
from heapscope.capture.session import read_manifest, unfinished
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_frame_options,
    add_input_options,
    add_symbol_options,
    find_dumps,
    frame_policy,
    print_diagnostics,
    session_aliases,
    symbol_options,
)
from heapscope.cli.gates import add_gate_options, gate, thresholds
from heapscope.cli.pictures import write_html
from heapscope.errors import InputError, UsageError
from heapscope.prepare import is_session
from heapscope.progress import DelayedProgress
from heapscope.render.commands import print_commands
from heapscope.render.leaks import render_leaks


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``leaks`` subcommand."""
    p = sub.add_parser(
        "leaks", help=summary("leaks"),
        description="Judge every allocation site of every process over a series of dumps "
                    "(a session, a folder of dumps, or dump files): leak, growing, bounded, "
                    "churn or steady, with the evidence; a single dump lists what is live.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="session, folder or dump files")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--suppressions", action="append", default=[], metavar="FILE",
                   help="LeakSanitizer-style file of leak:PATTERN lines (repeatable)")
    add_gate_options(p, "total")
    p.add_argument("--top", type=int, default=10, metavar="N", help="suspects to print")
    p.add_argument("--html", metavar="DIR",
                   help="also write flamegraph.html (and timeline.html for a session) in DIR")
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def _session_info(paths: list[str]) -> tuple[dict[int, dict[str, Any]], int | None,
                                              list[str]]:
    info: dict[int, dict[str, Any]] = {}
    root = None
    notes = []
    for path in paths:
        if os.path.isdir(path) and is_session(path):
            m = read_manifest(path)
            root = m.get("pid", root)
            for proc in m.get("processes", []):
                if isinstance(proc, dict) and isinstance(proc.get("pid"), int):
                    info[proc["pid"]] = proc
            note = unfinished(m)
            if note:
                notes.append(note)
    return info, root, notes


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope leaks``."""
    leak_limit, live_limit = thresholds(args, args.paths)
    if not args.paths:
        raise UsageError("no session, folder or dump given: heapscope leaks PATH…")
    rules = [r for f in args.suppressions for r in read_file(f)]
    dumps = find_dumps(args, args.paths)
    info, root, session_notes = _session_info(args.paths)
    opts = symbol_options(args, args.paths)
    frames = frame_policy(args)
    with DelayedProgress() as bar:
        aliases = session_aliases(args.paths)
        groups = group_by_pid(dumps)
        series = []
        for pid, paths in groups.items():
            try:
                series.append(load_series(pid, paths, opts, bar.update, aliases=aliases,
                                          frames=frames))
            except InputError as e:
                if len(groups) == 1:
                    raise  # the one thing asked for cannot be read: say so and stop
                series.append(unreadable_series(pid, [str(e)]))
    for s in series:
        print_diagnostics(tuple(s.diagnostics), args.verbose)
    report = find_leaks(series, info=info, root=root, suppressions=rules)
    report.notes[:0] = session_notes
    left_out = getattr(args, "ignored_dumps", [])
    if left_out:
        report.notes.append(f"{len(left_out)} file(s) were left out of a folder other users "
                            f"can write to, e.g. {left_out[0].path}: {left_out[0].reason}")
    if args.verbose and report.wrappers.describe():
        print(f"heapscope: {report.wrappers.describe()}", file=sys.stderr)
    if args.format == "json":
        json.dump(report.as_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        render_leaks(sys.stdout, report, top=args.top)
        if len(args.paths) == 1:
            sys.stdout.write("\n")
            print_commands(sys.stdout, args.paths[0], args.html)
    if args.html and len(args.paths) == 1:
        os.makedirs(args.html, exist_ok=True)
        for path in write_html(args.paths[0], args.html):
            print(f"heapscope: wrote {path}", file=sys.stderr)
    return gate(report, leak_limit, live_limit)
