"""The picture commands a report suggests for a session, folder or dump."""

from __future__ import annotations

import os
import shlex
from typing import TextIO

from heapscope.terminal import clean


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
        out.write(f"  {clean(shlex.join(argv))}\n")
