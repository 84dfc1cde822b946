"""The leak finder's terminal report: processes, then the sites found (suspects when any was
judged a leak or growing) with verdict and evidence.

Every sentence is derived from the numbers it sits beside: the summary counts the verdicts
shown, and each suspect's evidence line states the growth, the rate with its interval, the
test statistic and p-value, and how many samples stand behind them.
"""

from __future__ import annotations

import os
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape

from heapscope.analysis import trend
from heapscope.analysis.leaks import (
    EXPECTED,
    GROWING,
    INHERITED,
    LEAK,
    LIVE,
    QUIET,
    SUPPRESSED,
    Finding,
    LeakReport,
    ProcessFinding,
)
from heapscope.analysis.processes import QUIET_ROLES
from heapscope.render.text import via_label
from heapscope.terminal import clean
from heapscope.units import human_bytes, plural, shorten_command

CMD_WIDTH = 70  # a process line's command: the program and the arguments that fit, then …
HELPERS_LISTED = 3  # wrappers and helpers listed one per line; more get one line together


def _t(text: str) -> str:
    """Untrusted text for the console: control characters escaped, then rich markup."""
    return escape(clean(text))


_STYLE = {LEAK: "bold red", GROWING: "magenta", trend.BOUNDED: "yellow", trend.CHURN: "cyan",
          LIVE: "bold", trend.STEADY: "dim", EXPECTED: "dim", INHERITED: "dim",
          SUPPRESSED: "dim"}
_PROCESS = {"leaks": "[bold red]LEAKS[/]", "undecided": "[magenta]undecided[/]",
            "clean": "clean", "grew, bounded": "[yellow]grew, bounded[/]",
            "unjudged": "one dump", "no dumps": "no dumps",
            "unreadable": "[bold red]UNREADABLE[/]"}


def _signed(value: float) -> str:
    return ("+" if value >= 0 else "") + human_bytes(value)


def _p(p: float) -> str:
    return "p < 1e-6" if p < 1e-6 else f"p {p:.2g}"


def _rate(t: trend.Trend) -> str:
    rate = (f"{_signed(t.slope_per_dump)}/dump (95%: {_signed(t.slope_low)} to "
            f"{_signed(t.slope_high)})")
    if t.slope_per_s is not None:
        rate += f", {_signed(t.slope_per_s)}/s"
    return rate


def evidence(f: Finding, window: dict[str, Any] | None = None) -> str:
    """One line saying why ``f`` got its verdict, in the numbers the verdict rests on."""
    t = f.trend
    if t is None:
        if f.verdict == EXPECTED:
            return "allocated by a runtime as it started (expected)"
        if f.verdict == INHERITED:
            return "inherited from the parent process"
        if f.verdict == SUPPRESSED:
            return f"suppressed by {f.suppressed_by}"
        if window is not None:
            return (f"allocated during the {window['seconds']:g} s window, still live "
                    f"{window['settle']:g} s after it")
        return "live in the only dump: one dump cannot show growth"
    since = f" since dump {t.first_growth}" if t.first_growth else ""
    grew = f"{_signed(t.growth)} over {plural(t.dumps, 'dump')}"
    drift = f"drift z {t.z:.1f}, {_p(t.p_value)}"
    if t.q_value is not None and t.verdict in (LEAK, GROWING):
        drift += f", q {t.q_value:.2g}"
    span = t.dumps - t.window_start
    last = f"the last {plural(span, 'dump')}"
    samples = f"{plural(round(t.samples), 'sample')} ({t.new_samples:+,.0f} over {last})"
    if t.exact:
        # objects near or above the sample period: the dumps (all but) count them
        what = (plural(round(t.samples), "object") +
                ", counted exactly (every one this big is sampled)"
                if t.sampled >= 0.99 else
                plural(round(t.samples), "sample") + f" of big objects ({t.sampled:.0%} of "
                "them sampled: little counting noise)")
        samples = f"{what}; {t.steps} of {last} brought new ones"
    elif t.whole_series:
        samples += ", tested as the line through every dump against its scatter"
    if t.verdict in (LEAK, GROWING) and t.slope_per_dump > 0 and \
            t.slope_high - t.slope_low > t.slope_per_dump:
        samples += "; thin evidence: the rate is known only roughly"
    if t.verdict == LEAK:
        parts = [grew + since, _rate(t), drift, samples]
    elif t.verdict == GROWING:
        more = (f"take about {plural(t.more_dumps, 'more dump')} to decide" if t.more_dumps
                else "more dumps will decide")
        parts = [grew + since, _rate(t), drift + ": not yet a proven leak", samples, more]
    elif t.verdict == trend.BOUNDED:
        parts = [grew + since, f"rise z {t.rise_z:.1f}",
                 "flat over the last third: growth stopped (a cache that filled?)"]
    elif t.verdict == trend.CHURN:
        lo, hi = min(f.series[:t.dumps]), max(f.series[:t.dumps])
        parts = [f"moves between {human_bytes(lo)} and {human_bytes(hi)}",
                 grew + " (within its swings: no lasting rise shown)"]
    else:
        parts = [grew, "no significant change"]
    if f.at_exit is not None:
        parts.append(f"{human_bytes(f.at_exit)} left at exit")
    if f.suppressed_by:
        parts.append(f"suppressed by {f.suppressed_by}")
    return "; ".join(parts)


def _process_line(p: ProcessFinding, window: bool = False) -> str:
    cmd = shorten_command(p.cmdline, CMD_WIDTH) if p.cmdline else p.exe
    mark = "window" if window and p.verdict == "unjudged" else _PROCESS.get(p.verdict, p.verdict)
    if p.exit_bytes is not None:
        dumps = f"{plural(p.judged, 'dump')} + exit"
    elif p.judged and p.judged != p.dumps:
        dumps = f"{plural(p.dumps, 'dump')}, {p.judged} judged"
    else:
        dumps = plural(p.dumps, "dump")
    if p.missed:
        dumps += f" ({p.missed} missed)"
    extra = ""
    if p.leak_bytes:
        extra += f"  leak {human_bytes(p.leak_bytes)}"
    if p.growing_bytes and p.verdict != "leaks":
        extra += f"  growing {human_bytes(p.growing_bytes)}"
    if p.bounded_bytes and p.verdict == "grew, bounded":
        extra += f"  bounded growth {human_bytes(p.bounded_bytes)}"
    if p.exit_bytes is not None:
        extra += f"  at exit {human_bytes(p.exit_bytes)}"
    line = (f"  {p.pid!s:>8}  {p.role:<7}  {mark:<9}  {dumps:<15}  "
            f"live {human_bytes(p.live_bytes)}{extra}  {_t(cmd)}")
    if p.unreadable:
        line += f"\n            no dump could be read: {_t(p.unreadable)}"
    return line


def _helpers_line(helpers: list[ProcessFinding]) -> str:
    """One line for the wrappers and helpers not listed: how many, their dumps, the
    programs they ran (most frequent first)."""
    names: dict[str, int] = {}
    for p in helpers:
        name = os.path.basename(p.exe) or "?"
        names[name] = names.get(name, 0) + 1
    ranked = sorted(names.items(), key=lambda kv: (-kv[1], kv[0]))
    ran = ", ".join(f"{_t(n)} ×{k}" if k > 1 else _t(n) for n, k in ranked[:4])
    if len(ranked) > 4:
        ran += ", …"
    low, high = min(p.dumps for p in helpers), max(p.dumps for p in helpers)
    dumps = (f"{plural(low, 'dump')} each" if low == high
             else f"{low}-{high} dumps each")
    what = plural(len(helpers), "wrapper or helper", "wrappers and helpers")
    return f"  + {what} ({ran}), {dumps}, not judged as the program: --format json lists them"


def _summary(report: LeakReport, shown: list[Finding]) -> str:
    counts: dict[str, int] = {}
    for f in shown:
        counts[f.verdict] = counts.get(f.verdict, 0) + 1
    missing = report.unexamined
    gap = ""
    if missing:
        # Never "no leak found" over a process nobody looked at.
        named = ", ".join(f"pid {p.pid}" + (f" ({p.why_no_dumps})" if p.why_no_dumps else "")
                          for p in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        they = "it" if len(missing) == 1 else "they"
        gap = (f"{len(missing)} of {plural(len(report.processes), 'process')} not examined, "
               f"{they} left no dump: {_t(named)}{more}")
    if counts.get(LEAK):
        return gap
    if report.window is not None:
        return (f"the window kept {plural(counts.get(LIVE, 0), 'site')}: allocated during it and "
                "still live after it, biggest first")
    parts = ["no leak found"]
    if missing:
        examined = len(report.processes) - len(missing)
        parts = [gap, f"no leak found in the {examined} examined" if examined else
                 "nothing was examined"]
    if counts.get(GROWING):
        parts.append(f"{plural(counts[GROWING], 'site')} grew without proof of a leak (growing)")
    if counts.get(trend.BOUNDED):
        parts.append(f"{counts[trend.BOUNDED]} grew, then levelled off (bounded)")
    if counts.get(LIVE):
        parts.append(f"{counts[LIVE]} live in a single dump (growth unknown)")
    if not shown and not missing:
        parts.append("no site grew, and nothing beyond runtime start-up was left live")
    return "; ".join(parts)


_KINDS = {trend.BOUNDED: "bounded growth", trend.CHURN: "churn", LIVE: "live"}


def _heading(report: LeakReport, shown: list[Finding]) -> str:
    """What the listed sites are: suspects only when some site was judged leak or growing;
    otherwise the sites that are left, never called suspects."""
    verdicts = {f.verdict for f in shown}
    if verdicts & {LEAK, GROWING}:
        return "suspects, most likely leak first"
    if report.window is not None:
        return "sites the window kept, largest first"
    found = ("no leak found in the examined processes" if report.unexamined
             else "no leak found")
    if verdicts <= {LIVE}:
        return f"largest live sites ({found})"
    kinds = [name for v, name in _KINDS.items() if v in verdicts]
    kinds += sorted(v for v in verdicts if v not in _KINDS)
    return f"sites that changed or stayed live ({found}): {', then '.join(kinds)}"


def render_leaks(out: TextIO, report: LeakReport, *, top: int = 10, frames: int = 5,
                 color: bool | None = None) -> None:
    """Write the report; colour only on a terminal unless ``color`` says otherwise."""
    con = Console(file=out, highlight=False, soft_wrap=True,
                  force_terminal=color if color is not None else None,
                  no_color=color is False)
    procs = report.processes
    helpers = sum(1 for p in procs if p.role in QUIET_ROLES)
    if helpers and helpers < len(procs):
        # The count that matters is the program's own; shims' shells and tools come last.
        helping = plural(helpers, "wrapper or helper", "wrappers and helpers")
        con.print(f"[bold]processes ({len(procs) - helpers} of the program, {helping} "
                  "listed last)[/]")
    else:
        con.print(f"[bold]processes ({len(procs)})[/]")
    listed = procs
    if 0 < helpers < len(procs) and helpers > HELPERS_LISTED:
        # A shim's dozens of shells would push the program's lines off the screen: they
        # get one line, except one whose dumps could not be read (never passed over).
        listed = [p for p in procs if p.role not in QUIET_ROLES or p.unreadable]
    for p in listed[:15]:
        con.print(_process_line(p, report.window is not None))
    if len(listed) > 15:
        con.print(f"  … and {plural(len(listed) - 15, 'more process')}")
    if listed is not procs:
        con.print(_helpers_line([p for p in procs if p not in listed]))
    shown = [f for f in report.findings if f.verdict not in QUIET]
    summary = _summary(report, shown)
    if summary:
        con.print(f"\n{summary}")
    if shown:
        con.print(f"\n[bold]{_heading(report, shown)}[/]")
    for n, f in enumerate(shown[:top], 1):
        where = f"  {_t(f.file)}:{f.line}" if f.file else ""
        style = _STYLE.get(f.verdict, "")
        label = f.verdict.upper() if f.verdict == LEAK else f.verdict
        size = (f"{human_bytes(f.bytes)} in {plural(f.objects, 'object')}" if not f.rollup
                else f"{human_bytes(f.bytes)} over {plural(f.sites, 'call path')} "
                     f"({f.rollup} roll-up)")
        via = _t(via_label(f.via))
        con.print(f" {n:>2}. [{style}]{label}[/]  {size}  "
                  f"[bold]{_t(f.function)}[/]{where}{via}  (pid {f.pid})")
        con.print(f"       {_t(evidence(f, report.window))}")
        for fr in f.stack[1:frames]:
            con.print(f"         {_t(fr)}")
    if len(shown) > top:
        con.print(f"  … {len(shown) - top} more (--top N, or --format json)")
    hidden = {v: sum(1 for f in report.findings if f.verdict == v) for v in QUIET}
    rest = ", ".join(plural(n, f"{v} site") for v, n in hidden.items() if n)
    if rest:
        con.print(f"\nnot shown: {rest} (--format json lists them)")
    for note in report.notes:
        con.print(f"note: {_t(note)}")
