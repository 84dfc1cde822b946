"""The timeline of many processes (the few drawn, the rest added up) and the pictures' titles,
from small hand-made sessions; tests/e2e/test_timeline.py runs them on a real one."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

from heapscope.inputs import dump_name, dump_title, picture_title, session_title
from heapscope.render.flamegraph import default_title
from heapscope.render.timeline import HEAP, RSS, SUSPECT, Line, Timeline, render_svg, sum_points

SVG = "{http://www.w3.org/2000/svg}"


def test_sum_points_adds_each_process_where_it_has_a_value() -> None:
    a = [(0.0, 10.0), (1.0, 20.0), (2.0, 30.0)]
    b = [(1.0, 5.0), (1.5, 7.0)]  # starts late, ends early
    # RSS: a process adds nothing before its first sample nor after its last (it exited)
    assert sum_points([a, b], hold=False) == [(0.0, 10.0), (1.0, 25.0), (1.5, 27.0),
                                              (2.0, 30.0)]
    # heap: a process's last dump stands until the end
    assert sum_points([a, b], hold=True) == [(0.0, 10.0), (1.0, 25.0), (1.5, 27.0),
                                             (2.0, 37.0)]
    assert sum_points([], hold=True) == []


def _many() -> Timeline:
    """Five processes drawn, four added up, two suspects."""
    lines = []
    for pid in range(100, 109):
        hidden = pid >= 105
        lines.append(Line(f"RSS p{pid}", RSS, pid, [(0.0, 1e6 * pid), (2.0, 1e6 * pid)],
                          process=f"p [pid {pid}]", hidden=hidden))
        lines.append(Line(f"heap p{pid}", HEAP, pid, [(0.1, 1e4), (1.9, 2e4 * (pid - 99))],
                          "2 dumps", process=f"p [pid {pid}]", hidden=hidden))
    lines += [Line("grow (leak, pid 100)", SUSPECT, 100, [(0.1, 5e3), (1.9, 9e4)], "a.c:3"),
              Line("keep (growing, pid 101)", SUSPECT, 101, [(0.1, 1e3), (1.9, 3e4)], "b.c:9")]
    members = [ln for ln in lines if ln.hidden]
    sums = [Line(f"{kind} 4 other processes (sum)", kind, None,
                 sum_points([ln.points for ln in members if ln.kind == kind],
                            hold=kind == HEAP), process="4 other processes (sum)",
                 members=[105, 106, 107, 108]) for kind in (RSS, HEAP)]
    return Timeline("prog \u00b7 9 processes \u00b7 18 dumps over 2.0 s", lines, sums=sums,
                    subtitle="session: ./prog")


def test_many_processes_are_drawn_few_with_a_short_legend() -> None:
    root = ET.fromstring(render_svg(_many()))
    entries = [" ".join(t.text or "" for t in e.iter(f"{SVG}text"))
               for e in root.iter(f"{SVG}g") if e.get("class") == "entry"]
    # one per process drawn (its RSS and heap), one for the others, one per suspect;
    # figures by hand: 100e6 B = 95.4 MiB, 2e4 B = 19.5 KiB, (105+106+107+108)e6 B =
    # 406.3 MiB, 2e4 * (6+7+8+9) B = 585.9 KiB, 9e4 B = 87.9 KiB
    assert entries == [
        "p [pid 100]: RSS 95.4 MiB, heap 19.5 KiB (2 dumps) at the end",
        "p [pid 101]: RSS 96.3 MiB, heap 39.1 KiB (2 dumps) at the end",
        "p [pid 102]: RSS 97.3 MiB, heap 58.6 KiB (2 dumps) at the end",
        "p [pid 103]: RSS 98.2 MiB, heap 78.1 KiB (2 dumps) at the end",
        "p [pid 104]: RSS 99.2 MiB, heap 97.7 KiB (2 dumps) at the end",
        "4 other processes (sum): RSS 406.3 MiB, heap 585.9 KiB at the end",
        "grow (leak, pid 100): 87.9 KiB at the end — a.c:3",
        "keep (growing, pid 101): 29.3 KiB at the end — b.c:9"]
    pids = [g.get("data-pid") for g in root.iter(f"{SVG}g")
            if (g.get("class") or "").startswith("series rss")]
    assert pids == ["100", "101", "102", "103", "104", None]
    panels = [r.get("data-panel") for r in root.iter(f"{SVG}rect") if r.get("class") == "plot"]
    assert panels == ["rss", "heap", "sum-rss", "sum-heap"]
    # the picture leaves the added-up processes out; the page has them, hidden until asked
    assert " member" not in render_svg(_many())
    assert render_svg(_many(), hidden=True).count('class="series rss member"') == 4


def _session(tmp_path: Path) -> Path:
    s = tmp_path / "session"
    (s / "dumps").mkdir(parents=True)
    (s / "symbolized").mkdir()
    manifest = {"format": "heapscope-session", "pid": 40, "start_time": 1000.0,
                "command": ["runuser", "-u", "app", "--", "/srv/leaky-server", "-p", "80"],
                "processes": [
                    {"pid": 40, "ppid": 1, "exe": "/usr/sbin/runuser",
                     "cmdline": ["runuser", "-u", "app", "--", "/srv/leaky-server"]},
                    {"pid": 41, "ppid": 40, "exe": "/srv/leaky-server",
                     "cmdline": ["/srv/leaky-server", "-p", "80"]},
                    {"pid": 42, "ppid": 41, "exe": "/srv/leaky-server",
                     "cmdline": ["leaky-server: worker 1"]}]}
    (s / "manifest.json").write_text(json.dumps(manifest))
    for name, when in (("jeprof.41.0.u0.heap", 1000.5), ("jeprof.41.1.u1.heap", 1001.0),
                       ("jeprof.41.2.f.heap", 1003.25), ("jeprof.42.0.u0.heap", 1001.5)):
        (s / "dumps" / name).write_text("heap_v2/524288\n")
        os.utime(s / "dumps" / name, (when, when))
        (s / "symbolized" / (name + ".json.gz")).write_bytes(b"")
    return s


def test_titles_say_program_process_and_time(tmp_path: Path) -> None:
    s = _session(tmp_path)
    sym = str(s / "symbolized" / "jeprof.41.2.f.heap.json.gz")
    # the wrapper (runuser) started the program: the program is named
    assert dump_title(sym) == "leaky-server (pid 41) \u00b7 dump 3 (at exit) at 3.2 s"
    assert dump_title(str(s / "dumps" / "jeprof.41.1.u1.heap")) == \
        "leaky-server (pid 41) \u00b7 dump 2 at 1.0 s"
    # a process that retitled itself is named by its title
    assert dump_title(str(s / "dumps" / "jeprof.42.0.u0.heap")) == \
        "leaky-server: worker 1 (pid 42) \u00b7 dump 1 at 1.5 s"
    both = [str(s / "symbolized" / "jeprof.41.1.u1.heap.json.gz"), sym]
    assert picture_title(both) == "leaky-server (pid 41) \u00b7 2 dumps, the last at 3.2 s"
    last = [sym, str(s / "symbolized" / "jeprof.42.0.u0.heap.json.gz")]
    assert picture_title(last) == ("leaky-server \u00b7 2 processes \u00b7 the last dump of "
                                   "each, up to 3.2 s")
    assert default_title([sym], [str(s / "dumps" / "jeprof.41.0.u0.heap")]) == (
        "leaky-server (pid 41) \u00b7 dump 3 (at exit) at 3.2 s vs "
        "leaky-server (pid 41) \u00b7 dump 1 at 0.5 s")
    manifest = json.loads((s / "manifest.json").read_text())
    assert session_title(manifest, processes=1, dumps=12, seconds=3.21, fallback="x") == \
        "leaky-server \u00b7 1 process \u00b7 12 dumps over 3.2 s"


def test_titles_outside_a_session_are_the_dumps_names(tmp_path: Path) -> None:
    plain = tmp_path / "jeprof.7.3.m3.heap"
    plain.write_text("heap_v2/524288\n")
    assert dump_title(str(plain)) == "jeprof.7.3.m3.heap"
    # a symbolized copy whose session is gone: still the dump's own name, never the cache's
    folder = tmp_path / "gone" / "symbolized"
    folder.mkdir(parents=True)
    copy = folder / "jeprof.7.3.m3.heap.json.gz"
    copy.write_bytes(b"")
    assert dump_name(str(copy)) == "jeprof.7.3.m3.heap"
    assert picture_title([str(copy)]) == "jeprof.7.3.m3.heap"
    assert picture_title([str(plain), str(copy)]) == "jeprof.7.3.m3.heap (+1 more)"
    assert default_title([str(plain)], [str(copy)]) == \
        "jeprof.7.3.m3.heap vs jeprof.7.3.m3.heap"
