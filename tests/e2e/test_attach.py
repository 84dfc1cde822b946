"""``heapscope attach``: live control of real running targets through gdb, and the bad cases."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
SERVER_C = HERE / "attachprog" / "server.c"
WINDOW_C = HERE / "attachprog" / "window.c"
CONF = "prof:true,lg_prof_sample:12"


def _cli() -> list[str]:
    return [sys.executable, "-m", "heapscope.cli.main"]


def hs(*args: str, cache: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    cli = _cli()
    argv = ["attach", *args] if cli[-1].endswith("main") else list(args)
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(cache))
    p = subprocess.run([*cli, *argv], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode != 0
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("heapscope: error: ")
    return lines[0]


@pytest.fixture(scope="session")
def server_bin(gcc: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("attachprog") / "server"
    subprocess.run([str(gcc), "-O1", "-g", "-pthread", "-o", str(out), str(SERVER_C)],
                   check=True)
    return out.resolve()


class Target:
    """A running test target; asks it for heartbeats over its stdin/stdout."""

    def __init__(self, argv: list[str], env: dict[str, str], ready: bool = True) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.pid = self.proc.pid
        if ready:
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline()
            assert line.startswith("ready"), line

    def ask(self) -> tuple[int, int]:
        """(heartbeats so far, longest gap in µs since the last question)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("?\n")
        self.proc.stdin.flush()
        beats, gap = self.proc.stdout.readline().split()
        return int(beats), int(gap)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def _env(lib: Path | None, conf: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("MALLOC_CONF", None)
    env.pop("LD_PRELOAD", None)
    if lib is not None:
        env["LD_PRELOAD"] = str(lib)
    if conf is not None:
        env["MALLOC_CONF"] = conf
    return env


@pytest.fixture
def server(server_bin: Path, libjemalloc: Path, gdb: str) -> Iterator[Target]:
    t = Target([str(server_bin)], _env(libjemalloc, CONF))
    yield t
    assert t.stop() == 0  # alive until the end, and exits normally on SIGTERM


def test_status(server: Target, tmp_path: Path) -> None:
    p = hs(str(server.pid), "status", "--format", "json", cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    st = json.loads(p.stdout)
    assert st["version"].startswith("5.") and st["config_prof"] and st["opt_prof"]
    assert st["prof_active"] is True and st["sample_bytes"] == 4096 and st["lg_sample"] == 12
    assert st["exe"] == os.readlink(f"/proc/{server.pid}/exe")
    assert all(isinstance(v, int) and v > 0 for v in st["stats"].values())
    assert st["stats"]["resident"] >= st["stats"]["active"] >= st["stats"]["allocated"]
    text = hs(str(server.pid), "status", cache=tmp_path / "c")
    assert "opt.prof true" in text.stdout and "sample every 4.0 KiB" in text.stdout
    server.ask()


def test_dump_start_stop(server: Target, tmp_path: Path) -> None:
    s = tmp_path / "s"
    p = hs(str(server.pid), "dump", "-o", str(s), cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    dump = Path(p.stdout.strip())
    assert dump.parent == s / "dumps" and dump.name == f"jeprof.{server.pid}.0.m0.heap"
    assert dump.read_text().startswith("heap_v2/4096")
    manifest = json.loads((s / "manifest.json").read_text())
    assert manifest["pid"] == server.pid and manifest["jemalloc"]["opt_prof"]
    assert manifest["processes"][0]["exe"].endswith("server")
    top = subprocess.run([sys.executable, "-m", "heapscope.cli.main", "top", str(s)],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c")))
    assert top.returncode == 0 and "slow_leak" in top.stdout, top.stderr
    # A second dump extends the session; a named .heap file is written as it is.
    p2 = hs(str(server.pid), "dump", "--session", str(s), cache=tmp_path / "c")
    assert p2.stdout.strip().endswith(f"jeprof.{server.pid}.1.m1.heap")
    f = tmp_path / "one.heap"
    assert hs(str(server.pid), "dump", "-o", str(f), cache=tmp_path / "c").returncode == 0
    assert f.read_text().startswith("heap_v2/")
    p = hs(str(server.pid), "stop", cache=tmp_path / "c")
    assert p.returncode == 0 and "prof.active false (was true)" in p.stdout, p.stderr
    st = json.loads(hs(str(server.pid), "status", "--format", "json",
                       cache=tmp_path / "c").stdout)
    assert st["prof_active"] is False
    p = hs(str(server.pid), "start", cache=tmp_path / "c")
    assert "prof.active true (was false)" in p.stdout
    p = hs(str(server.pid), "reset", "--sample", "8k", cache=tmp_path / "c")
    assert p.returncode == 0 and "lg 13" in p.stdout, p.stderr
    server.ask()


def test_window_holds_only_what_the_window_kept(gcc: Path, libjemalloc: Path, gdb: str,
                                                 tmp_path: Path) -> None:
    """attach window on a program profiled from the start (prof.active on), after a warm-up
    that allocated 64 MiB and freed it and built an 8 MiB cache: the window's dump holds
    what was allocated during the window and is still live, ranked, slow_leak first; the
    warm-up and the cache are not in it; the history before the window is kept aside."""
    binary = tmp_path / "window"
    subprocess.run([str(gcc), "-O1", "-g", "-o", str(binary), str(WINDOW_C)], check=True)
    t = Target([str(binary)], _env(libjemalloc, CONF))
    try:
        s = tmp_path / "w"
        p = hs(str(t.pid), "window", "--seconds", "2", "--settle", "1", "-o", str(s),
               "--format", "json", cache=tmp_path / "c")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        first = doc["suspects"][0]
        assert first["function"] == "slow_leak" and first["verdict"] == "live", first
        # ~400 KiB/s for the 2 s the window sampled (at most a little more while it stopped)
        assert 0.5 * 800 * 1024 < first["bytes"] < 2 * 800 * 1024, first
        names = {x["function"] for x in doc["suspects"]}
        assert not names & {"warm_up", "build_cache"}, names
        assert doc["window"]["seconds"] == 2 and doc["mode"] == "window"
        assert len(list((s / "dumps").glob("*.heap"))) == 1
        (before,) = (s / "dumps").glob("*.before")
        assert "build_cache" in subprocess.run(
            [*_cli(), "top", "--format", "json", str(before)], capture_output=True, text=True,
            env=dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"))).stdout
        st = json.loads(hs(str(t.pid), "status", "--format", "json",
                           cache=tmp_path / "c").stdout)
        assert st["prof_active"] is True  # restored
        text = hs(str(t.pid), "window", "--seconds", "1", "--settle", "0.5", "-o",
                  str(tmp_path / "w2"), cache=tmp_path / "c").stdout
        assert "the window kept" in text and "slow_leak" in text, text
    finally:
        assert t.stop() == 0


def test_watch_series(server: Target, tmp_path: Path) -> None:
    """Six dumps a second apart of a target leaking 400 KiB/s: slow_leak is the leak. The
    target's four busy threads load this machine's two cores, so the dumps may come at
    uneven times; then its growth per dump says less, and the leak may be called growing
    (never bounded, and its process never clean)."""
    from heapscope.analysis.trend import uneven

    s = tmp_path / "watch"
    # The CI gate of run and leaks, on attach's series: about 2 MiB leaked over the dumps.
    p = hs(str(server.pid), "watch", "--every", "1", "--count", "6", "-o", str(s),
           "--fail-on-leak", "100K", cache=tmp_path / "c")
    assert p.returncode == 10, p.stderr
    assert "slow_leak" in p.stdout and "> 102400): exit 10" in p.stderr
    leaks = subprocess.run([sys.executable, "-m", "heapscope.cli.main", "leaks", "--format",
                            "json", str(s)], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c")))
    doc = json.loads(leaks.stdout)
    first = doc["suspects"][0]
    assert first["function"] == "slow_leak" and len(first["series"]) == 6
    times = sorted(d.stat().st_mtime for d in (s / "dumps").glob("*.heap"))
    if uneven([t - times[0] for t in times]):
        assert first["verdict"] in ("leak", "growing"), first
        assert doc["processes"][0]["verdict"] in ("leaks", "undecided")
    else:
        assert first["verdict"] == "leak" and "LEAKS" in p.stdout, first


def test_python_target(libjemalloc: Path, gdb: str, tmp_path: Path) -> None:
    code = ("import sys, time\nkeep = []\nprint('ready', flush=True)\n"
            "while True:\n    keep.append(bytearray(10000))\n    time.sleep(0.001)\n")
    t = Target([sys.executable, "-c", code], _env(libjemalloc, CONF))
    try:
        st = json.loads(hs(str(t.pid), "status", "--format", "json",
                           cache=tmp_path / "c").stdout)
        assert st["opt_prof"] and st["symbol"] == "mallctl"
        p = hs(str(t.pid), "dump", "-o", str(tmp_path / "py"), cache=tmp_path / "c")
        assert p.returncode == 0, p.stderr
        assert Path(p.stdout.strip()).read_text().startswith("heap_v2/4096")
        assert t.proc.poll() is None
    finally:
        t.proc.kill()
        t.proc.wait()


def test_target_without_prof(server_bin: Path, libjemalloc: Path, gdb: str,
                             tmp_path: Path) -> None:
    t = Target([str(server_bin)], _env(libjemalloc, None))
    try:
        st = hs(str(t.pid), "status", cache=tmp_path / "c")
        assert st.returncode == 0 and "opt.prof false" in st.stdout
        for action in (["dump", "-o", str(tmp_path / "x")], ["start"]):
            err = one_line_error(hs(str(t.pid), *action, cache=tmp_path / "c"))
            assert "MALLOC_CONF=prof:true" in err and "ENOENT" in err, err
        t.ask()
    finally:
        assert t.stop() == 0


def test_target_without_jemalloc(server_bin: Path, gdb: str, tmp_path: Path) -> None:
    t = Target([str(server_bin)], _env(None, None))
    try:
        err = one_line_error(hs(str(t.pid), "status", cache=tmp_path / "c"))
        assert "no jemalloc" in err and "mallctl" in err
        t.ask()
    finally:
        assert t.stop() == 0


def test_one_gdb_run_reaches_each_process(server_bin: Path, libjemalloc: Path, gdb: str,
                                          tmp_path: Path) -> None:
    """What run --every does each round: one gdb run, a dump of each process; a process
    that cannot be dumped gets its own error and does not stop the others."""
    from heapscope.capture.control import call_each
    from heapscope.capture.mallctl import AttachError, CallResult, Op

    conf = f"{CONF},prof_prefix:{tmp_path}/jeprof"
    targets = [Target([str(server_bin)], _env(libjemalloc, conf)),
               Target([str(server_bin)], _env(None, None)),
               Target([str(server_bin)], _env(libjemalloc, conf))]
    try:
        pids = [t.pid for t in targets]
        got = call_each(pids, [Op("prof.dump", "none", None, True)], retries=2)
        assert set(got) == set(pids)
        ok = [got[pids[0]], got[pids[2]]]
        assert all(isinstance(r, CallResult) and r.rcs["prof.dump"] == 0 for r in ok), got
        assert isinstance(got[pids[1]], AttachError) and "no jemalloc" in str(got[pids[1]])
        for pid in (pids[0], pids[2]):  # jemalloc names them after opt.prof_prefix
            assert len(list(tmp_path.glob(f"jeprof.{pid}.*.m*.heap"))) == 1
        for t in targets:
            t.ask()
    finally:
        for t in targets:
            assert t.stop() == 0


def test_pid_that_does_not_exist(tmp_path: Path, gdb: str) -> None:
    p = subprocess.Popen(["true"])
    p.wait()
    err = one_line_error(hs(str(p.pid), "status", cache=tmp_path / "c"))
    assert f"no process with pid {p.pid}" in err


def _state(pid: int) -> str:
    """The process's state letter from /proc (Z: exited, not yet reaped), "" once gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def test_pid_that_exits(server_bin: Path, libjemalloc: Path, gdb: str,
                        tmp_path: Path) -> None:
    # Exits 0.2 s after start (left unreaped: a zombie), and one that exits while watched.
    quick = Target([str(server_bin), "200"], _env(libjemalloc, CONF), ready=False)
    # Asked only once it has exited: on a busy machine an attach could beat the 0.2 s.
    deadline = time.monotonic() + 30
    while _state(quick.pid) not in ("Z", "") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _state(quick.pid) in ("Z", ""), "the quick target did not exit"
    err = one_line_error(hs(str(quick.pid), "status", cache=tmp_path / "c"))
    assert "exited" in err or "no process" in err, err
    quick.proc.wait()
    # A watched process that exits: the series taken until then is judged, and said so. It
    # is stopped once the watch holds three dumps (a lifetime of its own would have to
    # outlast heapscope's start on a loaded machine).
    later = Target([str(server_bin)], _env(libjemalloc, CONF))
    cli = _cli()
    argv = ["attach"] if cli[-1].endswith("main") else []
    watch = subprocess.Popen(
        [*cli, *argv, str(later.pid), "watch", "--every", "0.1", "--count", "1000", "-o",
         str(tmp_path / "gone"), "--format", "json"],
        env=dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c")),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len(list((tmp_path / "gone").glob("dumps/*.heap"))) < 3:
        assert watch.poll() is None and time.monotonic() < deadline, "no third dump"
        time.sleep(0.05)
    assert later.stop() == 0
    out, err = watch.communicate(timeout=120)
    assert "Traceback" not in err, err
    p = subprocess.CompletedProcess(watch.args, watch.returncode, out, err)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert any(f"pid {later.pid} exited after" in n for n in doc["notes"]), doc["notes"]
    assert doc["processes"][0]["dumps"] >= 3


def _cycles(target: Target, cycles: int, folder: Path) -> dict[str, Any]:
    """``cycles`` attach-and-dump cycles: the target stays alive and responsive, every dump is
    valid, everything still works after. The pauses are printed, not asserted (a loaded
    machine stretches them; bench/attach_stress.py measures their distribution)."""
    from heapscope.capture.attach import AttachOptions, Controller
    from heapscope.formats.load import load

    target.ask()
    ctl = Controller(target.pid, AttachOptions(timeout=60.0))
    folder.mkdir()
    os.chmod(folder, 0o1777)
    gaps: list[int] = []
    callers: set[int] = set()
    beats_before = target.ask()[0]
    for i in range(cycles):
        r = ctl.dump(str(folder / f"jeprof.{target.pid}.{i}.m{i}.heap"))
        callers.add(r.caller_tid)
        gaps.append(target.ask()[1])  # answers: alive and responsive
        assert target.proc.poll() is None
    assert target.ask()[0] > beats_before
    for i in range(cycles):
        prof = load(str(folder / f"jeprof.{target.pid}.{i}.m{i}.heap"))
        assert prof.samples
    st = ctl.status()  # everything still works after the cycles
    assert st["prof_active"] is True
    summary = {"cycles": cycles, "pause_median_ms": statistics.median(gaps) / 1000,
               "pause_max_ms": max(gaps) / 1000, "retries": ctl.log.retries,
               "callers": sorted(callers)}
    print("\nATTACH-CYCLES " + json.dumps(summary))
    return summary


def _thread_names(pid: int) -> dict[int, str]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8") as f:
            out[int(tid)] = f.read().strip()
    return out


def test_attach_and_dump_cycles(server: Target, tmp_path: Path) -> None:
    """40 cycles on the busy 7-thread target (four threads allocate all the time): the calls
    run on a thread outside the allocator each time, with no retry needed."""
    summary = _cycles(server, 40, tmp_path / "dumps")
    assert summary["retries"] == 0, summary


def test_background_thread_never_runs_the_calls(server_bin: Path, libjemalloc: Path,
                                                 gdb: str, tmp_path: Path) -> None:
    """A target with jemalloc's background thread (background_thread:true), asleep between
    purges inside the allocator: the calls never run on it, and it causes no retry."""
    t = Target([str(server_bin), "0", "0", "0"],
               _env(libjemalloc, CONF + ",background_thread:true"))
    try:
        names = _thread_names(t.pid)
        assert "jemalloc_bg_thd" in names.values(), names
        summary = _cycles(t, 30, tmp_path / "dumps")
        assert summary["retries"] == 0, summary
        assert not {names.get(tid) for tid in summary["callers"]} & {"jemalloc_bg_thd"}
    finally:
        assert t.stop() == 0


def test_gdb_missing(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path), HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"))
    cli = _cli()
    argv = ["attach", str(os.getpid()), "status"] if cli[-1].endswith("main") \
        else [str(os.getpid()), "status"]
    p = subprocess.run([*cli, *argv], env=env, capture_output=True, text=True, timeout=60)
    err = one_line_error(p)
    assert "gdb not found" in err and "apt-get install gdb" in err
    assert p.returncode == 4


def test_ptrace_refused_is_explained(tmp_path: Path) -> None:
    """An unprivileged user attaching to root's process gets EPERM from ptrace: one line."""
    import pwd
    import sysconfig

    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("needs root and runuser to attach as an unprivileged user")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user to attach as")
    python = "/usr/bin/python3"
    version = subprocess.run([python, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    if not os.path.exists(python) or version != str(tuple(sys.version_info[:2])):
        pytest.skip("needs a system python3 of this version that 'nobody' can run")
    src = Path(__file__).resolve().parents[2] / "src"
    site = sysconfig.get_paths()["purelib"]
    target = subprocess.Popen(["sleep", "30"])
    try:
        p = subprocess.run(["runuser", "-u", "nobody", "--", "env",
                            f"PYTHONPATH={src}:{site}", "HOME=/tmp", python, "-m",
                            "heapscope.cli.main", "attach", str(target.pid), "status"],
                           capture_output=True, text=True, timeout=120)
        if "Permission denied" in p.stderr and "runuser" in p.stderr:
            pytest.skip("'nobody' cannot read this checkout or its packages")
        assert p.returncode == 4, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and "ptrace refused" in lines[0]
        assert "ptrace_scope" in lines[0] and "CAP_SYS_PTRACE" in lines[0]
        assert target.poll() is None
    finally:
        target.kill()
        target.wait()


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


@pytest.mark.parametrize("phase", ["written", "pointed"])
def test_sigint_sent_while_a_thread_is_held_reaches_the_target(
        server_bin: Path, libjemalloc: Path, gdb: str, tmp_path: Path, phase: str) -> None:
    """A SIGINT someone sends while heapscope holds a thread of the target (pg_ctl stop -m
    fast, a Ctrl-C) is neither swallowed nor fatal: the target's handler gets it and it
    exits 0 (its handler ends it), and the attach answers or says in one line that the
    process exited. Sent while the ptracer holds the thread (made to wait there 1.5 s),
    before and after it points it at the stub."""
    t = Target([str(server_bin), "0", "0", "0"], _env(libjemalloc, CONF))
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"),
               HEAPSCOPE_TEST_PTRACER_PAUSE=phase, HEAPSCOPE_TEST_PTRACER_PAUSE_S="1.5")
    att = subprocess.Popen([*_cli(), "attach", str(t.pid), "status", "--format", "json"],
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                _state_of(t.pid, tid) == "t" for tid in os.listdir(f"/proc/{t.pid}/task")):
            time.sleep(0.005)
        os.kill(t.pid, signal.SIGINT)
        out, err = att.communicate(timeout=120)
        # Its SIGINT handler ends it (exit 0); a lost signal leaves it running (the timeout),
        # a harmed one dies by a signal.
        assert t.proc.wait(timeout=30) == 0
        if att.returncode:
            assert err.strip() == f"heapscope: error: process {t.pid} exited during the " \
                "attach", err
        else:
            assert json.loads(out)["opt_prof"]
    finally:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def _state_of(pid: int, tid: str) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return ""


@pytest.mark.parametrize("leaking", [True, False])
def test_watch_counts_missed_rounds_and_never_calls_them_clean(
        server_bin: Path, libjemalloc: Path, gdb: str, tmp_path: Path, leaking: bool) -> None:
    """The target is stopped (SIGSTOP) until the watch has missed two rounds: the missed
    rounds are counted and said, the verdicts rest on the dumps taken, and what is left is
    never called clean: the leaking target is not, and the idle one is 'undecided' with the
    reason (heapscope leaks on the session later says the same)."""
    import threading

    t = Target([str(server_bin), "0", "0", "1" if leaking else "0"], _env(libjemalloc, CONF))
    try:
        s = tmp_path / "w"
        env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"))
        watch = subprocess.Popen([*_cli(), "attach", str(t.pid), "watch", "--every", "0.4",
                                  "--count", "8", "-o", str(s), "--format", "json"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        time.sleep(1.0)
        os.kill(t.pid, signal.SIGSTOP)
        missed_lines: list[str] = []

        def read_err() -> None:
            assert watch.stderr is not None
            for line in watch.stderr:
                if "missed" in line:
                    missed_lines.append(line)

        reader = threading.Thread(target=read_err, daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while len(missed_lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(t.pid, signal.SIGCONT)
        out, _ = watch.communicate(timeout=300)
        assert watch.returncode == 0, missed_lines
        assert len(missed_lines) >= 2 and "stopped" in missed_lines[0], missed_lines
        doc = json.loads(out)
        (proc,) = doc["processes"]
        assert proc["rounds"] == 8 and proc["missed_rounds"] >= 2, proc
        assert proc["dumps"] == 8 - proc["missed_rounds"], proc
        assert proc["verdict"] != "clean", proc
        if not leaking:
            assert proc["verdict"] == "undecided", proc
            assert any("rounds of dumps were missed" in n and "too few" in n
                       for n in doc["notes"]), doc["notes"]
        later = subprocess.run([*_cli(), "leaks", "--format", "json", str(s)], env=env,
                               capture_output=True, text=True, timeout=120)
        assert json.loads(later.stdout)["processes"][0]["verdict"] == proc["verdict"]
        t.ask()
    finally:
        if _state(t.pid) == "T":
            os.kill(t.pid, signal.SIGCONT)
        assert t.stop() == 0


def test_gdb_way(server: Target, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the call stub cannot go (other architectures; HEAPSCOPE_NO_STUB=1 here), gdb
    calls mallctl: status and a dump answer the same, and the target runs on."""
    monkeypatch.setenv("HEAPSCOPE_NO_STUB", "1")
    st = json.loads(hs(str(server.pid), "status", "--format", "json",
                       cache=tmp_path / "c").stdout)
    assert st["attach"]["mode"] == "call" and st["opt_prof"] and st["sample_bytes"] == 4096
    monkeypatch.delenv("HEAPSCOPE_NO_STUB")
    stub = json.loads(hs(str(server.pid), "status", "--format", "json",
                         cache=tmp_path / "c").stdout)
    assert stub["attach"]["mode"] == "stub"
    for key in ("version", "symbol", "config_prof", "opt_prof", "prof_active", "lg_sample",
                "prof_prefix", "lg_prof_interval"):
        assert st[key] == stub[key], key
    monkeypatch.setenv("HEAPSCOPE_NO_STUB", "1")
    f = tmp_path / "gdb.heap"
    p = hs(str(server.pid), "dump", "-o", str(f), cache=tmp_path / "c")
    assert p.returncode == 0 and "through gdb" in p.stderr, p.stderr
    assert f.read_text().startswith("heap_v2/4096")
    server.ask()
