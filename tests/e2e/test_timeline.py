"""`heapscope timeline SESSION`: memory over time from a real session, as HTML and PNG.

The session is ``leakprog/series.c cache`` run under ``heapscope run`` (40 ms per step so RSS
is sampled several times): leak_linear grows to the end, cache_fill levels off.
"""

from __future__ import annotations

import argparse
import re
import shutil
import struct
from pathlib import Path

import jemalloc as je
import pytest

from heapscope.cli import timeline

pytestmark = pytest.mark.e2e



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
