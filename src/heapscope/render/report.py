"""The leak report ``heapscope run`` prints at exit (to stderr, beside the program's output)."""

from __future__ import annotations

import os
import shlex
from typing import TextIO

from heapscope.analysis.suspects import LEAK
from heapscope.capture.runner import SessionResult
from heapscope.units import human_bytes


def _cmd(words: list[str], width: int = 60) -> str:
    text = shlex.join(words) if words else "?"
    return text if len(text) <= width else text[: width - 1] + "…"


def render_report(out: TextIO, res: SessionResult, *, top: int = 5, frames: int = 6) -> None:
    """Write the processes, the top suspects with their stacks, and the next commands."""
    r = res.result
    how = f"was killed by signal {r.signal}" if r.signal else f"exited with status {r.returncode}"
    out.write(f"\nheapscope: {_cmd(res.command)} {how} after {r.end - r.start:.1f} s\n")
    out.write(f"session: {res.path}\n")
    for note in res.notes:
        out.write(f"note: {note}\n")
    shown = [p for p in res.processes if p.role != "helper"]
    helpers = [p for p in res.processes if p.role == "helper"]
    if res.processes:
        out.write(f"\nprocesses ({len(res.processes)}):\n")
        out.write(f"  {'pid':>8}  {'role':<8} {'live':>10} {'leak':>10}  command\n")
        for p in shown[:12]:
            mark = "  <- leaks" if p.leaks and p.role != "wrapper" else ""
            live = human_bytes(p.live_bytes) if p.dumps else "no dump"
            out.write(f"  {p.pid:>8}  {p.role:<8} {live:>10} "
                      f"{human_bytes(p.leak_bytes):>10}  {_cmd(p.cmdline or [p.exe])}{mark}\n")
        rest = shown[12:] + helpers
        if rest:
            names = sorted({os.path.basename(p.exe) or "?" for p in rest})
            listed = ", ".join(names[:6]) + (", …" if len(names) > 6 else "")
            out.write(f"  + {len(rest)} more ({listed}) holding "
                      f"{human_bytes(sum(p.leak_bytes for p in rest))} at exit; shells and "
                      "tools are ranked last\n")
    leaks = [s for s in res.suspects if s.verdict == LEAK]
    if leaks:
        out.write("\nlive at exit, most likely leaks first:\n")
        for n, s in enumerate(leaks[:top], 1):
            where = f"  {s.file}:{s.line}" if s.file else ""
            out.write(f"  {n}. {human_bytes(s.bytes)} in {int(s.objects):,} objects  "
                      f"{s.function}{where}  (pid {s.pid})\n")
            for fr in s.stack[1:frames]:
                out.write(f"         {fr}\n")
    else:
        out.write("\nno leak suspects: nothing but runtime start-up allocations was live at "
                  "exit\n")
    expected = [s for s in res.suspects if s.verdict != LEAK]
    if expected:
        out.write(f"expected (runtime start-up): {human_bytes(sum(s.bytes for s in expected))}"
                  f" in {len(expected)} sites\n")
    if res.processes:
        q = shlex.quote(res.path)
        out.write("\nnext:\n")
        out.write(f"  heapscope top --lines {q}\n")
        if leaks:
            fn = leaks[0].function
            out.write(f"  heapscope top --lines --focus {shlex.quote(_regex(fn))} {q}\n")
        out.write(f"  report: {shlex.quote(res.path + '/report.json')}\n")


def _regex(name: str) -> str:
    special = set(".^$*+?{}[]\\|()")
    return "".join("\\" + c if c in special else c for c in name)
