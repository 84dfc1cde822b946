"""The report ``heapscope run`` prints at exit (to stderr, beside the program's output)."""

from __future__ import annotations

import re
import shlex
from typing import TextIO

from heapscope.analysis.leaks import GROWING, LEAK, LIVE
from heapscope.capture.runner import SessionResult
from heapscope.render.commands import print_commands
from heapscope.render.leaks import render_leaks
from heapscope.terminal import clean
from heapscope.units import shorten_command


def _cmd(words: list[str], width: int = 60) -> str:
    return clean(shorten_command(words, width)) if words else "?"


def render_report(out: TextIO, res: SessionResult, *, top: int = 5) -> None:
    """Write how the program ended, the leak report, and the next commands."""
    r = res.result
    how = f"was killed by signal {r.signal}" if r.signal else f"exited with status {r.returncode}"
    out.write(f"\nheapscope: {_cmd(res.command)} {how} after {r.end - r.start:.1f} s\n")
    out.write(f"session: {clean(res.path)}\n")
    for note in res.notes:  # notes name programs and paths
        out.write(f"note: {clean(note)}\n")
    if res.leaks.processes:
        out.write("\n")
        render_leaks(out, res.leaks, top=top)
    q = clean(shlex.quote(res.path))
    out.write("\nnext:\n")
    out.write(f"  heapscope top --lines {q}\n")
    named = [f for f in res.leaks.findings if f.verdict in (LEAK, GROWING, LIVE)]
    if named:
        fn = named[0].function
        # A name with control characters is printed escaped (never raw on a terminal).
        out.write(f"  heapscope top --lines --focus {shlex.quote(re.escape(clean(fn)))} {q}\n")
    out.write(f"  heapscope leaks {q}\n")
    out.write(f"  report: {clean(shlex.quote(res.path + '/report.json'))}\n")
    print_commands(out, res.path, res.path)
