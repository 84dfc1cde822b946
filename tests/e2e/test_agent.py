"""``heapscope agent`` scraped by a real Prometheus server.

Two real services run under jemalloc with profiling (``agentprog/agentsvc.c``): one leaks
16 KiB every 50 ms in ``leak_tick``, one keeps a bounded cache in ``cache_put``. The agent
watches both (found by a command-line pattern), Prometheus (Debian's ``prometheus``, started
here on 127.0.0.1 with a temporary TSDB) scrapes it every second, and PromQL through
Prometheus's HTTP API must show ``heapscope_site_leak == 1`` for the leaking site only, with
a positive growth rate. The shipped alert rules pass ``promtool check rules`` and
``promtool test rules``.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jemalloc as je
import pytest

from heapscope.formats.pprof import decode_profile

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
SERVICE_C = HERE / "agentprog" / "agentsvc.c"
RULES = HERE.parent.parent / "deploy" / "prometheus"
BLOCK = 16 * 1024
LEAK_RATE = BLOCK / 0.05  # bytes per second leak_tick keeps (one block per 50 ms tick)


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} not installed: apt-get install prometheus")
    return path


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory, gcc: Path, libjemalloc: Path
             ) -> Iterator[dict[str, subprocess.Popen[str]]]:
    if shutil.which("gdb") is None:
        pytest.skip("gdb not installed: apt-get install gdb")
    out = tmp_path_factory.mktemp("agent") / "agentsvc"
    je.build([SERVICE_C], out, ("-O1", "-g"))
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    env.update(LD_PRELOAD=str(libjemalloc), MALLOC_CONF="prof:true,lg_prof_sample:14")
    procs = {mode: subprocess.Popen([str(out), mode], env=env, stdout=subprocess.PIPE,
                                    text=True) for mode in ("leak", "cache")}
    try:
        for p in procs.values():
            assert p.stdout is not None and p.stdout.readline().startswith("ready")
        yield procs
    finally:
        for p in procs.values():
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=20)


def _pattern(services: dict[str, subprocess.Popen[str]], tail: str) -> str:
    """A --match pattern for this test session's services only (the binary's own path):
    other runs of the tests on the host are never picked up."""
    exe = str(services["leak"].args[0])
    return "^" + re.escape(exe) + " " + tail


def _query(port: int, promql: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=10) as r:
        doc = json.load(r)
    assert doc["status"] == "success", doc
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def test_prometheus_sees_the_leak_and_not_the_cache(
        services: dict[str, subprocess.Popen[str]], tmp_path: Path) -> None:
    prometheus = _tool("prometheus")
    agent_port, prom_port = je.free_port(), je.free_port()
    state = tmp_path / "state"
    agent = subprocess.Popen(
        [*je.HEAPSCOPE_CMD, "agent", "--match", _pattern(services, "(leak|cache)$"), "--every", "1",
         "--window", "12", "--top", "3", "--listen", f"127.0.0.1:{agent_port}",
         "--state", str(state)],
        env={**{k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV},
             "HEAPSCOPE_CACHE_DIR": str(tmp_path / "cache")},
        stderr=subprocess.PIPE, text=True)
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {RULES / 'heapscope-rules.yml'}\n"
        "scrape_configs:\n  - job_name: heapscope\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{agent_port}']\n")
    prom = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    leak_pid, cache_pid = str(services["leak"].pid), str(services["cache"].pid)
    try:
        deadline = time.monotonic() + 150
        leaking: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            time.sleep(2)
            assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
            try:
                leaking = _query(prom_port, "heapscope_site_leak == 1")
            except OSError:
                continue  # Prometheus still starting
            if leaking:
                break
        assert leaking, "no leak verdict reached Prometheus in 150 s"
        found = time.monotonic()
        sites = {(r["metric"]["pid"], r["metric"]["function"]) for r in leaking}
        assert (leak_pid, "leak_tick") in sites, sites
        growth = _query(prom_port, f'heapscope_site_growth_bytes_per_second{{pid="{leak_pid}",'
                                   'function="leak_tick"}')
        rate = max(float(r["value"][1]) for r in growth)
        # 320 KiB/s kept; sampled estimates and uneven dump times allow +-40%.
        assert rate == pytest.approx(LEAK_RATE, rel=0.4), rate
        live = _query(prom_port, f'heapscope_site_live_bytes{{pid="{cache_pid}",'
                                 'function="cache_put"}')
        # 64 entries of 16 KiB once the ring is full.
        assert float(live[0]["value"][1]) == pytest.approx(64 * BLOCK, rel=0.35), live
        per_process = {r["metric"]["pid"] for r in _query(prom_port, "heapscope_site_leak")}
        assert per_process == {leak_pid, cache_pid}
        # The top 3 sites of each process have series of their own, the rest one "other".
        counts = _query(prom_port, "count by (pid) (heapscope_site_live_bytes)")
        assert all(int(r["value"][1]) <= 4 for r in counts), counts
        # Until the window moves (12 dumps kept, older ones deleted and counted).
        while time.monotonic() < deadline:
            moved = _query(prom_port, "min(heapscope_dumps_dropped_total) > 0")
            if moved:
                break
            time.sleep(2)
        assert moved, "the window never moved in 150 s"
        window = _query(prom_port, "heapscope_process_window_dumps")
        assert {r["value"][1] for r in window} == {"12"}, window
        # What an alert acts on: a verdict that holds (the shipped rule waits 30 minutes).
        # Each round judges the window again, and a cache's sampled count may read as a
        # leak in one round now and then (the verdicts' stated rate: at most 3% of a
        # scenario's judgements), not round after round. Over the last 10 s (~8 rounds):
        # the leak held its verdict at every scrape, the cache not at all of them.
        time.sleep(max(0.0, found + 12 - time.monotonic()))
        held = _query(prom_port, "min_over_time(heapscope_site_leak[10s]) == 1")
        assert {(r["metric"]["pid"], r["metric"]["function"]) for r in held} == \
            {(leak_pid, "leak_tick")}, held
        cache = _query(prom_port, f'heapscope_site_leak{{pid="{cache_pid}"}}')
        assert cache, cache
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        agent.send_signal(signal.SIGTERM)
        try:
            _, err = agent.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            agent.kill()
            raise
    assert agent.returncode == 0, err
    assert "Traceback" not in err, err
    # Restarted on the same state, the agent resumes each window.
    again = je.run_heapscope("agent", "--match", _pattern(services, "(leak|cache)$"),
                             "--rounds", "1",
                             "--listen", f"127.0.0.1:{je.free_port()}", "--state", str(state),
                             cache=tmp_path / "cache", unprofiled=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("resuming a window of 12 dumps") == 2, again.stderr


def test_shipped_alert_rules() -> None:
    promtool = _tool("promtool")
    check = subprocess.run([promtool, "check", "rules", "heapscope-rules.yml"], cwd=RULES,
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0 and "2 rules found" in check.stdout, check.stdout + check.stderr
    test = subprocess.run([promtool, "test", "rules", "heapscope-rules.test.yml"], cwd=RULES,
                          capture_output=True, text=True, check=False)
    assert test.returncode == 0, test.stdout + test.stderr


class _LocalPost:
    """A local HTTP server on 127.0.0.1 that answers each POST with :meth:`answer`."""

    def __init__(self) -> None:
        import http.server
        import threading

        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(fake.answer(self.path, body))
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, path: str, body: bytes) -> int:
        raise NotImplementedError

    def close(self) -> None:
        self.server.shutdown()


class FakePyroscope(_LocalPost):
    """Pyroscope's HTTP ingest (``POST /ingest?name=APP{k=v,…}&from=&until=&format=pprof``,
    body the pprof profile): answers 503 to the first ``fail`` requests, then 200, and keeps
    what it accepted."""

    def __init__(self, fail: int = 0) -> None:
        self.fail = fail
        self.requests = 0
        self.accepted: list[tuple[dict[str, str], bytes]] = []
        super().__init__()

    def answer(self, path: str, body: bytes) -> int:
        url = urllib.parse.urlsplit(path)
        self.requests += 1
        if url.path != "/ingest":
            return 404
        if self.requests <= self.fail:
            return 503
        self.accepted.append((dict(urllib.parse.parse_qsl(url.query)), body))
        return 200


class FakeParca(_LocalPost):
    """Parca's ``WriteRaw`` in its HTTP/JSON form (``POST /profiles/writeraw``, proto JSON
    of ``WriteRawRequest``): it refuses what Parca refuses (no ``__name__`` label, label
    names Prometheus would not take, a sample without a raw profile) and keeps the raw
    profiles it accepts."""

    LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

    def __init__(self) -> None:
        self.accepted: list[tuple[dict[str, str], bytes]] = []
        self.refused: list[str] = []
        super().__init__()

    def answer(self, path: str, body: bytes) -> int:
        import base64

        try:
            req = json.loads(body)
            assert path == "/profiles/writeraw", path
            for series in req["series"]:
                labels = {x["name"]: x["value"] for x in series["labels"]["labels"]}
                assert "__name__" in labels, "missing __name__"
                assert all(self.LABEL.match(k) for k in labels), labels
                for sample in series["samples"]:
                    raw = sample.get("rawProfile", sample.get("raw_profile"))
                    self.accepted.append((labels, base64.b64decode(raw)))
        except (AssertionError, KeyError, TypeError, ValueError) as e:
            self.refused.append(str(e))
            return 400
        return 200


def _raw_ids(text: str, section: str) -> list[int]:
    """The ids of one section (Locations, Mappings) of ``go tool pprof -raw``, in order."""
    body = text.split(f"\n{section}\n", 1)[1]
    ids = []
    for line in body.splitlines():
        m = re.match(r"^\s*(\d+): ", line)
        if m:
            ids.append(int(m.group(1)))
        elif line and not line[0].isspace():
            break  # the next section (indented lines are a location's inlined frames)
    return ids


def test_parca_write_raw(services: dict[str, subprocess.Popen[str]], tmp_path: Path) -> None:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not found (go tool pprof reads the pushed profiles): "
                    "apt-get install golang-go")
    fake = FakeParca()
    pid = services["cache"].pid
    try:
        p = _agent("--pid", str(pid), "--rounds", "2", "--state", str(tmp_path / "state"),
                   "--parca", f"http://127.0.0.1:{fake.port}", tmp_path=tmp_path)
    finally:
        fake.close()
    assert p.returncode == 0, p.stderr
    assert fake.refused == [] and len(fake.accepted) == 2, (fake.refused, p.stderr)
    labels, raw = fake.accepted[-1]
    assert labels == {"__name__": "heapscope", "service": "agentsvc", "pid": str(pid),
                      "host": socket.gethostname()}
    assert raw[:2] == b"\x1f\x8b"  # gzip, as Parca expects
    profile = tmp_path / "parca.pb.gz"
    profile.write_bytes(raw)
    out = subprocess.run([go, "tool", "pprof", "-raw", str(profile)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # Parca's validation: ids dense from 1, in order; every sample names existing locations.
    locations, mappings = _raw_ids(out.stdout, "Locations"), _raw_ids(out.stdout, "Mappings")
    assert locations == list(range(1, len(locations) + 1)) and locations
    assert mappings == list(range(1, len(mappings) + 1)) and mappings
    sampled = {int(x) for line in out.stdout.split("\nLocations\n")[0].splitlines()
               if ": " in line and line.strip()[0].isdigit()
               for x in line.split(": ", 1)[1].split()}
    assert sampled and sampled <= set(locations)
    assert "cache_put" in out.stdout and "Period: 16384" in out.stdout  # lg_prof_sample:14


def test_pyroscope_push_with_retries(services: dict[str, subprocess.Popen[str]],
                                     tmp_path: Path) -> None:
    go = shutil.which("go")
    if go is None:
        pytest.skip("go not found (go tool pprof reads the pushed profiles): "
                    "apt-get install golang-go")
    fake = FakePyroscope(fail=2)  # the first two posts fail: the agent must retry
    pid = services["leak"].pid
    state = tmp_path / "state"
    try:
        p = je.run_heapscope("agent", "--pid", str(pid), "--rounds", "3", "--every", "1",
                             "--listen", f"127.0.0.1:{je.free_port()}", "--state", str(state),
                             "--pyroscope", f"http://127.0.0.1:{fake.port}",
                             cache=tmp_path / "cache", unprofiled=True, timeout=180)
    finally:
        fake.close()
    assert p.returncode == 0, p.stderr
    assert len(fake.accepted) == 3 and fake.requests == 5, (fake.requests, p.stderr)
    host = socket.gethostname()
    times = []
    for query, _ in fake.accepted:
        assert query["format"] == "pprof" and query["spyName"] == "heapscope", query
        assert query["name"] == f"agentsvc{{pid={pid},host={host}}}", query
        times.append((int(query["from"]), int(query["until"])))
    assert all(a < b for a, b in times) and times == sorted(times), times
    # Decoded with the protobuf classes: four heap sample types, the target's sample period,
    # a time inside the pushed interval, the program's mapping first with its build-id.
    doc = decode_profile(fake.accepted[-1][1])
    names = doc["string_table"]
    assert [(names[t["type"]], names[t["unit"]]) for t in doc["sample_type"]] == [
        ("alloc_objects", "count"), ("alloc_space", "bytes"), ("inuse_objects", "count"),
        ("inuse_space", "bytes")]
    assert doc["period"] == 1 << 14 and names[doc["default_sample_type"]] == "inuse_space"
    start, end = times[-1]
    assert start - 1 <= doc["time_nanos"] / 1e9 <= end + 1
    main = doc["mapping"][0]
    assert names[main["filename"]].endswith("agentsvc")
    assert re.fullmatch(r"[0-9a-f]{40}", names[main["build_id"]])
    # The last profile is the last dump: go tool pprof reads it with heapscope top's total.
    last = tmp_path / "last.pb.gz"
    last.write_bytes(fake.accepted[-1][1])
    raw = subprocess.run([go, "tool", "pprof", "-raw", str(last)], capture_output=True,
                         text=True, timeout=120)
    assert raw.returncode == 0, raw.stderr
    assert "inuse_space/bytes" in raw.stdout and "space/bytes" in raw.stdout, raw.stdout[:500]
    top = subprocess.run([go, "tool", "pprof", "-top", "-unit=B", "-sample_index=inuse_space",
                          "-symbolize=none", str(last)], capture_output=True, text=True,
                         timeout=120)
    total = float(top.stdout.split(" of ")[1].split("B total")[0])
    (session,) = state.iterdir()
    dump = sorted((session / "dumps").glob("*.heap"), key=lambda d: d.stat().st_mtime)[-1]
    ours = json.loads(je.run_heapscope("top", "--format", "json", "--frames", "raw", str(dump),
                                       cache=tmp_path / "cache", unprofiled=True).stdout)
    assert total == pytest.approx(ours["total"], rel=1e-3), (total, ours["total"])
    assert "leak_tick" in top.stdout


def _agent(*args: str, tmp_path: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope("agent", "--listen", f"127.0.0.1:{je.free_port()}", "--every", "0.5",
                            *args, cache=tmp_path / "cache", unprofiled=True, timeout=timeout)


def test_disk_budget_and_low_free_space(services: dict[str, subprocess.Popen[str]],
                                        tmp_path: Path) -> None:
    pid = str(services["leak"].pid)
    # A budget smaller than one dump: each process keeps its two newest, no more.
    p = _agent("--pid", pid, "--rounds", "4", "--max-disk", "1", "--state",
               str(tmp_path / "small"), tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    (session,) = (tmp_path / "small").iterdir()
    assert len(list((session / "dumps").glob("*.heap"))) == 2
    # Less free space than asked for: no dump is taken, and it is said once.
    p = _agent("--pid", pid, "--rounds", "3", "--min-free", "1000000G", "--state",
               str(tmp_path / "full"), tmp_path=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("skipped a dump") == 1, p.stderr
    (session,) = (tmp_path / "full").iterdir()
    assert list((session / "dumps").glob("*.heap")) == []


def test_targets_that_come_and_go(services: dict[str, subprocess.Popen[str]],
                                  libjemalloc: Path, tmp_path: Path) -> None:
    """A matching process that starts is picked up; one that exits is dropped; a process
    without profiling is refused once, with the fix."""
    exe = services["leak"].args[0]
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    plain = subprocess.Popen([exe, "cache", "unprofiled"], env={**env, "LD_PRELOAD": str(
        libjemalloc)}, stdout=subprocess.PIPE, text=True)
    agent = subprocess.Popen(
        [*je.HEAPSCOPE_CMD, "agent", "--match", _pattern(services, "cache (short|unprofiled)$"),
         "--every", "0.5", "--listen", f"127.0.0.1:{je.free_port()}", "--state",
         str(tmp_path / "state")],
        env={**env, "HEAPSCOPE_CACHE_DIR": str(tmp_path / "cache")},
        stderr=subprocess.PIPE, text=True)
    short = None
    try:
        time.sleep(3)
        short = subprocess.Popen([exe, "cache", "short"], env={
            **env, "LD_PRELOAD": str(libjemalloc), "MALLOC_CONF": "prof:true"},
            stdout=subprocess.PIPE, text=True)
        assert short.stdout is not None and short.stdout.readline().startswith("ready")
        time.sleep(5)
        short.send_signal(signal.SIGTERM)
        short.wait(timeout=20)
        time.sleep(3)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
        plain.send_signal(signal.SIGTERM)
        plain.wait(timeout=20)
        if short is not None and short.poll() is None:
            short.kill()
    assert agent.returncode == 0 and "Traceback" not in err, err
    assert err.count(f"not watching agentsvc pid {plain.pid}") == 1, err
    assert "prof:true" in err
    assert f"watching agentsvc pid {short.pid}" in err, err
    assert f"agentsvc pid {short.pid} is no longer watched (it exited)" in err, err


def test_config_file_and_sighup_reload(services: dict[str, subprocess.Popen[str]],
                                       tmp_path: Path) -> None:
    leak, cache = services["leak"].pid, services["cache"].pid
    config = tmp_path / "agent.toml"
    config.write_text(f'every = 0.5\nstate = "{tmp_path / "state"}"\n'
                      f'listen = "127.0.0.1:{je.free_port()}"\n[[target]]\npid = {cache}\n')
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    agent = subprocess.Popen([*je.HEAPSCOPE_CMD, "agent", "--config", str(config)],
                             env={**env, "HEAPSCOPE_CACHE_DIR": str(tmp_path / "cache")},
                             stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4)
        config.write_text(f'every = 0.5\nstate = "{tmp_path / "state"}"\n'
                          f'listen = "127.0.0.1:{je.free_port()}"\n[[target]]\npid = {leak}\n')
        agent.send_signal(signal.SIGHUP)
        time.sleep(4)
        config.write_text("every = [oops\n")  # a broken file keeps the running settings
        agent.send_signal(signal.SIGHUP)
        time.sleep(2)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0 and "Traceback" not in err, err
    lines = err.splitlines()
    order = [next(i for i, ln in enumerate(lines) if want in ln) for want in (
        f"watching agentsvc pid {cache}", "config reloaded (listen change at the next start)",
        f"agentsvc pid {cache} is no longer watched (no longer selected)",
        f"watching agentsvc pid {leak}", "config not reloaded")]
    assert order == sorted(order), err
    assert "not valid TOML" in err


def test_dumps_written_by_the_service_itself(gcc: Path, libjemalloc: Path,
                                             tmp_path: Path) -> None:
    """--dumps DIR: jemalloc's own interval dumps, no attach; nothing there is deleted."""
    exe = tmp_path / "agentsvc"
    je.build([SERVICE_C], exe, ("-O1", "-g"))
    folder = tmp_path / "dumps"
    folder.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    # A dump every 1 MiB allocated: about one a second (16 KiB kept + 32 KiB churn per tick).
    svc = subprocess.Popen([str(exe), "leak"], stdout=subprocess.PIPE, text=True, env={
        **env, "LD_PRELOAD": str(libjemalloc),
        "MALLOC_CONF": f"prof:true,lg_prof_sample:14,lg_prof_interval:20,"
                       f"prof_prefix:{folder}/jeprof"})
    port = je.free_port()
    agent = subprocess.Popen(
        [*je.HEAPSCOPE_CMD, "agent", "--dumps", str(folder), "--every", "1", "--window", "10",
         "--listen", f"127.0.0.1:{port}", "--state", str(tmp_path / "state")],
        env={**env, "HEAPSCOPE_CACHE_DIR": str(tmp_path / "cache")},
        stderr=subprocess.PIPE, text=True)
    leak = None
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and leak is None:
            time.sleep(2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                continue
            m = re.search(r'^heapscope_site_leak\{[^}]*function="leak_tick"[^}]*\} 1\.0$',
                          text, re.M)
            leak = m.group(0) if m else None
        before = sorted(p.name for p in folder.iterdir())
    finally:
        svc.send_signal(signal.SIGTERM)
        svc.wait(timeout=20)
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    assert leak is not None and f'pid="{svc.pid}"' in leak, err
    assert agent.returncode == 0 and "Traceback" not in err, err
    assert f"reading the dumps of agentsvc pid {svc.pid}" in err
    assert len(before) >= 2 and set(before) <= {p.name for p in folder.iterdir()}  # kept
    assert "attach" not in err and not list((tmp_path / "state").iterdir())


def test_duty_cycle_leaves_sampling_off_between_windows(
        services: dict[str, subprocess.Popen[str]], tmp_path: Path) -> None:
    pid = str(services["cache"].pid)

    def prof_active() -> bool:
        p = je.run_heapscope("attach", pid, "status", "--format", "json",
                             cache=tmp_path / "cache", unprofiled=True, timeout=60)
        assert p.returncode == 0, p.stderr
        active: bool = json.loads(p.stdout)["prof_active"]
        return active

    assert prof_active()
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    agent = subprocess.Popen(
        [*je.HEAPSCOPE_CMD, "agent", "--pid", pid, "--every", "6", "--active", "0.5",
         "--listen", f"127.0.0.1:{je.free_port()}", "--state", str(tmp_path / "state")],
        env={**env, "HEAPSCOPE_CACHE_DIR": str(tmp_path / "cache")},
        stderr=subprocess.PIPE, text=True)
    try:
        assert agent.stderr is not None
        for line in agent.stderr:
            if "watching agentsvc" in line:
                break
        time.sleep(2)  # the dump that ends the window is taken; the next window is 4 s away
        between = prof_active()
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err
    assert between is False
    assert prof_active()  # a clean stop leaves sampling on, as the target started
    assert len(list((tmp_path / "state").glob("*/dumps/*.heap"))) >= 1


def _certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate it signed, and a
    client certificate from another CA: made by the real openssl."""
    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True,
                       timeout=60)

    for ca in ("ca", "other-ca"):
        run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            f"/CN={ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.crt")
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ca, extra in (("server", "ca", ("-extfile", "san.cnf")), ("client", "ca", ()),
                            ("stranger", "other-ca", ())):
        run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
            f"{name}.key", "-out", f"{name}.csr")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
            "-CAcreateserial", "-days", "2", "-out", f"{name}.crt", *extra)
    return {p.stem + p.suffix: p for p in folder.iterdir()}


def test_metrics_over_tls_only_for_clients_with_a_certificate(tmp_path: Path) -> None:
    """--tls-cert/--tls-key/--tls-client-ca: /metrics is served over HTTPS, and only to a
    client presenting a certificate the given CA signed; plain HTTP, no certificate and a
    certificate from another CA get nothing."""
    if not shutil.which("openssl"):
        pytest.skip("openssl not installed: apt-get install openssl")
    certs = tmp_path / "certs"
    certs.mkdir()
    c = _certificates(certs)
    (tmp_path / "dumps").mkdir()
    port = je.free_port()
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    agent = subprocess.Popen(
        [*je.HEAPSCOPE_CMD, "agent", "--dumps", str(tmp_path / "dumps"), "--every", "1",
         "--listen", f"127.0.0.1:{port}", "--state", str(tmp_path / "state"),
         "--tls-cert", str(c["server.crt"]), "--tls-key", str(c["server.key"]),
         "--tls-client-ca", str(c["ca.crt"])],
        env={**env, "HEAPSCOPE_CACHE_DIR": str(tmp_path / "cache")},
        stderr=subprocess.PIPE, text=True)
    url = f"https://127.0.0.1:{port}/metrics"

    def fetch(client: str | None) -> str:
        ctx = ssl.create_default_context(cafile=str(c["ca.crt"]))
        if client:
            ctx.load_cert_chain(str(c[f"{client}.crt"]), str(c[f"{client}.key"]))
        with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
            return str(r.read().decode())

    try:
        body = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not body:
            try:
                body = fetch("client")
            except (ConnectionRefusedError, urllib.error.URLError) as e:
                if not isinstance(getattr(e, "reason", e), ConnectionRefusedError):
                    raise
                time.sleep(0.5)
        refused = []
        for who in (None, "stranger"):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                fetch(who)
            refused.append(who)
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    assert "heapscope_" in body, body[:300]
    assert refused == [None, "stranger"]
    assert agent.returncode == 0 and "Traceback" not in err, err
    assert f"serving https://127.0.0.1:{port}/metrics" in err and "warning" not in err, err
