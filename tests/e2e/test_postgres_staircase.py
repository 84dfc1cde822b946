"""PostgreSQL 15 for eighty seconds under ``heapscope run --every 2`` at jemalloc's default
sample period (512 KiB): a leak and a bounded pool that AllocSet serves as the same
staircase of doubling blocks, told apart.

The server runs as ``postgres`` (runuser) behind heapscope running as root, as in
test_postgres_series.py. Three pgbench runs share it for eighty seconds, each under its own
application_name:

- ``leaker``: one client calling leakext's ``leak_blocks(20, 200)`` a hundred times a second:
  2,000 chunks of 200 B a second (~0.5 MB/s) into TopMemoryContext, never freed. AllocSet
  serves them from blocks that double up to 8 MB, so jemalloc sees a few big objects that
  are never freed arriving in a rhythm (an 8 MB block about every fifteen seconds once the
  doubling is done), not a steady ramp;
- ``pool``: one client calling ``pool_fill(20, 200, 24 MiB)`` at the same rate: the same
  staircase in a context of its own, until the context holds 24 MiB of blocks (after 16 MiB
  of chunks, ~31 s), then nothing more;
- ``load``: three clients running a query as fast as they can.

Then the clients disconnect and the server shuts down (pg_ctl -m fast).

Truth: the leaker's backend leaks in leak_blocks, 20 chunks of 272 B (200 B rounded up to
AllocSet's 256 B size class, plus its 16 B chunk header) per transaction pgbench reports;
its blocks are malloc'd ahead of the chunks, by at most one 8 MiB block. The pool's backend
holds exactly 24 MiB of pool blocks from its first half-minute on and never more: bounded,
not a leak (checked in the server's own accounting, pg_log_backend_memory_contexts, halfway
through the run). The load's backends, the postmaster and the auxiliary processes leak
nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import scenarios as sc
from scenarios import *  # noqa: F403  (registers scenarios.FIXTURES in this module)
from scenarios import PgCluster

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MiB = 1024 * 1024
# run_argv always passes --sample: give it jemalloc's own default (lg_prof_sample 19), the
# period a user who passes nothing gets, at which the small blocks are rarely sampled.
SAMPLE = 512 * 1024
EVERY = 2  # seconds between dumps
SECONDS = 80
RATE = 100  # calls a second of the leaker and of the pool (pgbench -R)
CHUNKS, CHUNK_SIZE = 20, 200  # per call, for both
# What one 200 B chunk takes in an AllocSet block: its 256 B size class and a 16 B header.
CHUNK_BYTES = 256 + 16
PER_CALL = CHUNKS * CHUNK_BYTES
POOL_CAP = 24 * MiB
MAX_BLOCK = 8 * MiB  # ALLOCSET_DEFAULT_MAXSIZE: the largest block, and the step of the stairs
# One standard deviation of jemalloc's estimate of a staircase's blocks at a 512 KiB period
# is ~0.77 MiB (the 8 MiB blocks are always sampled; the ones below 4 MiB are the noise:
# sqrt(sum of size² (1-p)/p) with p = 1 - exp(-size/period)); three of them:
SAMPLING = 2.5 * MiB

LEAK_SQL = f"SELECT leak_blocks({CHUNKS}, {CHUNK_SIZE});\n"
POOL_SQL = f"SELECT pool_fill({CHUNKS}, {CHUNK_SIZE}, {POOL_CAP});\n"
LOAD_SQL = "SELECT count(*) FROM generate_series(1, 20000);\n"

_POOL_LOG = re.compile(r"leakext pool: (\d+) total in (\d+) blocks")


@dataclass
class Staircase:
    """The one run of the scenario and what heapscope said about it."""

    session: Path
    pids: dict[str, list[int]]  # application_name (and "postmaster") -> backend pids
    calls: dict[str, int]  # application_name -> transactions pgbench processed
    report: dict[str, Any]  # the session's report.json
    leaks_exit: int  # heapscope leaks --fail-on-leak --format json SESSION
    leaks_json: dict[str, Any]
    leaks_stderr: str
    pool_halfway: int  # bytes in the pool's context halfway through, as the server counts
    output: str  # heapscope run's (and the server's) output

    def suspects(self, pid: int, report: dict[str, Any] | None = None
                 ) -> list[dict[str, Any]]:
        doc = self.report if report is None else report
        return [s for s in doc["suspects"] if s["pid"] == pid]

    def top_site(self, pid: int) -> dict[str, Any]:
        """The site of ``pid`` holding the most at its last judged dump."""
        sites = self.suspects(pid)
        assert sites, (pid, self.output[-2000:])
        return max(sites, key=lambda s: s["bytes"])


def _pool_bytes(cluster: PgCluster, pid: int, log: Path) -> int:
    """The pool's blocks in backend ``pid`` as the server counts them: it logs its memory
    contexts when asked (at its next interrupt check, a query or two later)."""
    seen = len(_POOL_LOG.findall(log.read_text(errors="replace")))
    cluster.psql(f"SELECT pg_log_backend_memory_contexts({pid})")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        found = _POOL_LOG.findall(log.read_text(errors="replace"))
        if len(found) > seen:
            return int(found[-1][0])
        time.sleep(0.2)
    raise sc.ScenarioError(f"backend {pid} logged no 'leakext pool' context in {log}")


def _hs(*args: str, cache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*sc.HEAPSCOPE, *args], env=sc.heapscope_env(cache),
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def staircase(pg_cluster: PgCluster, leakext_so: Path, heapscope_cache: Path,
              libjemalloc: Path) -> Staircase:
    base = pg_cluster.base
    session = base / "staircase-session"
    scripts = pg_cluster.owned_dir(base / "pgbench-staircase")
    for name, sql in (("leak", LEAK_SQL), ("pool", POOL_SQL), ("load", LOAD_SQL)):
        (scripts / f"{name}.sql").write_text(sql)
    log = base / "staircase-run.log"
    argv = sc.run_argv(session, pg_cluster.server_cmd(), sample=SAMPLE,
                       options=("--every", str(EVERY)))
    # Stopped with pg_ctl -m fast, as test_postgres_series.py does (a smart shutdown under
    # pgbench was seen to wait for minutes).
    with pg_cluster.serving(argv, sc.heapscope_env(heapscope_cache), log, forward=False):
        started = time.monotonic()
        sql = sc.build.leakext_sql(leakext_so).replace("CREATE FUNCTION",
                                                       "CREATE OR REPLACE FUNCTION")
        pg_cluster.psql(sql)
        runs = {app: pg_cluster.pgbench(scripts / f"{name}.sql", clients, rate, app, SECONDS)
                for app, name, clients, rate in (("leaker", "leak", 1, RATE),
                                                 ("pool", "pool", 1, RATE),
                                                 ("load", "load", 3, None))}
        time.sleep(2)
        pids = {app: pg_cluster.backends(app) for app in runs}
        postmaster = pg_cluster.postmaster_pid()
        assert postmaster is not None
        pids["postmaster"] = [postmaster]
        assert [len(pids[a]) for a in ("leaker", "pool", "load")] == [1, 1, 3], pids
        # Halfway, the pool has been full for ten seconds: 16 MiB of chunks take ~31 s.
        time.sleep(max(0.0, started + SECONDS / 2 - time.monotonic()))
        pool_halfway = _pool_bytes(pg_cluster, pids["pool"][0], log)
        calls = {}
        for app, p in runs.items():
            out, _ = p.communicate(timeout=SECONDS + 60)
            assert p.returncode == 0, (app, out)
            m = re.search(r"number of transactions actually processed: (\d+)", out)
            assert m is not None, (app, out)
            calls[app] = int(m.group(1))
    if pool_halfway != POOL_CAP:
        raise sc.ScenarioError(f"the pool holds {pool_halfway} bytes halfway, not its cap "
                               f"{POOL_CAP}: the scenario's truth does not hold")
    report = json.loads((session / "report.json").read_text())
    leaks = _hs("leaks", "--fail-on-leak", "--format", "json", str(session),
                cache=heapscope_cache)
    try:
        leaks_json = json.loads(leaks.stdout)
    except ValueError as e:
        raise sc.ScenarioError(f"heapscope leaks printed no JSON ({leaks.returncode}): "
                               f"{leaks.stderr[-2000:]}") from e
    return Staircase(session, pids, calls, report, leaks.returncode, leaks_json,
                     leaks.stderr, pool_halfway, log.read_text(errors="replace"))


def _evidence(site: dict[str, Any]) -> dict[str, Any]:
    keys = ("pid", "function", "verdict", "bytes", "growth_bytes", "judged_dumps", "samples",
            "new_samples", "trend_z", "p_value", "slowdown_z", "rise_z", "first_growth")
    return {k: site.get(k) for k in keys} | {
        "series_MiB": [round(v / MiB, 2) for v in site.get("series", [])]}


def test_every_process_of_the_scenario_was_judged(staircase: Staircase) -> None:
    procs = {p["pid"]: p for p in staircase.report["processes"]}
    # ~40 rounds: the verdicts below rest on a real series, whatever they are
    for app, pids in staircase.pids.items():
        for pid in pids:
            assert procs[pid]["judged_dumps"] >= SECONDS // EVERY // 2, (app, procs[pid])


def test_leaker_is_a_leak_in_leak_blocks(staircase: Staircase) -> None:
    (leaker,) = staircase.pids["leaker"]
    leaks = [s for s in staircase.suspects(leaker) if s["verdict"] == "leak"]
    assert any(s["function"] == "leak_blocks" for s in leaks), \
        _evidence(staircase.top_site(leaker))


def test_fail_on_leak_exits_10_for_the_leaker(staircase: Staircase) -> None:
    (leaker,) = staircase.pids["leaker"]
    leaks = [s for s in staircase.suspects(leaker, staircase.leaks_json)
             if s["verdict"] == "leak"]
    assert staircase.leaks_exit == 10, (staircase.leaks_exit, staircase.leaks_stderr[-1000:])
    assert any(s["function"] == "leak_blocks" for s in leaks), staircase.leaks_stderr[-1000:]
    # and for the leaker alone: no other process adds leaks, or growth it could not judge
    # (which the gate holds against a process too), to what the gate counts
    others = [p for p in staircase.leaks_json["processes"]
              if p["pid"] != leaker and (p["leak_bytes"] or p["growing_bytes"])]
    assert not others, others[:3]


def test_no_leak_outside_the_leaker(staircase: Staircase) -> None:
    pids = staircase.pids
    for app in ("load", "postmaster", "pool"):
        for pid in pids[app]:
            leaks = [s for s in staircase.suspects(pid) if s["verdict"] == "leak"]
            assert not leaks, (app, [_evidence(s) for s in leaks[:3]])


def test_pool_is_bounded_at_its_cap(staircase: Staircase) -> None:
    (pool,) = staircase.pids["pool"]
    top = staircase.top_site(pool)
    assert top["function"] == "pool_fill", _evidence(top)
    assert top["verdict"] == "bounded", _evidence(top)
    procs = {p["pid"]: p for p in staircase.report["processes"]}
    # it stopped, but it took twenty times what it held at its first dump: not "clean"
    assert procs[pool]["verdict"] == "grew, bounded", procs[pool]
    assert procs[pool]["bounded_bytes"] >= 0.75 * POOL_CAP, procs[pool]
    # Its blocks come to the cap exactly (the server said so halfway); jemalloc's estimate
    # of them is within its sampling noise.
    assert abs(top["bytes"] - POOL_CAP) <= SAMPLING, _evidence(top)
    # Growth is counted from the backend's first dump, a round or two after its first call:
    # by then the pool held at most a few MiB (4 MiB of blocks once 2 MiB of chunks, ~4 s
    # of calls, are in), so three quarters of the cap at least, and never more than it.
    assert 0.75 * POOL_CAP <= top["growth_bytes"] <= POOL_CAP + SAMPLING, _evidence(top)


def test_leaker_holds_what_its_calls_left(staircase: Staircase) -> None:
    (leaker,) = staircase.pids["leaker"]
    top = staircase.top_site(leaker)
    assert top["function"] == "leak_blocks", _evidence(top)
    # The leaker's exit dump is set aside (it came after the last call, off the series'
    # clock): "bytes" is the site at its last dump taken as the backend ran.
    at_exit = staircase.calls["leaker"] * PER_CALL
    # That dump came before the backend's last calls: take them off by the dumps' own times.
    dumps = sorted((staircase.session / "dumps").glob(f"jeprof.{leaker}.*.heap"),
                   key=lambda d: d.stat().st_mtime)
    running = [d for d in dumps if ".f." not in d.name]
    assert running and dumps[-1] not in running, [d.name for d in dumps]
    gap = dumps[-1].stat().st_mtime - running[-1].stat().st_mtime
    rate = staircase.calls["leaker"] / SECONDS
    # a second more than the gap: the calls in it are a Poisson count (pgbench -R), ~200 ± 14
    chunks = at_exit - (gap + 1) * rate * PER_CALL
    # AllocSet mallocs a block before the chunks that fill it: at most one 8 MiB block more
    # than the chunks need; its earlier blocks (and the free end of the one TopMemoryContext
    # had when the first call came, a few kB) are sampled with the noise SAMPLING allows.
    assert chunks - SAMPLING <= top["bytes"] <= at_exit + MAX_BLOCK + SAMPLING, (
        {"calls": staircase.calls["leaker"], "chunks_MiB": round(chunks / MiB, 2),
         "at_exit_MiB": round(at_exit / MiB, 2), "gap_s": round(gap, 2)}, _evidence(top))
