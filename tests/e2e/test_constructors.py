"""A program's own allocation helpers and constructors fold into the caller that grew.

``sites/memalloc.c`` has its own ``mem_alloc`` with two callers, one leaking: built at -O1
(mem_alloc called) and -O2 (mem_alloc inlined into both callers), run under ``heapscope run
--every``, the leaking caller must be the site ``via mem_alloc`` in the run's report,
``leaks``, ``top`` of a dump taken as it ran and ``top`` of the session (its dump written at
exit, where only the leaking caller's memory is left: one caller, but folded with the
wrappers the whole series showed).

Real Redis, when a ``redis-server`` is at hand (``build/redis`` from Debian's package, or
on PATH), grows its keyspace: its keys are named at ``dbAdd``, with Redis's constructors
(``_sdsnewlen``…) in ``via``, without ``--alloc-fn``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from pathlib import Path

import jemalloc as je
import pytest
import sitecheck as sc

pytestmark = pytest.mark.e2e

SITES = Path(__file__).resolve().parent / "sites"
REPO = Path(__file__).resolve().parents[2]
# By hand from sites/memalloc.c: 30 steps x 40 sessions x 1,024 bytes (a size class).
SESSIONS_BYTES = 30 * 40 * 1024


@pytest.fixture(scope="module", params=["-O1", "-O2"])
def memalloc(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             gcc: Path, libjemalloc: Path) -> tuple[sc.Session, Path]:
    work = tmp_path_factory.mktemp("memalloc").resolve()
    je.build([SITES / "memalloc.c"], work / "memalloc", (request.param, "-g"), compiler=gcc)
    cache = work / "cache"
    s = sc.run([work / "memalloc"], work / "session", cache, cwd=work,
               options=("--every", "0.25", "-v"))
    assert s.proc.returncode == 0, s.describe()
    return s, cache


def _via(row: dict[str, object]) -> list[tuple[object, object]]:
    via = row["via"]
    assert isinstance(via, list)
    return [(v["function"], v["kind"]) for v in via]


def test_the_leaking_caller_is_the_site_via_mem_alloc(memalloc: tuple[sc.Session, Path]
                                                      ) -> None:
    s, cache = memalloc
    line = je.source_line(SITES / "memalloc.c", "sessions")
    # The run's report.
    first = s.suspects()[0]
    assert (first["function"], first["line"], first["verdict"]) == \
        ("remember_sessions", line, "leak"), s.describe()
    assert _via(first) == [("mem_alloc", "wrapper")], first
    assert abs(first["bytes"] - SESSIONS_BYTES) <= sc.TOLERANCE * SESSIONS_BYTES, first
    assert not any(x["function"] == "mem_alloc" for x in s.suspects()), s.describe()
    ring = next(x for x in s.suspects() if x["function"] == "handle_request")
    assert ring["verdict"] != "leak" and _via(ring) == [("mem_alloc", "wrapper")], ring
    assert {"function": "mem_alloc", "why": "profile", "callers": 2} in s.report["wrappers"]
    assert "folded as allocation wrappers: mem_alloc (2 callers)" in s.proc.stderr
    # The run's text report (on stderr: stdout is the program's).
    shown = [ln for ln in s.proc.stderr.splitlines() if " 1. LEAK " in ln]
    assert len(shown) == 1 and "remember_sessions" in shown[0] and \
        shown[0].rstrip().endswith(f"memalloc.c:{line} via mem_alloc  (pid {s.pid})"), \
        s.proc.stderr
    # leaks, read again from the session.
    p = je.run_heapscope("leaks", "--format", "json", str(s.path), cache=cache, check=True,
                         unprofiled=True)
    head = json.loads(p.stdout)["suspects"][0]
    assert (head["function"], head["line"]) == ("remember_sessions", line), head
    assert _via(head) == [("mem_alloc", "wrapper")], head
    # top of the last dump taken as it ran (both callers' memory live): one row per caller.
    last = max((s.path / "symbolized").glob(f"jeprof.{s.pid}.*.m*.heap*"),
               key=lambda p: int(p.name.split(".")[2]))
    rows = [r for r in sc.top_rows(last, cache) if r["flat"] > 0]
    assert [r["name"] for r in rows[:2]] == ["handle_request", "remember_sessions"], rows[:3]
    assert all(_via(r) == [("mem_alloc", "wrapper")] for r in rows[:2]), rows[:2]
    assert not any(r["name"] == "mem_alloc" for r in rows), rows
    # top of the session (its dump at exit, where only the leaking caller's memory is left):
    # folded with the wrappers the whole series showed, it names the caller too.
    rows = [r for r in sc.top_rows(s.path, cache) if r["flat"] > 0]
    assert rows[0]["name"] == "remember_sessions", rows[:3]
    assert _via(rows[0]) == [("mem_alloc", "wrapper")], rows[0]
    assert not any(r["name"] == "mem_alloc" for r in rows), rows


# ---------------------------------------------------------------------------- callers in the code
# By hand from sites/codecallers.c: 2,000 x 512 bytes and 2,000 x 256 bytes (size classes).
NAMES_BYTES, ROWS_BYTES = 2000 * 512, 2000 * 256


@pytest.mark.parametrize("level", ["-O1", "-O2"])
def test_a_helper_with_one_caller_at_run_time_folds_by_its_callers_in_the_code(
        tmp_path: Path, gcc: Path, libjemalloc: Path, level: str) -> None:
    source = SITES / "codecallers.c"
    je.build([source], tmp_path / "codecallers", (level, "-g"), compiler=gcc)
    cache = tmp_path / "cache"
    s = sc.run([tmp_path / "codecallers"], tmp_path / "session", cache, cwd=tmp_path,
               options=("-v",))
    assert s.proc.returncode == 0, s.describe()
    by_function = {x["function"]: x for x in s.suspects()}
    names = by_function["keep_names"]
    assert names["line"] == je.source_line(source, "names"), names
    assert [v["function"] for v in names["via"]] == ["xmalloc", "buf_reserve"], names
    assert abs(names["bytes"] - NAMES_BYTES) <= sc.TOLERANCE * NAMES_BYTES, names
    assert "buf_reserve" not in by_function, s.describe()
    assert "buf_reserve (1 caller here, 4 in the program's code)" in s.proc.stderr
    assert {"function": "buf_reserve", "why": "profile", "callers": 1,
            "callers_in_code": 4} in s.report["wrappers"]
    # fill_table calls malloc itself: it keeps its memory as far as a dump can tell, and
    # stays the site (its one caller is the next line of its stack).
    rows = by_function["fill_table"]
    assert (rows["line"], rows["via"]) == (je.source_line(source, "rows"), []), rows
    assert rows["stack"][1].startswith("load_rows "), rows
    assert abs(rows["bytes"] - ROWS_BYTES) <= sc.TOLERANCE * ROWS_BYTES, rows
    # top of the session, read again: the same names.
    top = [r["name"] for r in sc.top_rows(s.path, cache) if r["flat"] > 0]
    assert top[:2] == ["keep_names", "fill_table"], top


# ---------------------------------------------------------------------------- Redis


def _redis() -> Path | None:
    local = REPO / "build" / "redis" / "usr" / "bin" / "redis-server"
    if local.exists():
        return local
    found = shutil.which("redis-server")
    return Path(found) if found else None


def _grow_keyspace(port: int, value: int, churn: bool) -> None:
    """SET 120,000 keys that stay (values of ``value`` bytes) in six waves, with (``churn``)
    as many that come and go."""
    for _ in range(200):
        try:
            conn = socket.create_connection(("127.0.0.1", port), timeout=60)
            break
        except OSError:
            time.sleep(0.05)
    else:
        return
    replies = conn.makefile("rb")

    def send(*args: bytes) -> None:
        out = b"*%d\r\n" % len(args)
        conn.sendall(out + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args))

    n = 0
    for _wave in range(6):
        for i in range(20000):
            send(b"SET", b"user:%d" % n, b"v" * value)
            if churn:
                send(b"SET", b"tmp:%d" % i, b"t" * value)
            n += 1
        if churn:
            for i in range(20000):
                send(b"DEL", b"tmp:%d" % i)
        for _ in range(60000 if churn else 20000):
            replies.readline()
        time.sleep(0.4)
    send(b"SHUTDOWN", b"NOSAVE")
    conn.close()


# 100-byte values with keys that come and go (sds strings made by several callers), and
# 40-byte values set alone (redis-benchmark's shape: values embedded in their objects, the
# keys' strings made by dbAdd through sdsdup's tail call). Whether a dump also shows
# _sdsnewlen's other callers depends on which of the server's start-up strings were
# sampled; its callers in the program's code (symbols/callsites.py) fold it either way.
@pytest.mark.parametrize(("value", "churn"), [(100, True), (40, False)])
def test_redis_keyspace_is_named_at_its_callers(tmp_path: Path, libjemalloc: Path,
                                                value: int, churn: bool) -> None:
    server = _redis()
    if server is None:
        pytest.skip("redis-server not found: unpack Debian's redis-tools into build/redis "
                    "(apt-get download redis-tools liblzf1; dpkg-deb -x)")
    libs = server.parents[1] / "lib" / "x86_64-linux-gnu"
    env = {"LD_LIBRARY_PATH": str(libs)} if libs.is_dir() else {}
    port = 20000 + os.getpid() % 20000
    client = threading.Thread(target=_grow_keyspace, args=(port, value, churn), daemon=True)
    client.start()
    session = tmp_path / "s"
    p = je.run_heapscope("run", "-o", str(session), "--sample", "16k", "--every", "0.5",
                         "--", str(server), "--port", str(port), "--save", "",
                         "--appendonly", "no", cache=tmp_path / "c", env=env, timeout=300,
                         unprofiled=True)
    client.join(timeout=60)
    assert p.returncode == 0, p.stderr
    suspects = json.loads((session / "report.json").read_text())["suspects"]
    names = [x["function"] for x in suspects]
    constructors = {"_sdsnewlen", "sdsnewlen", "createObject", "createStringObject",
                    "createEmbeddedStringObject"}
    assert not constructors & set(names[:5]), names
    keys = next(x for x in suspects if x["function"] == "dbAdd")
    assert "_sdsnewlen" in [v["function"] for v in keys["via"]], keys
    assert keys["verdict"] in ("leak", "growing"), keys
