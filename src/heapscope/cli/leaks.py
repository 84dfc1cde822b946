"""``heapscope leaks PATH…``: verdicts per allocation site over a series of dumps."""

from __future__ import annotations

import argparse
import os
import sys

from heapscope.analysis.filter import compile_re
from heapscope.analysis.series import group_by_pid
from heapscope.analysis.suppress import read_file
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_focus_options,
    add_frame_options,
    add_input_options,
    add_output_options,
    add_symbol_options,
    add_top_option,
    find_dumps,
    frame_policy,
    print_diagnostics,
    symbol_options,
)
from heapscope.cli.gates import add_gate_options, gate, thresholds
from heapscope.cli.pictures import write_html
from heapscope.errors import UsageError
from heapscope.inputs import judge, left_out_note
from heapscope.progress import DelayedProgress
from heapscope.render.commands import print_commands
from heapscope.render.json import render_json
from heapscope.render.leaks import render_leaks
from heapscope.terminal import clean


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``leaks`` subcommand."""
    p = sub.add_parser(
        "leaks", help=summary("leaks"),
        description="Judge every allocation site of every process over a series of dumps "
                    "(a session, a folder of dumps, or dump files): leak, growing, bounded, "
                    "churn or steady, with the evidence; a single dump lists what is live.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="session, folder or dump files")
    p.add_argument("--format", choices=("text", "json"), default="text",
                       help="text for people (default), json for programs")
    p.add_argument("--suppressions", action="append", default=[], metavar="FILE",
                   help="LeakSanitizer-style file of leak:PATTERN lines (repeatable)")
    add_gate_options(p, "total")
    add_top_option(p, 10, "suspects")
    add_focus_options(p)
    add_output_options(p, "DIR", "also write the pictures of the report (flamegraph.html, "
                                 "and timeline.html for a session) in DIR", required=False)
    # The earlier name of -o here.
    p.add_argument("--html", dest="output", metavar="DIR", help=argparse.SUPPRESS)
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope leaks``."""
    leak_limit, live_limit = thresholds(args, args.paths)
    if not args.paths:
        raise UsageError("no session, folder or dump given: heapscope leaks PATH…")
    rules = [r for f in args.suppressions for r in read_file(f)]
    if args.focus:
        compile_re(args.focus, "--focus")  # a bad pattern fails before any dump is read
    if args.ignore:
        compile_re(args.ignore, "--ignore")
    dumps = find_dumps(args, args.paths)
    opts = symbol_options(args, args.paths)
    # counted in dumps across processes (with a rate and an ETA), not in processes
    with DelayedProgress(dumps=group_by_pid(dumps)) as bar:
        series, report = judge(args.paths, dumps, opts, frame_policy(args),
                               suppressions=rules, progress=bar.update, focus=args.focus,
                               ignore=args.ignore)
    # Once for every process: one dpkg query for the hints, and none in JSON output.
    print_diagnostics(tuple(d for s in series for d in s.diagnostics), args.verbose,
                      hints=args.format != "json")
    left_out = getattr(args, "ignored_dumps", [])
    if left_out:
        report.notes.append(left_out_note(left_out))
    if args.verbose and report.wrappers.describe():
        print(f"heapscope: {clean(report.wrappers.describe())}", file=sys.stderr)
    if args.format == "json":
        render_json(sys.stdout, report.as_dict())
    else:
        render_leaks(sys.stdout, report, top=args.top)
        if len(args.paths) == 1:
            sys.stdout.write("\n")
            print_commands(sys.stdout, args.paths[0], args.output)
    if args.output and len(args.paths) == 1:
        os.makedirs(args.output, exist_ok=True)
        write_html(args.paths[0], args.output, force=args.force)
    return gate(report, leak_limit, live_limit)
