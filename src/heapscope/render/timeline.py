"""Memory over time for a session: RSS, the heap the dumps account for, the top suspects.

Three kinds of lines, x in seconds since the session started, on panels that share the
time axis, each scaled to its own maximum (a heap of a few MiB stays visible beside an RSS
of a few GiB):

- ``rss`` (upper panel): each process's resident set size, from ``rss.csv``;
- ``heap`` (lower panel): each process's live heap estimated from each dump (unsampled
  in-use bytes, all sites), at the dump's modification time: the gap to RSS is what
  jemalloc's heap does not explain (fragmentation, retained pages, non-malloc memory);
- ``suspect`` (lower panel): the live bytes of the top sites of
  :func:`heapscope.analysis.leaks.find_leaks` per dump, so one sees which line grows.

A server with a pool of workers has tens of processes: a few are drawn one by one (those
with a growing site first, then the largest heap growth, then the largest RSS) and the others
are added up into one line per kind, each on a panel of its own below (their sum would dwarf
any one process), so the legend stays a few entries long.

The chart is an SVG drawn here (no plotting library); the HTML page inlines it (with a
switch that also shows the added-up processes one by one), and a PNG is made from it with
``rsvg-convert`` (Debian ``librsvg2-bin``) or headless Chromium.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from heapscope.analysis.leaks import Finding, LeakReport, find_leaks
from heapscope.analysis.ownership import (
    ProcessFacts,
    exe_aliases,
    facts_from_manifest,
    fill_images,
)
from heapscope.analysis.series import ProcessSeries, group_by_pid, load_series
from heapscope.analysis.sitefilter import select_sites
from heapscope.analysis.trend import GROWING, LEAK
from heapscope.capture.session import read_manifest
from heapscope.errors import HeapscopeError, InputError
from heapscope.files import open_regular
from heapscope.formats.symbolized import SUFFIX
from heapscope.inputs import session_title
from heapscope.prepare import expand_inputs, is_session
from heapscope.symbols import Diagnostic, SymbolOptions
from heapscope.units import human_bytes, shorten_command
from heapscope.web import markup, page

ProgressFn = Callable[[str, int, int], None]

RSS = "rss"
HEAP = "heap"
SUSPECT = "suspect"
# Flat lines say nothing; helper sites (a wrapper script's shell) are not the program's.
_QUIET = {"expected", "suppressed", "inherited", "steady", "helper"}
# Processes drawn one by one: with more, the first SHOWN - 1 are, and the rest are added up.
SHOWN = 6
# Legend entries at most: one per process drawn, one for the added-up ones, one per suspect.
LEGEND = 10


@dataclass
class Line:
    """One series on the chart: ``points`` are (seconds since start, bytes)."""

    label: str
    kind: str
    pid: int | None
    points: list[tuple[float, float]]
    detail: str = ""
    dumps: list[str] = field(default_factory=list)  # the dump of each point (heap, suspect)
    process: str = ""  # the process as a user knows it (title, pid, role)
    hidden: bool = False  # added up into a line of Timeline.sums, not drawn by itself
    members: list[int] = field(default_factory=list)  # a sum: the pids it adds up


@dataclass
class Timeline:
    """Everything the chart shows, plus the suspects' evidence for the table.

    ``lines`` holds every process's own lines (``hidden`` for those added up) and the
    suspects'; ``sums`` the lines adding up the hidden processes, one per kind.
    """

    title: str
    lines: list[Line]
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)
    sums: list[Line] = field(default_factory=list)
    subtitle: str = ""

    def drawn(self, *, hidden: bool = False) -> list[Line]:
        """The lines the picture draws, in drawing order (sums before suspects, so the
        suspects stay on top); the hidden processes' too when ``hidden``."""
        own = [ln for ln in self.lines if ln.kind != SUSPECT and (hidden or not ln.hidden)]
        return [*own, *self.sums, *(ln for ln in self.lines if ln.kind == SUSPECT)]


def read_rss(path: str) -> dict[int, list[tuple[float, float]]]:
    """``rss.csv`` as points per pid ({} when absent or not a regular file); malformed rows
    are skipped."""
    out: dict[int, list[tuple[float, float]]] = {}
    try:
        # Only a regular file: reading a FIFO named rss.csv would wait for a writer forever.
        with io.TextIOWrapper(open_regular(path), encoding="utf-8", errors="replace",
                              newline="") as f:
            for row in csv.DictReader(f):
                try:
                    t, pid, rss = float(row["t_seconds"]), int(row["pid"]), float(row["rss_bytes"])
                except (KeyError, TypeError, ValueError):
                    continue
                out.setdefault(pid, []).append((t, rss))
    except OSError:
        return {}
    except csv.Error:
        pass  # a damaged row (a field past csv's size limit): the rows before it are kept
    for pts in out.values():
        pts.sort()
    return out


def _dump_mtime(path: str) -> float | None:
    """When jemalloc wrote a dump: for a session's symbolized copy, the raw dump's mtime."""
    candidates = [path]
    if path.endswith(SUFFIX):
        folder = os.path.dirname(os.path.dirname(path))
        raw = os.path.join(folder, "dumps", os.path.basename(path)[: -len(SUFFIX)])
        candidates.insert(0, raw)
    for c in candidates:
        try:
            return os.stat(c).st_mtime
        except OSError:
            continue
    return None


def collect_timeline(session: str, options: SymbolOptions, *, top: int = 5,
                     progress: ProgressFn | None = None, focus: str | None = None,
                     ignore: str | None = None) -> Timeline:
    """Read a session (or a folder of dumps) into the lines of the chart. ``focus`` and
    ``ignore`` (``--focus``/``--ignore``) choose the sites the suspects are drawn from; the
    heap and RSS lines stay the processes' whole memory."""
    if not os.path.isdir(session):
        raise InputError(session, "not a folder: give a session written by heapscope run")
    manifest = read_manifest(session) if is_session(session) else {}
    dumps = expand_inputs([session])
    all_series: list[ProcessSeries] = []
    aliases = exe_aliases(facts_from_manifest(manifest))
    for pid, paths in group_by_pid(dumps).items():
        all_series.append(load_series(pid, paths, options, progress, aliases=aliases))
    info = {p["pid"]: p for p in manifest.get("processes", [])
            if isinstance(p, dict) and isinstance(p.get("pid"), int)}
    report = find_leaks([select_sites(s, focus, ignore) for s in all_series], info=info,
                        root=manifest.get("pid"))
    return timeline_of(session, manifest, all_series, report, top=top)


def timeline_of(session: str, manifest: dict[str, Any], all_series: list[ProcessSeries],
                report: LeakReport, *, top: int = 5) -> Timeline:
    """The lines of the chart from a session's series and the leak report on them."""
    info = {p["pid"]: p for p in manifest.get("processes", [])
            if isinstance(p, dict) and isinstance(p.get("pid"), int)}
    facts = fill_images(facts_from_manifest(manifest),
                        (s.profile for s in all_series if s.profile is not None))
    times = {id(s): [_dump_mtime(p) for p in s.paths] for s in all_series}
    start = manifest.get("start_time")
    if not isinstance(start, (int, float)):
        known = [t for ts in times.values() for t in ts if t is not None]
        start = min(known) if known else 0.0
    notes: list[str] = []
    lines: list[Line] = []
    rss_path = os.path.join(session, "rss.csv")
    rss = read_rss(rss_path)
    for pid in sorted(rss):
        lines.append(Line(f"RSS {_who(facts, pid)}", RSS, pid, rss[pid], _exe(info, pid),
                          process=_who(facts, pid)))
    if not rss and os.path.exists(rss_path) and not os.path.isfile(rss_path):
        notes.append("rss.csv is not a regular file: RSS is not shown")
    elif not rss:
        notes.append("no rss.csv in this folder: RSS is not shown")
    by_pid: dict[int | None, tuple[ProcessSeries, list[float | None]]] = {}
    # Beside processes with a series, one dump is a dot, not a line: those are counted.
    many = any(len(s.paths) > 1 for s in all_series)
    single = 0
    last_t = 0.0
    for s in sorted(all_series, key=lambda s: s.pid or 0):
        ts = times[id(s)]
        by_pid[s.pid] = (s, ts)
        kept = [(t - start, total, path) for t, total, path
                in zip(ts, s.totals, s.paths, strict=False) if t is not None]
        pts = [(t, total) for t, total, _ in kept]
        last_t = max([last_t, *(t for t, _ in pts)])
        if len(pts) == 1 and many:
            single += 1
        elif pts:
            lines.append(Line(f"heap {_who(facts, s.pid)}", HEAP, s.pid, pts,
                              f"{len(pts)} dump{'s' if len(pts) != 1 else ''}",
                              [path for _, _, path in kept], process=_who(facts, s.pid)))
    if single:
        notes.append(f"{single} process{'es' if single > 1 else ''} with one dump "
                     f"{'are' if single > 1 else 'is'} not drawn (heapscope leaks lists "
                     f"{'them' if single > 1 else 'it'})")
    ranked = _ranked(lines, report.findings)
    rank = {pid: k for k, pid in enumerate(ranked)}
    lines.sort(key=lambda ln: (ln.kind != RSS, rank.get(ln.pid, len(rank))))
    sums = _add_up(lines, ranked)
    # The legend holds a line per process drawn and per suspect: past LEGEND, suspects give way.
    entries = len({ln.pid for ln in lines if not ln.hidden}) + (1 if sums else 0)
    room = max(min(top, LEGEND - entries), min(top, 1))
    chosen = [f for f in report.findings if f.verdict not in _QUIET
              and not (many and f.pid in by_pid and len(by_pid[f.pid][0].paths) == 1)]
    if len(chosen[:top]) > room:
        more = len(chosen[:top]) - room
        notes.append(f"{more} more suspect{'s' if more > 1 else ''} not drawn, to keep the "
                     f"legend short (heapscope leaks lists {'them' if more > 1 else 'it'})")
    chosen = chosen[:room]
    for f in chosen:
        entry = by_pid.get(f.pid)
        if entry is None:
            continue
        s, ts = entry
        values = f.series or [f.bytes]
        ts_used = ts if f.series else ts[-1:]
        paths = s.paths if f.series else s.paths[-1:]
        kept_s = [(t - start, v, path) for t, v, path in zip(ts_used, values, paths,
                                                              strict=False) if t is not None]
        where = f"{f.file}:{f.line}" if f.file else f.module
        lines.append(Line(f"{f.function} ({f.verdict}, pid {f.pid})", SUSPECT, f.pid,
                          [(t, v) for t, v, _ in kept_s], where,
                          [path for _, _, path in kept_s], process=_who(facts, f.pid)))
    end = manifest.get("end_time")
    span = end - start if isinstance(end, (int, float)) and end >= start else last_t
    title = session_title(manifest, processes=len(set(rss) | {s.pid for s in all_series}),
                          dumps=sum(len(s.paths) for s in all_series), seconds=span,
                          fallback=os.path.basename(os.path.abspath(session)))
    cmd = manifest.get("command")
    subtitle = os.path.basename(os.path.abspath(session))
    if isinstance(cmd, list) and cmd:
        subtitle += ": " + shorten_command([str(c) for c in cmd], 200)
    diags = [d for s in all_series for d in s.diagnostics]
    return Timeline(title, lines, chosen, notes + report.notes, diags, sums, subtitle)


def _ranked(lines: Sequence[Line], findings: Sequence[Finding]) -> list[int | None]:
    """The processes of ``lines``, the one most worth a look first: those with a site judged
    leak or growing, then by the growth of their heap, then by their largest RSS."""
    growing = {f.pid for f in findings if f.verdict in (LEAK, GROWING)}
    growth: dict[int | None, float] = {}
    peak: dict[int | None, float] = {}
    for ln in lines:
        if ln.kind == HEAP and ln.points:
            growth[ln.pid] = ln.points[-1][1] - ln.points[0][1]
        elif ln.kind == RSS and ln.points:
            peak[ln.pid] = max(v for _, v in ln.points)
    pids = dict.fromkeys(ln.pid for ln in lines if ln.kind in (RSS, HEAP))
    return sorted(pids, key=lambda p: (p not in growing, -max(growth.get(p, 0.0), 0.0),
                                       -peak.get(p, 0.0), p if p is not None else -1))


def _add_up(lines: list[Line], ranked: list[int | None]) -> list[Line]:
    """Past SHOWN processes, mark all but the first SHOWN - 1 of ``ranked`` hidden and return
    the lines adding them up (one per kind); [] when every process is drawn."""
    if len(ranked) <= SHOWN:
        return []
    others = {p for p in ranked[SHOWN - 1:] if p is not None}
    n = len(ranked) - (SHOWN - 1)
    label = f"{n} other process{'es' if n != 1 else ''} (sum)"
    out = []
    for kind in (RSS, HEAP):
        members = [ln for ln in lines if ln.kind == kind and ln.pid in others]
        for ln in members:
            ln.hidden = True
        if members:
            out.append(Line(f"{kind if kind == HEAP else 'RSS'} {label}", kind, None,
                            sum_points([ln.points for ln in members], hold=kind == HEAP),
                            f"{len(members)} process{'es' if len(members) != 1 else ''}",
                            process=label, members=sorted(ln.pid or 0 for ln in members)))
    return out


def sum_points(series: Sequence[Sequence[tuple[float, float]]], *, hold: bool
               ) -> list[tuple[float, float]]:
    """Several processes' points added up at every time any of them has a point.

    A process adds nothing before its first point. After its last it adds nothing either
    (RSS: sampled until it exited), unless ``hold`` (heap: each process dumps at its own
    moments, so its last dump stands until the end).
    """
    times = sorted({t for pts in series for t, _ in pts})
    total = [0.0] * len(times)
    for pts in series:
        if not pts:
            continue
        k = 0
        for i, t in enumerate(times):
            if t < pts[0][0] or (not hold and t > pts[-1][0]):
                continue
            while k + 1 < len(pts) and pts[k + 1][0] <= t:
                k += 1
            total[i] += pts[k][1]
    return list(zip(times, total, strict=True))


def _who(facts: dict[int, ProcessFacts], pid: int | None) -> str:
    """A process as a user knows it: its title (servers retitle theirs) and pid."""
    f = facts.get(pid) if pid is not None else None
    if f is None:
        return f"pid {pid}"
    title = f.title if len(f.title) <= 40 else f.title[:39] + "\u2026"
    role = f", {f.role}" if f.role else ""
    return f"{title} [pid {pid}{role}]"


def _exe(info: dict[int, dict[str, object]], pid: int) -> str:
    meta = info.get(pid, {})
    exe = meta.get("exe") if isinstance(meta, dict) else ""
    return str(exe or "")


# ------------------------------------------------------------------------------ drawing

# One colour per process drawn (its RSS and heap lines share it); the added-up processes grey.
_PROCESS_COLORS = ("#1f4e9c", "#2ca02c", "#0d7d8a", "#7b4fb3", "#8c6d31", "#4a7fd0")
# The added-up processes have panels of their own: their sum would dwarf any one process.
_SUM_RSS, _SUM_HEAP = "sum-rss", "sum-heap"
_SUM_COLOR = "#5f5f5f"
_MEMBER_COLOR = "#b4b4b4"
_HEAP_DASH = "6 4"
_SUSPECT_COLORS = ("#d62728", "#ff7f0e", "#e377c2", "#bcbd22", "#9467bd", "#8c564b",
                   "#17becf", "#7f7f7f")
# Each panel: what it holds, its caption, its height as a share of a full panel's.
_PANELS = ((RSS, "RSS per process (resident set size, from rss.csv)", 1.0),
           (HEAP, "live heap per process, estimated from each dump (dashed), and the top "
                  "suspects' live bytes (dots)", 1.0),
           (_SUM_RSS, "{}: RSS added up", 0.6),
           (_SUM_HEAP, "{}: live heap added up", 0.6))


def _nice_step(span: float, count: int) -> float:
    raw = span / max(count, 1)
    if raw <= 0:
        return 1.0
    mag = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def _ticks(hi: float, count: int) -> list[float]:
    step = _nice_step(hi, count)
    n = math.floor(hi / step + 1e-9)
    return [k * step for k in range(n + 1)]


def _byte_unit(hi: float) -> tuple[float, str]:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if hi >= scale:
            return float(scale), unit
    return 1.0, "B"


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) >= 1 or v == 0 else f"{v:.2g}"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


@dataclass
class _Style:
    color: str
    dash: str
    width: float
    dots: bool
    css: str  # the series' classes beyond its kind


def _styles(lines: list[Line]) -> list[_Style]:
    order = {pid: k for k, pid in enumerate(dict.fromkeys(
        ln.pid for ln in lines if ln.kind != SUSPECT and not ln.hidden and not ln.members))}
    out = []
    sus_k = 0
    for ln in lines:
        dash = _HEAP_DASH if ln.kind == HEAP else ""
        if ln.kind == SUSPECT:
            out.append(_Style(_SUSPECT_COLORS[sus_k % len(_SUSPECT_COLORS)], "", 2.0, True, ""))
            sus_k += 1
        elif ln.members:
            out.append(_Style(_SUM_COLOR, dash, 2.4, False, " sum"))
        elif ln.hidden:
            out.append(_Style(_MEMBER_COLOR, dash, 1.0, False, " member"))
        else:
            color = _PROCESS_COLORS[order[ln.pid] % len(_PROCESS_COLORS)]
            out.append(_Style(color, dash, 2.2 if ln.kind == RSS else 2.0,
                              ln.kind == HEAP or len(ln.points) == 1, ""))
    return out


def _legend(lines: list[Line], styles: list[_Style]) -> list[tuple[list[_Style], str]]:
    """The legend's entries: one per process drawn (its RSS and heap), one for the sums,
    one per suspect; each with the styles of its lines and its text."""
    entries: dict[object, tuple[list[_Style], list[str]]] = {}
    for ln, st in zip(lines, styles, strict=True):
        if ln.hidden:
            continue
        if ln.kind == SUSPECT:
            last = ln.points[-1][1] if ln.points else 0.0
            text = f"{ln.label}: {human_bytes(last)} at the end"
            entries[id(ln)] = ([st], [text + (f" \u2014 {ln.detail}" if ln.detail else "")])
            continue
        key = "sum" if ln.members else ln.pid
        sts, parts = entries.setdefault(key, ([], [ln.process or ln.label]))
        sts.append(st)
        last = ln.points[-1][1] if ln.points else 0.0
        what = "RSS" if ln.kind == RSS else "heap"
        parts.append(f"{what} {human_bytes(last)}")
        if ln.kind == HEAP and not ln.members:
            parts[-1] += f" ({ln.detail})"
    out = []
    for sts, parts in entries.values():
        head, *values = parts
        text = head if not values else f"{head}: {', '.join(values)} at the end"
        out.append((sts, text))
    return out


def render_svg(tl: Timeline, width: int = 1000, panel_height: int = 190, *,
               hidden: bool = False) -> str:
    """The chart as a standalone SVG document (every label escaped).

    The added-up processes are drawn one by one too when ``hidden`` (thin and grey, with
    class ``member``: the HTML page shows them on request).
    """
    left, right = 78, 24
    pw = width - left - right
    lines = tl.drawn(hidden=hidden)
    styles = _styles(lines)
    legend = _legend(lines, styles)
    def panel(ln: Line) -> str:
        if ln.members or ln.hidden:
            return _SUM_RSS if ln.kind == RSS else _SUM_HEAP
        return RSS if ln.kind == RSS else HEAP

    summed = next((ln.process for ln in lines if ln.members), "")
    panels = [(kind, caption.format(summed), round(panel_height * share),
               [k for k, ln in enumerate(lines) if panel(ln) == kind])
              for kind, caption, share in _PANELS]
    panels = [p for p in panels if p[3]] or [(HEAP, "", panel_height, [])]
    head = 54 if tl.subtitle else 36
    gap = 52  # caption above a plot, tick labels below
    plots_end = head + sum(ph + gap for _, _, ph, _ in panels)
    legend_top = plots_end + 24
    height = legend_top + 20 * len(legend) + 12
    pts = [p for ln in lines for p in ln.points]
    xmax = max(max((p[0] for p in pts), default=1.0), 1e-3) * 1.02
    xticks = _ticks(xmax, 8)

    def sx(x: float) -> float:
        return left + pw * x / xmax

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" '
           f'font-size="12" role="img">',
           f'<title>{markup("heapscope timeline: " + tl.title)}</title>',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="{left}" y="22" font-size="14" font-weight="bold">'
           f'{markup(_clip(tl.title, 110))}</text>']
    if tl.subtitle:
        out.append(f'<text x="{left}" y="40" fill="#555">{markup(_clip(tl.subtitle, 140))}'
                   f'</text>')
    top = head + 20 - gap
    for kind, caption, ph, members in panels:
        top += gap
        ymax = max((v for k in members for _, v in lines[k].points), default=1.0)
        ymax = max(ymax, 1.0)
        scale, unit = _byte_unit(ymax)
        # The top of the axis is the first tick above the highest point: labelled.
        ystep = _nice_step(ymax / scale, 5 if ph >= panel_height else 3)
        ytop = math.ceil(ymax / scale / ystep + 1e-9) * ystep * scale
        yticks = [k * ystep for k in range(round(ytop / scale / ystep) + 1)]

        def sy(y: float, top: int = top, ph: int = ph, ytop: float = ytop) -> float:
            return top + ph - ph * y / ytop if ytop > 0 else top + ph

        out.append(f'<text x="{left}" y="{top - 9}" fill="#222" font-weight="bold">'
                   f'{markup(caption)}</text>')
        for t in yticks:
            y = sy(t * scale)
            out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" '
                       f'stroke="#e6e6e6"/>')
            out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">'
                       f'{markup(_fmt(t))} {unit}</text>')
        for t in xticks:
            x = sx(t)
            out.append(f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" '
                       f'stroke="#f0f0f0"/>')
            out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle" '
                       f'fill="#444">{markup(_fmt(t))}</text>')
        out.append(f'<rect class="plot" data-panel="{kind}" x="{left}" y="{top}" '
                   f'width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
        for k in members:
            out.extend(_series(lines[k], styles[k], sx, sy))
        top += ph
    out.append(f'<text x="{left + pw / 2:.1f}" y="{plots_end - 2}" text-anchor="middle" '
               f'fill="#222">seconds since start</text>')
    out.append('<g class="legend">')
    for k, (sts, text) in enumerate(legend):
        y = legend_top + 20 * k
        out.append('<g class="entry">')
        seg = 28 / len(sts)
        for j, st in enumerate(sts):
            dash_attr = f' stroke-dasharray="{st.dash}"' if st.dash else ""
            x0 = left + seg * j
            out.append(f'<line x1="{x0:.1f}" y1="{y + 6}" x2="{x0 + seg - 2:.1f}" '
                       f'y2="{y + 6}" stroke="{st.color}" stroke-width="{st.width}"'
                       f'{dash_attr}/>')
        out.append(f'<text x="{left + 36}" y="{y + 10}" fill="#222">'
                   f'{markup(_clip(text, 130))}</text></g>')
    out.append("</g>")
    if not lines:
        out.append(f'<text x="{left + pw / 2:.1f}" y="{head + 20 + panel_height / 2:.1f}" '
                   f'text-anchor="middle" fill="#888">no data</text>')
    out.append("</svg>\n")
    return "\n".join(out)


def _series(line: Line, st: _Style, sx: Callable[[float], float],
            sy: Callable[[float], float]) -> list[str]:
    """One line's SVG group: its polyline and, where they mean something, its dots."""
    desc = markup(f"{line.label} {line.detail}".strip())
    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line.points)
    dash_attr = f' stroke-dasharray="{st.dash}"' if st.dash else ""
    who = (f' data-members="{len(line.members)}"' if line.members
           else f' data-pid="{line.pid}"' if line.pid is not None else "")
    out = [f'<g class="series {markup(line.kind)}{st.css}"{who}><title>{desc}</title>']
    if len(line.points) > 1:
        out.append(f'<polyline points="{coords}" fill="none" stroke="{st.color}" '
                   f'stroke-width="{st.width}"{dash_attr} stroke-linejoin="round"/>')
    if st.dots or len(line.points) == 1:
        for x, y in line.points[:2000]:
            tip = f"{markup(line.label)}\nt = {x:.2f} s\n{human_bytes(y)}"
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" '
                       f'fill="{st.color}"><title>{tip}</title></circle>')
    out.append("</g>")
    return out


def render_html(tl: Timeline) -> str:
    """A self-contained page: the chart, the suspects' table and notes."""
    parts = [f"<h1>{markup('heapscope timeline: ' + tl.title)}</h1>\n"]
    if tl.subtitle:
        parts.append(f"<p class=\"sub\">{markup(tl.subtitle)}</p>\n")
    summed = next((ln for ln in tl.sums), None)
    rest = (f" The {markup(summed.process.replace(' (sum)', ''))} are added up in the last "
            "panels." if summed is not None else "")
    parts.append("<p class=\"hint\">Top panel: RSS per process. Below it, on its own "
                 "scale: the live heap estimated from each dump (dashed), and the top "
                 "suspects' live bytes at each dump (lines with dots)." + rest +
                 " Hover a point for its value.</p>\n")
    if summed is not None:
        # No script: a checkbox and a CSS rule (timeline.css) show the added-up processes.
        parts.append(f"<input type=\"checkbox\" id=\"members\"> <label for=\"members\">also "
                     f"show the {markup(summed.process.replace(' (sum)', ''))} one by one "
                     f"(grey)</label>\n")
    parts.append(f"<div id=\"chart\">{render_svg(tl, hidden=summed is not None)}</div>\n")
    if tl.findings:
        parts.append("<table><thead><tr><th>#</th><th>function</th><th>verdict</th>"
                     "<th>where</th><th>pid</th><th>live at end</th><th>growth</th>"
                     "</tr></thead><tbody>\n")
        for k, f in enumerate(tl.findings, 1):
            where = f"{f.file}:{f.line}" if f.file else f.module
            parts.append(
                f"<tr><td>{k}</td><td class=\"fn\">{markup(f.function)}</td>"
                f"<td class=\"v-{markup(f.verdict)}\">{markup(f.verdict)}</td>"
                f"<td>{markup(where)}</td><td>{markup(str(f.pid))}</td>"
                f"<td>{markup(human_bytes(f.bytes))}</td>"
                f"<td>{markup(human_bytes(f.growth))}</td></tr>\n")
        parts.append("</tbody></table>\n")
    for note in tl.notes:
        parts.append(f"<p class=\"note\">{markup(note)}</p>\n")
    return page(f"heapscope timeline: {tl.title}", css=["timeline.css"], scripts=[],
                body="".join(parts))


# ------------------------------------------------------------------------------ PNG

def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def svg_to_png(svg: str, path: str, *, tool: str | None = None) -> str:
    """Write ``svg`` as a PNG at ``path``; returns the tool used.

    ``rsvg-convert`` (Debian ``librsvg2-bin``) when installed, else headless Chromium (Debian
    ``chromium``) taking a screenshot of the SVG; ``tool`` (``"rsvg-convert"`` or
    ``"chromium"``) forces one.
    """
    width, height = _svg_size(svg)
    with tempfile.TemporaryDirectory(prefix="heapscope-png-") as tmp:
        src = os.path.join(tmp, "timeline.svg")
        with open(src, "w", encoding="utf-8") as f:
            f.write(svg)
        rsvg = shutil.which("rsvg-convert") if tool in (None, "rsvg-convert") else None
        if rsvg:
            subprocess.run([rsvg, "-b", "white", "-o", path, src], check=True,
                           capture_output=True, timeout=120)
            return "rsvg-convert"
        browser = _browser() if tool in (None, "chromium") else None
        if browser is None:
            raise HeapscopeError("cannot write a PNG: install librsvg2-bin (rsvg-convert) or "
                                 "chromium, or write .html")
        cmd = [browser, "--headless", "--disable-gpu", "--hide-scrollbars",
               "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run", "--mute-audio",
               f"--user-data-dir={os.path.join(tmp, 'profile')}",
               f"--window-size={width},{height}", f"--screenshot={os.path.abspath(path)}",
               "--default-background-color=ffffffff", "file://" + src]
        if os.geteuid() == 0:
            cmd.insert(2, "--no-sandbox")
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            raise HeapscopeError(f"{browser} did not finish the screenshot") from None
        if p.returncode != 0 or not os.path.isfile(path):
            raise HeapscopeError(f"{browser} could not write {path}: {p.stderr.strip()[-400:]}")
        return os.path.basename(browser)


def _svg_size(svg: str) -> tuple[int, int]:
    m = re.search(r'<svg[^>]*\bwidth="(\d+)"[^>]*\bheight="(\d+)"', svg)
    return (int(m.group(1)), int(m.group(2))) if m else (1000, 600)
