"""`heapscope run` on realistic leaking programs: pre-fork server, threads, Python +
ctypes, a JVM leaking zlib memory, and PostgreSQL leaking in TopMemoryContext.

Each scenario runs ONCE per session through ``heapscope run -o SESSION --sample 4096 --
CMD`` (fixtures in scenarios.py); the tests check report.json against the truth in the
scenario's header comment (tests/e2e/scenarios/). The ``*_truth`` tests run the same
program by hand (LD_PRELOAD + MALLOC_CONF, read with ``heapscope top``): when they pass
and a run test fails, the fault is in `heapscope run`, not in the scenario.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import scenarios as sc
from scenarios import *  # noqa: F403  (registers scenarios.FIXTURES in this module)
from scenarios import PgCluster, ScenarioRun

pytestmark = pytest.mark.e2e

ZLIB_FRAME = re.compile(r"\b(inflate\w*|updatewindow|Java_java_util_zip_Inflater_\w+)\b|libz\.so")


def _near(value: float, truth: float, rel: float = 0.25) -> bool:
    return abs(value - truth) <= rel * truth


def _top(dump: Path, cache: Path, *args: str) -> tuple[float, list[dict[str, Any]]]:
    out = sc.heapscope_top_json(dump, cache, *args)
    return float(out["total"]), list(out["rows"])


def _flat_leader(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return max(rows, key=lambda r: r["flat"])


def _cum(rows: list[dict[str, Any]], name: str) -> float:
    return max((r["cum"] for r in rows if r["name"] == name), default=0.0)


def _stack_text(suspect: dict[str, Any]) -> str:
    return "\n".join(map(str, suspect.get("stack") or []))


def _assert_first_suspect(run: ScenarioRun, function: str, pid: int, file: str) -> None:
    """The leaking line is ranked first. Each process left one dump (at exit), which shows
    what is live but not what grows: the site is ``live``, the process ``unjudged``, and
    what it left live beyond runtime start-up is the leak."""
    first = run.first_suspect
    assert first["function"] == function, run.describe()
    assert first["pid"] == pid, run.describe()
    assert Path(str(first.get("file") or "")).name == file, run.describe()
    assert first["verdict"] == "live", run.describe()
    stack = first.get("stack") or []
    assert stack and str(stack[0]).startswith(f"{function} "), run.describe()
    proc = run.process(pid)
    assert proc["verdict"] == "unjudged" and proc["leaks"] is False, run.describe()
    assert proc["left_bytes"] >= first["bytes"], run.describe()
    assert not [s for s in run.suspects if s["verdict"] == "leak"], run.describe()


# --------------------------------------------------------------------------------------
# prefork.c: master + 3 workers, worker 2 leaks in leak_in_worker (5,120,000 B)


def test_prefork_truth(
    prefork_bin: Path, scenario_dir: Path, heapscope_cache: Path, libjemalloc: Path
) -> None:
    run = sc.run_direct([prefork_bin], scenario_dir / "truth_prefork", libjemalloc)
    pids = sc.parse_pids(run.stdout, sc.PREFORK_PIDS)
    assert set(pids) == {"master", "worker index=1", "worker index=2", "worker index=3"}
    _total, rows = _top(run.dump(pids["worker index=2"]), heapscope_cache)
    assert _flat_leader(rows)["name"] == "leak_in_worker"
    assert _near(_cum(rows, "leak_in_worker"), sc.PREFORK_LEAK_BYTES)
    for role in ("master", "worker index=1", "worker index=3"):
        other, _ = _top(run.dump(pids[role]), heapscope_cache)
        assert other < 256 * 1024, (role, other)  # libstdc++'s emergency pool only


def test_prefork_first_suspect_is_worker_2(prefork_run: ScenarioRun) -> None:
    assert prefork_run.returncode == 0, prefork_run.describe()
    worker2 = prefork_run.pids["worker index=2"]
    _assert_first_suspect(prefork_run, "leak_in_worker", worker2, "prefork.c")
    assert _near(prefork_run.first_suspect["bytes"], sc.PREFORK_LEAK_BYTES), prefork_run.describe()
    assert prefork_run.first_suspect["pid"] != prefork_run.pids["master"]


def test_prefork_follows_every_worker(prefork_run: ScenarioRun) -> None:
    pids = prefork_run.pids
    assert len(pids) == 4, prefork_run.stdout
    master = prefork_run.process(pids["master"])
    assert master["left_bytes"] < 256 * 1024, prefork_run.describe()
    for i in (1, 2, 3):
        worker = prefork_run.process(pids[f"worker index={i}"])
        assert worker["ppid"] == pids["master"], prefork_run.describe()
        # What each worker left live at exit, the config it inherited aside: worker 2's
        # leak, and no more than libstdc++'s emergency pool in the others.
        if i == 2:
            assert _near(worker["left_bytes"], sc.PREFORK_LEAK_BYTES), prefork_run.describe()
        else:
            assert worker["left_bytes"] < 256 * 1024, prefork_run.describe()
    assert not [s for s in prefork_run.suspects if s["verdict"] == "leak"], prefork_run.describe()


# --------------------------------------------------------------------------------------
# threads.c: 4 named threads, "cache-fill" leaks in thread_leak (5,120,000 B)


def test_threads_truth(
    threads_bin: Path, scenario_dir: Path, heapscope_cache: Path, libjemalloc: Path
) -> None:
    run = sc.run_direct([threads_bin], scenario_dir / "truth_threads", libjemalloc)
    pid = sc.parse_pids(run.stdout, r"^(?P<role>pid)=(?P<pid>\d+)$")["pid"]
    _total, rows = _top(run.dump(pid), heapscope_cache)
    assert _flat_leader(rows)["name"] == "thread_leak"
    assert _near(_cum(rows, "thread_leak"), sc.THREADS_LEAK_BYTES)


def test_threads_first_suspect_is_thread_leak(threads_run: ScenarioRun) -> None:
    assert threads_run.returncode == 0, threads_run.describe()
    _assert_first_suspect(threads_run, "thread_leak", threads_run.pids["pid"], "threads.c")
    assert _near(threads_run.first_suspect["bytes"], sc.THREADS_LEAK_BYTES), threads_run.describe()


# --------------------------------------------------------------------------------------
# leaky.py + libcleak.so: cl_make_record leaks 20,000 x 1 KiB in the python process


def test_ctypes_truth(
    libcleak_so: Path, scenario_dir: Path, heapscope_cache: Path, libjemalloc: Path
) -> None:
    cmd: list[str | Path] = [sys.executable, sc.build.LEAKY_PY, libcleak_so, str(sc.CTYPES_RECORDS)]
    run = sc.run_direct(cmd, scenario_dir / "truth_ctypes", libjemalloc)
    pid = sc.parse_pids(run.stdout, r"^(?P<role>pid)=(?P<pid>\d+) records=")["pid"]
    total, rows = _top(run.dump(pid), heapscope_cache)
    assert _flat_leader(rows)["name"] == "cl_make_record"
    assert _near(_cum(rows, "cl_make_record"), sc.CTYPES_LEAK_BYTES)
    assert _cum(rows, "cl_make_record") > 0.8 * total  # python's own allocations rank lower


def test_ctypes_first_suspect_is_cl_make_record(ctypes_run: ScenarioRun) -> None:
    assert ctypes_run.returncode == 0, ctypes_run.describe()
    _assert_first_suspect(ctypes_run, "cl_make_record", ctypes_run.pids["pid"], "libcleak.c")
    assert _near(ctypes_run.first_suspect["bytes"], sc.CTYPES_LEAK_BYTES), ctypes_run.describe()


# --------------------------------------------------------------------------------------
# InflaterLeak.java: 1,000 Inflaters never end()ed: zlib windows (32 KiB) + states (7 KiB)


def test_inflater_truth(
    inflater_leak_classes: Path,
    java_tools: tuple[Path, Path],
    scenario_dir: Path,
    heapscope_cache: Path,
    libjemalloc: Path,
) -> None:
    cmd: list[str | Path] = [
        java_tools[0],
        "-Xmx256m",
        "-cp",
        inflater_leak_classes,
        "InflaterLeak",
        str(sc.INFLATERS),
    ]
    run = sc.run_direct(cmd, scenario_dir / "truth_inflater", libjemalloc, timeout=180)
    pid = sc.parse_pids(run.stdout, r"^(?P<role>pid)=(?P<pid>\d+) inflaters=")["pid"]
    total, rows = _top(run.dump(pid), heapscope_cache, "--frames", "raw")
    # the window: libz's static updatewindow (no symbol: "libz.so.1.x+0x…") under inflate
    window = _cum(rows, "Java_java_util_zip_Inflater_inflateBytesBytes")
    assert _near(window, sc.INFLATERS * 32 * 1024), (window, total)
    assert _cum(rows, "inflateInit2_") > sc.INFLATERS * 6 * 1024
    assert _cum(rows, "Java_java_util_zip_Inflater_init") >= _cum(rows, "inflateInit2_")
    zlib_flat = sum(r["flat"] for r in rows if str(r["module"]).startswith("libz.so"))
    assert zlib_flat > 0.5 * total, (zlib_flat, total)
    # By site, zlib folds into the JNI entry points the Java methods called.
    _, sites = _top(run.dump(pid), heapscope_cache)
    leader = _flat_leader(sites)
    assert leader["name"].startswith("Java_java_util_zip_Inflater_"), sites[:4]
    assert leader["via"] and leader["via"][0]["module"].startswith("libz.so"), leader


def test_inflater_first_suspect_is_zlib(inflater_run: ScenarioRun) -> None:
    run = inflater_run
    assert run.returncode == 0, run.describe()
    pid = run.pids["pid"]
    first = run.first_suspect
    assert first["pid"] == pid, run.describe()
    assert first["verdict"] == "live", run.describe()
    assert ZLIB_FRAME.search(_stack_text(first) + "\n" + str(first["function"])), run.describe()
    assert run.process(pid)["verdict"] == "unjudged", run.describe()
    zlib = sum(
        s["bytes"] for s in run.suspects if s["pid"] == pid and ZLIB_FRAME.search(_stack_text(s))
    )
    assert zlib > 0.7 * sc.INFLATERS * (32 + 7) * 1024, run.describe()


# --------------------------------------------------------------------------------------
# PostgreSQL 15 + leakext.so: leak_top(200000) pallocs in TopMemoryContext in one backend


@pytest.mark.slow
def test_postgres_truth(
    pg_cluster: PgCluster, leakext_so: Path, heapscope_cache: Path, libjemalloc: Path
) -> None:
    dumps = pg_cluster.base / "truth-dumps"
    dumps.mkdir(mode=0o1777)
    dumps.chmod(0o1777)  # the server's user writes here
    log = pg_cluster.base / "truth.log"
    proc = pg_cluster.start(pg_cluster.server_cmd(), sc.direct_env(libjemalloc, dumps), log)
    try:
        pg_cluster.wait_ready(proc, log)
        postmaster = pg_cluster.postmaster_pid()
        backend = pg_cluster.leak_session(leakext_so)
        pg_cluster.stop("fast")
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        pg_cluster.stop("immediate")
    assert postmaster is not None
    total, rows = _top(sc.final_dump(dumps, backend), heapscope_cache)
    leak = _cum(rows, "leak_top")
    assert leak > sc.PG_LEAK_MIN_BYTES and leak > 0.9 * total, (leak, total)
    # palloc and the unnamed AllocSetAlloc under it are PostgreSQL's allocator: pruned, so
    # the function that asked for the memory is the flat leader.
    assert _flat_leader(rows)["name"] == "leak_top"
    assert _cum(rows, "palloc") == 0
    pm_total, _ = _top(sc.final_dump(dumps, postmaster), heapscope_cache)
    assert pm_total < 0.05 * total, (pm_total, total)


@pytest.mark.slow
def test_postgres_first_suspect_is_leak_top_in_backend(postgres_run: ScenarioRun) -> None:
    run = postgres_run
    backend = run.pids["backend"]
    _assert_first_suspect(run, "leak_top", backend, "leakext.c")
    assert run.first_suspect["bytes"] > sc.PG_LEAK_MIN_BYTES, run.describe()
    # the dump was written by the server's user into the session heapscope created
    assert list((run.session / "dumps").glob(f"jeprof.{backend}.*.heap")), run.describe()


@pytest.mark.slow
def test_postgres_postmaster_is_not_the_leaker(postgres_run: ScenarioRun) -> None:
    run = postgres_run
    postmaster, backend = run.pids["postmaster"], run.pids["backend"]
    assert run.first_suspect["pid"] != postmaster, run.describe()
    assert run.process(backend)["ppid"] == postmaster, run.describe()
    assert run.process(backend)["left_bytes"] > sc.PG_LEAK_MIN_BYTES, run.describe()
    assert run.process(postmaster)["left_bytes"] < 0.05 * sc.PG_LEAK_MIN_BYTES, run.describe()
