"""Memory over time for a session: RSS, the heap the dumps account for, the top suspects.

Three kinds of lines share one chart, x in seconds since the session started:

- ``rss``: each process's resident set size, from ``rss.csv``;
- ``heap``: each process's live heap estimated from each dump (unsampled in-use bytes, all
  sites), at the dump's modification time: the gap to RSS is what jemalloc's heap does not
  explain (fragmentation, retained pages, non-malloc memory);
- ``suspect``: the live bytes of the top sites of :func:`heapscope.analysis.leaks.find_leaks`
  per dump, so one sees which line grows.

The chart is an SVG drawn here (no plotting library); the HTML page inlines it, and a PNG is
made from it with ``rsvg-convert`` (Debian ``librsvg2-bin``) or headless Chromium.
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
from collections.abc import Callable
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
from heapscope.capture.session import read_manifest
from heapscope.errors import HeapscopeError, InputError
from heapscope.files import open_regular
from heapscope.formats.symbolized import SUFFIX
from heapscope.prepare import expand_inputs, is_session
from heapscope.symbols import Diagnostic, SymbolOptions
from heapscope.units import human_bytes
from heapscope.web import markup, page

ProgressFn = Callable[[str, int, int], None]

RSS = "rss"
HEAP = "heap"
SUSPECT = "suspect"
# Flat lines say nothing; helper sites (a wrapper script's shell) are not the program's.
_QUIET = {"expected", "suppressed", "inherited", "steady", "helper"}


@dataclass
class Line:
    """One series on the chart: ``points`` are (seconds since start, bytes)."""

    label: str
    kind: str
    pid: int | None
    points: list[tuple[float, float]]
    detail: str = ""
    dumps: list[str] = field(default_factory=list)  # the dump of each point (heap, suspect)


@dataclass
class Timeline:
    """Everything the chart shows, plus the suspects' evidence for the table."""

    title: str
    lines: list[Line]
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    diagnostics: list[Diagnostic] = field(default_factory=list)


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
                     progress: ProgressFn | None = None) -> Timeline:
    """Read a session (or a folder of dumps) into the lines of the chart."""
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
    report = find_leaks(all_series, info=info, root=manifest.get("pid"))
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
        lines.append(Line(f"RSS {_who(facts, pid)}", RSS, pid, rss[pid], _exe(info, pid)))
    if not rss and os.path.exists(rss_path) and not os.path.isfile(rss_path):
        notes.append("rss.csv is not a regular file: RSS is not shown")
    elif not rss:
        notes.append("no rss.csv in this folder: RSS is not shown")
    by_pid: dict[int | None, tuple[ProcessSeries, list[float | None]]] = {}
    # Beside processes with a series, one dump is a dot, not a line: those are counted.
    many = any(len(s.paths) > 1 for s in all_series)
    single = 0
    for s in sorted(all_series, key=lambda s: s.pid or 0):
        ts = times[id(s)]
        by_pid[s.pid] = (s, ts)
        kept = [(t - start, total, path) for t, total, path
                in zip(ts, s.totals, s.paths, strict=False) if t is not None]
        pts = [(t, total) for t, total, _ in kept]
        if len(pts) == 1 and many:
            single += 1
        elif pts:
            lines.append(Line(f"heap {_who(facts, s.pid)}", HEAP, s.pid, pts,
                              f"{len(pts)} dump{'s' if len(pts) != 1 else ''}",
                              [path for _, _, path in kept]))
    if single:
        notes.append(f"{single} process{'es' if single > 1 else ''} with one dump "
                     f"{'are' if single > 1 else 'is'} not drawn (heapscope leaks lists "
                     f"{'them' if single > 1 else 'it'})")
    chosen = [f for f in report.findings if f.verdict not in _QUIET
              and not (many and f.pid in by_pid and len(by_pid[f.pid][0].paths) == 1)][:top]
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
                          [path for _, _, path in kept_s]))
    title = os.path.basename(os.path.abspath(session))
    cmd = manifest.get("command")
    if isinstance(cmd, list) and cmd:
        title += ": " + " ".join(str(c) for c in cmd)[:200]
    diags = [d for s in all_series for d in s.diagnostics]
    return Timeline(title, lines, chosen, notes + report.notes, diags)


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

# One colour per process (its RSS and heap lines share it); after ten, the dash changes.
_PROCESS_COLORS = ("#1f4e9c", "#2ca02c", "#0d7d8a", "#7b4fb3", "#8c6d31", "#4a7fd0",
                   "#5aa05a", "#17a2b8", "#393b79", "#637939")
_PROCESS_DASHES = ("", "1 3", "8 3 2 3")
_HEAP_DASHES = ("6 4", "2 2", "10 3 2 3 2 3")
_SUSPECT_COLORS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
                   "#17becf", "#7f7f7f")


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


def render_svg(tl: Timeline, width: int = 1000, plot_height: int = 420) -> str:
    """The chart as a standalone SVG document (every label escaped)."""
    left, right, top, bottom = 78, 24, 36, 46
    pw, ph = width - left - right, plot_height - top - bottom
    legend_h = 20 * len(tl.lines) + 12
    height = plot_height + legend_h
    pts = [p for line in tl.lines for p in line.points]
    xmax = max((p[0] for p in pts), default=1.0)
    ymax = max((p[1] for p in pts), default=1.0)
    xmax = max(xmax, 1e-3) * 1.02
    scale, unit = _byte_unit(ymax)
    yticks = _ticks(ymax / scale * 1.05, 6)
    ytop = yticks[-1] * scale if yticks[-1] * scale >= ymax else ymax * 1.05
    yticks = [t for t in _ticks(ytop / scale, 6) if t * scale <= ytop + 1e-9]
    xticks = _ticks(xmax, 8)

    def sx(x: float) -> float:
        return left + pw * x / xmax

    def sy(y: float) -> float:
        return top + ph - ph * y / ytop if ytop > 0 else top + ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" '
           f'font-size="12" role="img">',
           f'<title>{markup("heapscope timeline: " + tl.title)}</title>',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="{left}" y="22" font-size="14" font-weight="bold">'
           f'{markup(_clip(tl.title, 110))}</text>']
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
    out.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph + 36}" text-anchor="middle" '
               f'fill="#222">seconds since start</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" '
               f'stroke="#888"/>')
    sus_k = 0
    styles: list[tuple[str, str, float]] = []
    order = {pid: k for k, pid in enumerate(dict.fromkeys(
        line.pid for line in tl.lines if line.kind != SUSPECT))}
    for line in tl.lines:
        if line.kind == SUSPECT:
            color, dash, w = _SUSPECT_COLORS[sus_k % len(_SUSPECT_COLORS)], "", 2.0
            sus_k += 1
        else:
            k = order[line.pid]
            color = _PROCESS_COLORS[k % len(_PROCESS_COLORS)]
            cycle = (k // len(_PROCESS_COLORS)) % len(_PROCESS_DASHES)
            if line.kind == RSS:
                dash, w = _PROCESS_DASHES[cycle], 2.2
            else:  # the heap the dumps account for: dashed, in its process's colour
                dash, w = _HEAP_DASHES[cycle], 2.0
        styles.append((color, dash, w))
    for k, line in enumerate(tl.lines):
        color, dash, w = styles[k]
        desc = markup(f"{line.label} {line.detail}".strip())
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line.points)
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        cls = markup(line.kind)
        out.append(f'<g class="series {cls}"><title>{desc}</title>')
        if len(line.points) > 1:
            out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" '
                       f'stroke-width="{w}"{dash_attr} stroke-linejoin="round"/>')
        if line.kind != RSS or len(line.points) == 1:
            for x, y in line.points[:2000]:
                tip = f"{markup(line.label)}\nt = {x:.2f} s\n{human_bytes(y)}"
                out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" '
                           f'fill="{color}"><title>{tip}</title></circle>')
        out.append("</g>")
    ly = plot_height + 4
    for k, line in enumerate(tl.lines):
        color, dash, w = styles[k]
        y = ly + 20 * k
        dash_attr = f' stroke-dasharray="{dash}"' if dash else ""
        last = line.points[-1][1] if line.points else 0.0
        text = f"{line.label}: {human_bytes(last)} at the end"
        if line.detail:
            text += f"  \u2014 {line.detail}"
        out.append(f'<line x1="{left}" y1="{y + 6}" x2="{left + 28}" y2="{y + 6}" '
                   f'stroke="{color}" stroke-width="{w}"{dash_attr}/>')
        out.append(f'<text x="{left + 36}" y="{y + 10}" fill="#222">'
                   f'{markup(_clip(text, 130))}</text>')
    if not tl.lines:
        out.append(f'<text x="{left + pw / 2:.1f}" y="{top + ph / 2:.1f}" '
                   f'text-anchor="middle" fill="#888">no data</text>')
    out.append("</svg>\n")
    return "\n".join(out)


def render_html(tl: Timeline) -> str:
    """A self-contained page: the chart, the suspects' table and notes."""
    parts = [f"<h1>{markup('heapscope timeline: ' + tl.title)}</h1>\n",
             "<p class=\"hint\">Solid lines: RSS per process. Dashed: live heap estimated from "
             "each dump (the gap to RSS is memory the heap does not explain). Lines with dots: "
             "the top suspects' live bytes at each dump. Hover a point for its value.</p>\n",
             f"<div id=\"chart\">{render_svg(tl)}</div>\n"]
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
