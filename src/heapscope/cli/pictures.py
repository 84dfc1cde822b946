"""The picture commands a report suggests, and writing them on request (``--html``)."""

from __future__ import annotations

import os
import shlex
import sys
from typing import TextIO

from heapscope.errors import HeapscopeError


def commands(target: str, folder: str | None = None) -> list[list[str]]:
    """The commands that draw ``target`` (a session, folder or dump); outputs in ``folder``."""
    where = folder if folder is not None else "."
    out = [
        ["heapscope", "flamegraph", target, "-o", os.path.join(where, "flamegraph.html")],
        ["heapscope", "graph", target, "-o", os.path.join(where, "graph.svg")],
        ["heapscope", "export", target, "--format", "pprof", "-o",
         os.path.join(where, "profile.pb.gz")],
    ]
    if os.path.isfile(os.path.join(target, "manifest.json")):
        out.insert(1, ["heapscope", "timeline", target, "-o",
                       os.path.join(where, "timeline.html")])
    return out


def print_commands(out: TextIO, target: str, folder: str | None = None) -> None:
    """Write the picture commands, one per line."""
    out.write("pictures:\n")
    for argv in commands(target, folder):
        out.write(f"  {shlex.join(argv)}\n")


def write_html(target: str, folder: str) -> list[str]:
    """Write the flame graph (and, for a session, the timeline) into ``folder``."""
    from heapscope.cli.main import parser  # the same commands a user would type

    written = []
    for argv in commands(target, folder):
        out = argv[argv.index("-o") + 1]
        if not out.endswith(".html") or os.path.exists(out):
            continue
        args = parser().parse_args(argv[1:])
        try:
            args.func(args)
            written.append(out)
        except HeapscopeError as e:
            print(f"heapscope: note: {argv[1]} not written: {e}", file=sys.stderr)
    return written
