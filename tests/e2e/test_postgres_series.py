"""PostgreSQL 15 under load with ``heapscope run --every 1``: every process gets a series,
the one backend that leaks gets the leak verdict, and the session's pictures count each
process's own memory once.

The server runs as ``postgres`` (runuser) behind heapscope running as root, the supported
way for a server that drops privileges. Two pgbench runs share it for twenty seconds: a
load of three clients running queries, and one client (application_name ``leaker``) calling
leakext's ``leak_blocks(16, 16384)`` four times a second (256 KiB a call, ~1 MiB/s, into
TopMemoryContext). Then the clients disconnect and the server shuts down.

Truth: the leaker's backend leaks in leak_blocks, 16 chunks per transaction pgbench reports;
the load's backends, the postmaster and the auxiliary processes do not. The pictures' total
is checked against the raw dumps read here (jeprof's estimate per stack; a forked process
less what its parent holds at the same stack), not against heapscope's own numbers. The
timeline and the flame graph of the session go to ``artifacts/`` as pictures.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import scenarios as sc
from scenarios import *  # noqa: F403  (registers scenarios.FIXTURES in this module)
from scenarios import PgCluster
from test_flamegraph_browser import driver, frames, open_page  # noqa: F401  (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

SAMPLE = 64 * 1024
SECONDS = 20
LEAK_CHUNK = 16384
# Each chunk is one malloc of 16 KiB plus AllocSet's block and chunk headers, which jemalloc
# serves from its 20 KiB size class; its profile counts size classes.
LEAK_PER_CALL = 16 * 20480


@pytest.fixture(scope="module")
def loaded(pg_cluster: PgCluster, leakext_so: Path, heapscope_cache: Path,
           libjemalloc: Path) -> dict[str, Any]:
    base = pg_cluster.base
    session = base / "series-session"
    load_sql = pg_cluster.owned_dir(base / "pgbench") / "load.sql"
    load_sql.write_text("SELECT count(*) FROM generate_series(1, 20000);\n")
    leak_sql = load_sql.parent / "leak.sql"
    leak_sql.write_text(f"SELECT leak_blocks(16, {LEAK_CHUNK});\n")
    log = base / "series-run.log"
    argv = sc.run_argv(session, pg_cluster.server_cmd(), sample=SAMPLE,
                       options=("--every", "1"))
    # Stopped with pg_ctl -m fast: under pgbench a smart shutdown (SIGTERM forwarded by
    # heapscope, tested by the postgres run scenario) was seen to wait past 120 s.
    with pg_cluster.serving(argv, sc.heapscope_env(heapscope_cache), log, forward=False):
        sql = sc.build.leakext_sql(leakext_so).replace("CREATE FUNCTION",
                                                       "CREATE OR REPLACE FUNCTION")
        pg_cluster.psql(sql)
        load = pg_cluster.pgbench(load_sql, 3, None, "load", SECONDS)
        leak = pg_cluster.pgbench(leak_sql, 1, 4, "leaker", SECONDS)
        time.sleep(2)
        pids = {"leaker": pg_cluster.backends("leaker"), "load": pg_cluster.backends("load"),
                "postmaster": pg_cluster.postmaster_pid()}
        outputs = []
        for p in (load, leak):
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0, out
            outputs.append(out)
    m = re.search(r"number of transactions actually processed: (\d+)", outputs[1])
    assert m is not None, outputs[1]
    calls = int(m.group(1))
    assert len(pids["leaker"]) == 1 and len(pids["load"]) == 3, pids
    report = json.loads((session / "report.json").read_text())
    return {"session": session, "pids": pids, "report": report, "calls": calls,
            "output": log.read_text(errors="replace"), "cache": heapscope_cache}


def test_every_backend_gets_a_series_and_only_the_leaker_leaks(loaded: dict[str, Any]) -> None:
    report, pids = loaded["report"], loaded["pids"]
    procs = {p["pid"]: p for p in report["processes"]}
    (leaker,) = pids["leaker"]
    for pid in [leaker, *pids["load"], pids["postmaster"]]:
        assert procs[pid]["judged_dumps"] >= 4, (pid, procs[pid], loaded["output"][-2000:])
    assert procs[leaker]["verdict"] == "leaks", procs[leaker]
    leaks = [s for s in report["suspects"] if s["verdict"] == "leak"]
    assert leaks and {s["pid"] for s in leaks} == {leaker}, leaks[:3]
    assert leaks[0]["function"] == "leak_blocks", leaks[0]
    truth = loaded["calls"] * LEAK_PER_CALL
    # ~140 sampled chunks (16 KiB at a 64 KiB period): 0.3 is over three standard errors
    assert leaks[0]["at_exit_bytes"] == pytest.approx(truth, rel=0.3), (truth, leaks[0])
    # the rate over the run (pgbench's -R is a Poisson schedule: the rate wanders)
    assert leaks[0]["growth_bytes_per_s"] == pytest.approx(truth / SECONDS, rel=0.5), leaks[0]
    for pid in [*pids["load"], pids["postmaster"]]:
        assert procs[pid]["verdict"] != "leaks", procs[pid]


# ------------------------------------------------------------------------------------------
# The pictures' total, from the raw dumps


_RECORD = re.compile(r"^@([^\n]*)\n\s*t\*: (\d+): (\d+) \[", re.M)


def _stacks(path: Path) -> tuple[int, dict[str, float]]:
    """(period, jeprof's estimate of live bytes per raw stack) of one heap_v2 dump."""
    text = path.read_text()
    period = int(text.split("\n", 1)[0].split("/")[1])
    out: dict[str, float] = {}
    for stack, count, nbytes in _RECORD.findall(text):
        c, b = float(count), float(nbytes)
        if c <= 0 or b <= 0 or not stack.strip():
            continue
        scale = 1.0 / (1.0 - math.exp(-(b / c) / period))
        out[stack.strip()] = out.get(stack.strip(), 0.0) + b * scale
    return period, out


def _latest(session: Path) -> dict[int, Path]:
    latest: dict[int, tuple[tuple[int, int], Path]] = {}
    for d in (session / "dumps").glob("jeprof.*.heap"):
        _, pid, seq, kind, _ = d.name.split(".")
        key = (1 << 30 if kind == "f" else int(kind[1:]), int(seq))
        if int(pid) not in latest or key > latest[int(pid)][0]:
            latest[int(pid)] = (key, d)
    return {pid: d for pid, (_, d) in latest.items()}


def _program(path: Path) -> str:
    """The program a dump's process ran: the first executable file mapping it lists."""
    maps = path.read_text().split("MAPPED_LIBRARIES:", 1)[1]
    for line in maps.splitlines():
        f = line.split()
        if len(f) >= 6 and "x" in f[1] and f[5].startswith("/"):
            return f[5]
    return ""


def _own_total(session: Path) -> float:
    """Each process's live bytes less what its parent (running the same program) holds at
    the same stack, summed over the processes."""
    manifest = json.loads((session / "manifest.json").read_text())
    ppids = {p["pid"]: p["ppid"] for p in manifest["processes"]}
    latest = _latest(session)
    stacks = {pid: _stacks(d)[1] for pid, d in latest.items()}
    total = 0.0
    for pid, mine in stacks.items():
        ppid = ppids.get(pid)
        parent = stacks[ppid] if ppid in latest and \
            _program(latest[ppid]) == _program(latest[pid]) else {}
        for stack, b in mine.items():
            total += max(0.0, b - parent.get(stack, 0.0))
    return total


def _hs(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*sc.HEAPSCOPE, *args], env=sc.heapscope_env(cache),
                          capture_output=True, text=True, timeout=300)


def test_pictures_count_each_process_once(loaded: dict[str, Any], tmp_path: Path) -> None:
    session, cache = loaded["session"], loaded["cache"]
    truth = _own_total(session)
    everything = sum(sum(_stacks(d)[1].values()) for d in _latest(session).values())
    # what forked processes inherited is a share well beyond the tolerance below
    assert everything > 1.06 * truth
    flame = tmp_path / "flame.html"
    p = _hs("flamegraph", str(session), "-o", str(flame), cache=cache)
    assert p.returncode == 0, p.stderr
    m = re.search(r'<script type="application/json" id="heapscope-data">(.*?)</script>',
                  flame.read_text(), re.S)
    assert m is not None
    data = json.loads(m.group(1))
    tree = data["tree"]
    assert sum(tree["s"][1]) == pytest.approx(truth, rel=0.02)
    # one root per process, named by title and pid
    roots = {data["strings"][tree["n"][k]] for k in range(1, len(tree["p"]))
             if k - tree["p"][k] == 0}
    assert any(f"[pid {loaded['pids']['leaker'][0]}" in r for r in roots), sorted(roots)[:5]
    assert "processes:" in data["title"], data["title"]
    dot = tmp_path / "graph.dot"
    p = _hs("graph", str(session), "-o", str(dot), "--nodefraction", "0", cache=cache)
    assert p.returncode == 0, p.stderr
    m = re.search(r"Total: ([0-9.]+) (B|KiB|MiB|GiB)", dot.read_text())
    assert m is not None
    unit = {"B": 1, "KiB": 1024, "MiB": 2**20, "GiB": 2**30}[m.group(2)]
    assert float(m.group(1)) * unit == pytest.approx(truth, rel=0.02)
    assert os.path.getsize(dot) > 0


# ------------------------------------------------------------------------------------------
# Pictures of the session, kept as artifacts


SVG = "{http://www.w3.org/2000/svg}"


def _legend(html: str) -> list[tuple[tuple[tuple[str, str], ...], str]]:
    """The chart's legend: each entry's line styles (colour, dashes) and text."""
    root = ET.fromstring(html[html.index("<svg"):html.index("</svg>") + len("</svg>")])
    return [(tuple((ln.get("stroke", ""), ln.get("stroke-dasharray", ""))
                   for ln in e.iter(f"{SVG}line")),
             "".join(t.text or "" for t in e.iter(f"{SVG}text")))
            for e in root.iter(f"{SVG}g") if e.get("class") == "entry"]


def test_timeline_has_a_style_and_a_name_per_process(loaded: dict[str, Any],
                                                     tmp_path: Path) -> None:
    session, cache = loaded["session"], loaded["cache"]
    html = tmp_path / "timeline.html"
    p = _hs("timeline", str(session), "-o", str(html), cache=cache)
    assert p.returncode == 0, p.stderr
    legend = _legend(html.read_text())
    # A short legend: a few processes drawn one by one (the leaker first), the rest added up.
    assert len(legend) <= 10, legend
    drawn = {int(m.group(2)): (styles, m.group(1)) for styles, text in legend
             if (m := re.match(r"(.*?) \[pid (\d+), \w+\]: RSS ", text))}
    (leaker,) = loaded["pids"]["leaker"]
    assert next(iter(drawn)) == leaker, legend
    # every process with RSS samples or a series of dumps has a line
    dumps: dict[int, int] = {}
    for name in os.listdir(session / "dumps"):
        if name.startswith("jeprof.") and name.endswith(".heap"):
            dumps[int(name.split(".")[1])] = dumps.get(int(name.split(".")[1]), 0) + 1
    processes = {int(line.split(",")[1]) for line in
                 (session / "rss.csv").read_text().splitlines()[1:]}
    processes |= {pid for pid, n in dumps.items() if n > 1}
    if len(processes) > 6:
        assert len(drawn) == 5
        assert sum(text.startswith(f"{len(processes) - 5} other processes (sum): RSS ")
                   for _, text in legend) == 1, legend
    else:
        assert set(drawn) == processes
    # one look per process: no two processes' lines alike
    assert len({styles for styles, _ in drawn.values()}) == len(drawn), drawn
    # named as ps shows them: the backends by their title, the postmaster by its command
    names = {pid: name for pid, (_, name) in drawn.items()}
    assert names[leaker].startswith("postgres: postgres postgres [local]"), names
    if loaded["pids"]["postmaster"] in names:
        assert names[loaded["pids"]["postmaster"]].startswith("postgres -D"), names
    ARTIFACTS.mkdir(exist_ok=True)
    png = ARTIFACTS / "postgres-timeline.png"
    # The picture kept from the last run is replaced on purpose.
    p = _hs("timeline", str(session), "-o", str(png), "--force", cache=cache)
    assert p.returncode == 0 and png.stat().st_size > 10_000, p.stderr


def test_flamegraph_has_a_root_per_process(loaded: dict[str, Any], driver: Any,  # noqa: F811
                                           tmp_path: Path) -> None:
    session, cache = loaded["session"], loaded["cache"]
    html = tmp_path / "flame.html"
    p = _hs("flamegraph", str(session), "-o", str(html), cache=cache)
    assert p.returncode == 0, p.stderr
    open_page(driver, html)
    title = driver.find_element("id", "title").text
    # titled by the program, its processes and the time of their last dumps
    assert re.match(rf"postgres · {len(_latest(session))} processes: postgres", title), title
    assert re.search(r" · the last dump of each, up to \d+\.\d s$", title), title
    roots = {f["name"] for f in frames(driver) if f["depth"] == 1}
    (leaker,) = loaded["pids"]["leaker"]
    for pid in [leaker, *loaded["pids"]["load"], loaded["pids"]["postmaster"]]:
        assert sum(f"[pid {pid}, " in r for r in roots) == 1, (pid, sorted(roots))
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "postgres-flamegraph.png"))
