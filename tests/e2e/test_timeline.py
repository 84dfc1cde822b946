"""`heapscope timeline SESSION`: memory over time from a real session, as HTML and PNG.

The session is ``leakprog/series.c cache`` run under ``heapscope run`` (40 ms per step so RSS
is sampled several times): leak_linear grows to the end, cache_fill levels off.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import jemalloc as je
import pytest

from heapscope.cli import timeline

pytestmark = pytest.mark.e2e

SVG = "{http://www.w3.org/2000/svg}"



@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory, gcc: Path, libjemalloc: Path) -> Path:
    return je.series_session(tmp_path_factory.mktemp("heapscope-timeline").resolve(), gcc)[0]


def hs_timeline(*argv: str) -> int:
    p = argparse.ArgumentParser()
    timeline.register(p.add_subparsers())
    args = p.parse_args(["timeline", *argv, "--no-cache"])
    rc: int = args.func(args)
    return rc


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", head
    w, h = struct.unpack(">II", head[16:24])
    return w, h


def test_timeline_html(session: Path, tmp_path: Path) -> None:
    out = tmp_path / "timeline.html"
    assert hs_timeline(str(session), "-o", str(out)) == 0
    html = out.read_text()
    assert "<svg" in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert html.count("<polyline") >= 3  # RSS, heap, suspects
    # each process by its title, pid and role
    assert re.search(r"RSS [^<]*series[^<]*\[pid \d+, main\]", html), html[:2000]
    assert re.search(r"heap [^<]*series[^<]*\[pid \d+, main\]", html)
    assert "leak_linear (leak, pid" in html
    assert "cache_fill (bounded, pid" in html
    assert "<script" not in html


@pytest.mark.parametrize("tool", ["rsvg-convert", "chromium"])
def test_timeline_png(session: Path, tmp_path: Path, tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not found: apt-get install "
                    f"{'librsvg2-bin' if tool == 'rsvg-convert' else 'chromium'}")
    from heapscope.render.timeline import collect_timeline, render_svg, svg_to_png
    from heapscope.symbols import SymbolOptions

    tl = collect_timeline(str(session), SymbolOptions(cache_dir=None))
    kinds = {line.kind for line in tl.lines}
    assert kinds == {"rss", "heap", "suspect"}
    heap = next(line for line in tl.lines if line.kind == "heap")
    assert len(heap.points) >= 20
    assert all(b[0] >= a[0] for a, b in zip(heap.points, heap.points[1:], strict=False))
    assert heap.points[0][0] >= 0
    out = tmp_path / f"timeline-{tool}.png"
    assert svg_to_png(render_svg(tl), str(out), tool=tool).startswith(tool.split("-")[0])
    w, h = png_size(out)
    assert w >= 900 and h >= 400
    if tool == "rsvg-convert":
        cli_out = tmp_path / "cli.png"
        assert hs_timeline(str(session), "-o", str(cli_out)) == 0
        assert png_size(cli_out)[0] >= 900


# ------------------------------------------------------------------------------ many processes
# programs/fleet.c: a parent and 21 forked children, run under `heapscope run --every 0.3`
# (22 processes, as a server with a pool of workers). Child 0 ("fleet: leaker") leaks 4 x 64
# KiB a step; child i >= 1 ("fleet: worker i") holds (i % 4 + 1) x 64 KiB from the start.

CHILDREN = 21
DRAWN = 5  # past 6 processes, the chart draws 5 one by one and adds the others up
BLOCK = 64 * 1024


class Fleet:
    def __init__(self, session: Path, pids: dict[int, int], cache: Path) -> None:
        self.session, self.pids, self.cache = session, pids, cache

    @property
    def leaker(self) -> int:
        return self.pids[0]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, gcc: Path, libjemalloc: Path,
          helper_built: str) -> Fleet:
    root = tmp_path_factory.mktemp("heapscope-fleet").resolve()
    binary = je.build([je.PROGRAMS_DIR / "fleet.c"], root / "fleet",
                      ("-O1", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls"),
                      compiler=gcc)
    session, pidfile = root / "session", root / "pids.txt"
    p = je.run_heapscope("run", "-o", str(session), "--sample", "16k", "--every", "0.3", "--",
                         str(binary), str(CHILDREN), "30", "100", str(pidfile),
                         cache=root / "cache", cwd=root, unprofiled=True, check=True)
    assert "leak_request" in p.stderr, p.stderr[-3000:]
    pids = {int(i): int(pid) for i, pid in
            (line.split() for line in pidfile.read_text().splitlines())}
    assert sorted(pids) == list(range(CHILDREN))
    return Fleet(session, pids, root / "cache")


def rss_rows(session: Path) -> dict[int, list[tuple[float, float]]]:
    """rss.csv by pid, read here (not by heapscope)."""
    out: dict[int, list[tuple[float, float]]] = {}
    with open(session / "rss.csv", newline="") as f:
        for row in csv.DictReader(f):
            out.setdefault(int(row["pid"]), []).append((float(row["t_seconds"]),
                                                        float(row["rss_bytes"])))
    return out


def polyline(group: ET.Element) -> list[tuple[float, float]]:
    line = group.find(f"{SVG}polyline")
    assert line is not None, ET.tostring(group)[:300]
    return [(float(x), float(y)) for x, y in
            (xy.split(",") for xy in line.attrib["points"].split())]


def test_timeline_of_many_processes(fleet: Fleet, tmp_path: Path) -> None:
    from heapscope.render.timeline import collect_timeline, render_svg
    from heapscope.symbols import SymbolOptions

    tl = collect_timeline(str(fleet.session), SymbolOptions(cache_dir=None))
    svg = render_svg(tl)
    (tmp_path / "fleet.svg").write_text(svg)
    root = ET.fromstring(svg)
    processes = CHILDREN + 1
    others = processes - DRAWN

    # The legend: a few entries, the leaker by its name, the rest added up and counted.
    entries = [" ".join(t.text or "" for t in e.iter(f"{SVG}text"))
               for e in root.iter(f"{SVG}g") if e.get("class") == "entry"]
    assert 3 <= len(entries) <= 10, entries
    assert any(e.startswith(f"fleet: leaker [pid {fleet.leaker}, child]: RSS ")
               for e in entries), entries
    assert sum(e.startswith(f"{others} other processes (sum): RSS ") for e in entries) == 1
    # The suspect under its verdict: `leak`, or `growing` when the leaker's exactly counted
    # 64 KiB blocks came unevenly per dump (22 processes dumped a round on a loaded machine:
    # one CI run read a per-dump slowdown, "take 1 more dump"). The timeline shows either.
    assert any(e.startswith(("leak_request (leak, pid ", "leak_request (growing, pid "))
               for e in entries), entries

    groups = [g for g in root.iter(f"{SVG}g") if (g.get("class") or "").startswith("series")]
    drawn = {int(g.attrib["data-pid"]) for g in groups if "rss" in g.attrib["class"].split()
             and "data-pid" in g.attrib}
    assert len(drawn) == DRAWN and fleet.leaker in drawn, drawn

    # The RSS sum at each time is the sum of the other processes' rows in rss.csv.
    rows = rss_rows(fleet.session)
    assert len(rows) == processes
    rest = {pid: pts for pid, pts in rows.items() if pid not in drawn}
    assert len(rest) == others
    rss_sum = next(ln for ln in tl.sums if ln.kind == "rss")
    assert sorted(rss_sum.members) == sorted(rest)
    for t, v in rss_sum.points:
        want = sum(next(val for when, val in reversed(pts) if when <= t)
                   for pts in rest.values() if pts[0][0] <= t <= pts[-1][0])
        assert v == want, (t, v, want)

    # The heap sum: each added-up process's last dump at or before each time. At the end it
    # holds at least the workers' blocks (the program's own count), plus each process's
    # small start-up heap (the parent's, inherited through fork: under 160 KiB each).
    heap_sum = next(ln for ln in tl.sums if ln.kind == "heap")
    members = [ln for ln in tl.lines if ln.kind == "heap" and ln.hidden]
    assert sorted(ln.pid for ln in members) == heap_sum.members
    assert heap_sum.points[-1][1] == pytest.approx(sum(ln.points[-1][1] for ln in members))
    index = {pid: i for i, pid in fleet.pids.items()}
    blocks = sum((index[pid] % 4 + 1) * BLOCK for pid in heap_sum.members if pid in index)
    assert blocks <= heap_sum.points[-1][1] <= blocks + len(members) * 160 * 1024

    # Each panel is scaled to its own lines: the leaker's heap rises over most of its panel,
    # and the sums reach the upper part of theirs.
    plots = {r.attrib["data-panel"]: r for r in root.iter(f"{SVG}rect")
             if r.get("class") == "plot"}
    assert set(plots) == {"rss", "heap", "sum-rss", "sum-heap"}

    def share(panel: str, pts: list[tuple[float, float]]) -> tuple[float, float]:
        top, height = float(plots[panel].attrib["y"]), float(plots[panel].attrib["height"])
        ys = [(top + height - y) / height for _, y in pts]  # 0 at the bottom, 1 at the top
        assert all(-0.01 <= y <= 1.01 for y in ys), (panel, ys)
        return min(ys), max(ys)

    leak_heap = next(g for g in groups if g.attrib["class"] == "series heap"
                     and g.get("data-pid") == str(fleet.leaker))
    low, high = share("heap", polyline(leak_heap))
    assert high >= 0.75 and high - low >= 0.5, (low, high)
    leak_rss = next(g for g in groups if g.attrib["class"] == "series rss"
                    and g.get("data-pid") == str(fleet.leaker))
    assert share("rss", polyline(leak_rss))[1] >= 0.75
    for kind in ("rss", "heap"):
        g = next(g for g in groups if g.attrib["class"] == f"series {kind} sum")
        assert g.attrib["data-members"] == str(len(rss_sum.members if kind == "rss"
                                                   else heap_sum.members))
        # A sum's panel has three ticks: its axis ends at the first whole step above the
        # line's top, so the line fills more than 2/3 of the panel whatever its values.
        assert share(f"sum-{kind}", polyline(g))[1] >= 0.66

    # The title: program, processes, dumps and their span.
    dumps = [n for n in os.listdir(fleet.session / "dumps") if n.endswith(".heap")]
    m = re.fullmatch(r"fleet · 22 processes · (\d+) dumps over (\d+\.\d) s", tl.title)
    assert m, tl.title
    assert len(dumps) - 3 <= int(m.group(1)) <= len(dumps)

    if shutil.which("rsvg-convert"):
        from heapscope.render.timeline import svg_to_png

        out = tmp_path / "fleet.png"
        svg_to_png(svg, str(out), tool="rsvg-convert")
        w, h = png_size(out)
        assert w == 1000 and h < 1300, (w, h)


def test_timeline_html_shows_the_others_on_request(fleet: Fleet, tmp_path: Path) -> None:
    out = tmp_path / "fleet.html"
    assert hs_timeline(str(fleet.session), "-o", str(out)) == 0
    html = out.read_text()
    assert "<script" not in html
    assert re.search(r'<input type="checkbox" id="members"> <label for="members">also show '
                     rf'the {CHILDREN + 1 - DRAWN} other processes one by one', html)
    # every added-up process is in the page, drawn only when the box is ticked
    assert html.count('class="series rss member"') == CHILDREN + 1 - DRAWN
    assert ".series.member { display: none; }" in html
    assert "#members:checked ~ #chart .series.member { display: inline; }" in html


def test_pictures_are_titled_by_program_process_and_time(fleet: Fleet, tmp_path: Path) -> None:
    mine = sorted((n for n in os.listdir(fleet.session / "dumps")
                   if n.startswith(f"jeprof.{fleet.leaker}.") and n.endswith(".heap")),
                  key=lambda n: int(n.split(".")[2]))
    final = mine[-1]
    assert final.endswith(".f.heap")
    symbolized = fleet.session / "symbolized" / (final + ".json.gz")
    assert symbolized.is_file()
    want = rf"fleet: leaker \(pid {fleet.leaker}\) · dump {len(mine)} \(at exit\) at \d+\.\d s"
    page = tmp_path / "flame.html"
    je.run_heapscope("flamegraph", str(symbolized), "-o", str(page), cache=fleet.cache,
                     unprofiled=True, check=True)
    title = re.search(r'"title":"([^"]*)"', page.read_text())
    assert title, page.read_text()[:500]
    shown = json.loads(f'"{title.group(1)}"')
    assert re.fullmatch(want, shown), shown
    assert ".json.gz" not in shown

    dot = tmp_path / "graph.dot"
    je.run_heapscope("graph", str(symbolized), "-o", str(dot), cache=fleet.cache,
                     unprofiled=True, check=True)
    label = re.search(r'title \[[^\n]*label="heapscope: ([^"\\]*)\\l', dot.read_text())
    assert label and re.fullmatch(want, label.group(1)), dot.read_text()[:600]

    # the whole session: the program, its processes and the last dump of each
    page = tmp_path / "session.html"
    je.run_heapscope("flamegraph", str(fleet.session), "-o", str(page), cache=fleet.cache,
                     unprofiled=True, check=True)
    title = re.search(r'"title":"([^"]*)"', page.read_text())
    assert title
    shown = json.loads(f'"{title.group(1)}"')
    assert re.fullmatch(r"fleet · \d+ processes: fleet: leaker \[pid \d+, child\], .* · the "
                        r"last dump of each, up to \d+\.\d s", shown), shown
