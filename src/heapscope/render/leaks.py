"""The leak finder's terminal report: processes, then suspects with verdict and evidence."""

from __future__ import annotations

import shlex
from typing import TextIO

from rich.console import Console
from rich.markup import escape

from heapscope.analysis import trend
from heapscope.analysis.leaks import EXPECTED, INHERITED, LEAK, SUPPRESSED, Finding, LeakReport
from heapscope.units import human_bytes

_STYLE = {LEAK: "bold red", trend.BOUNDED: "yellow", trend.CHURN: "cyan",
          trend.STEADY: "dim", EXPECTED: "dim", INHERITED: "dim", SUPPRESSED: "dim"}


def _evidence(f: Finding) -> str:
    t = f.trend
    if t is None:
        if f.verdict == EXPECTED:
            return "allocated by a runtime as it started (expected)"
        if f.verdict == INHERITED:
            return "inherited from the parent process"
        return "live at exit (a single dump: no growth to judge)"
    parts = [f"{'+' if t.rise >= 0 else ''}{human_bytes(t.rise)} over {len(f.series)} dumps"]
    if f.verdict in (LEAK, trend.BOUNDED):
        rate = f"{human_bytes(t.slope_per_dump)}/dump"
        if t.slope_per_s is not None:
            rate += f", {human_bytes(t.slope_per_s)}/s"
        parts.append(rate)
        if t.first_growth:
            parts.append(f"growing since dump {t.first_growth}")
        parts.append(f"fit {t.fit:.2f}")
    if f.verdict == trend.BOUNDED:
        parts.append("flat over the last part")
    parts.append(f"trend z {t.z:.1f} (recent {t.z_recent:.1f})")
    parts.append(f"noise ±{human_bytes(t.noise)}")
    return "; ".join(parts)


def render_leaks(out: TextIO, report: LeakReport, *, top: int = 10, frames: int = 5,
                 color: bool | None = None) -> None:
    """Write the report; colour only on a terminal unless ``color`` says otherwise."""
    con = Console(file=out, highlight=False, soft_wrap=True,
                  force_terminal=color if color is not None else None,
                  no_color=color is False)
    procs = report.processes
    con.print(f"[bold]processes ({len(procs)})[/]")
    for p in procs[:15]:
        cmd = shlex.join(p.cmdline) if p.cmdline else p.exe
        mark = "[bold red]LEAKS[/]" if p.verdict == "leaks" else "clean"
        leaked = f"  leak {human_bytes(p.leak_bytes)}" if p.leak_bytes else ""
        con.print(f"  {p.pid!s:>8}  {p.role:<7}  {mark:<5}  {p.dumps:>3} dump"
                  f"{'s' if p.dumps != 1 else ' '}  live {human_bytes(p.live_bytes)}{leaked}"
                  f"  {escape(cmd[:70])}")
    if len(procs) > 15:
        con.print(f"  … and {len(procs) - 15} more processes")
    shown = [f for f in report.findings if f.verdict not in (trend.STEADY, EXPECTED,
                                                                 INHERITED, SUPPRESSED)]
    if not shown:
        con.print("\nno leaks: no site grew or was left live beyond runtime start-up")
    else:
        con.print("\n[bold]suspects, most likely leak first[/]")
    for n, f in enumerate(shown[:top], 1):
        where = f"  {escape(f.file)}:{f.line}" if f.file else ""
        style = _STYLE.get(f.verdict, "")
        con.print(f" {n:>2}. [{style}]{f.verdict.upper() if f.verdict == LEAK else f.verdict}"
                  f"[/]  {human_bytes(f.bytes)} in {int(f.objects):,} objects  "
                  f"[bold]{escape(f.function)}[/]{where}  (pid {f.pid})")
        con.print(f"       {escape(_evidence(f))}")
        for fr in f.stack[1:frames]:
            con.print(f"         {escape(fr)}")
    hidden = {v: sum(1 for f in report.findings if f.verdict == v)
              for v in (trend.STEADY, EXPECTED, INHERITED, SUPPRESSED)}
    rest = ", ".join(f"{n} {v}" for v, n in hidden.items() if n)
    if rest:
        con.print(f"\nnot shown: {rest} sites (--format json lists them)")
    for note in report.notes:
        con.print(f"note: {escape(note)}")
