"""heapscope never harms the process it profiles: a slice of the storms of
bench/attach_stress.py (signals of every kind during attaches, gdb killed at random moments,
``heapscope run`` killed at random moments, a call that cannot finish, a target that exits
in the middle). Nothing here asserts a duration: each test asserts what a user relies on
(the target alive, every signal delivered once, every dump complete)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

try:  # tests/e2e as a package or as a rootdir-inserted directory
    from . import storm
except ImportError:
    import storm  # type: ignore[no-redef]

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def inside_bin(gcc: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("inside") / "inside"
    subprocess.run([str(gcc), "-O1", "-g", "-pthread", "-o", str(out),
                    str(storm.HERE / "attachprog" / "inside.c")], check=True)
    return out


@pytest.fixture
def target(storm_bin: Path, libjemalloc: Path, gdb: str) -> Iterator[storm.StormTarget]:
    t = storm.StormTarget([str(storm_bin), "3"], storm.env_for(str(libjemalloc)))
    yield t
    if t.proc.poll() is None:
        t.proc.kill()
        t.proc.wait()


def _cli(*args: str, cache: Path, **kw: object) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(cache))
    p = subprocess.run([sys.executable, "-m", "heapscope.cli.main", *args], env=env,
                       capture_output=True, text=True, timeout=300, **kw)  # type: ignore[call-overload]
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_signal_storm_during_attaches(target: storm.StormTarget, tmp_path: Path) -> None:
    """Every kind of signal, with handlers installed, sent while attaches dump and read the
    status (at least 30 attaches, and until each kind was sent 20 times; SIGINT and SIGTRAP,
    which gdb keeps for itself by default, among them), and SIGSTOP/SIGCONT pairs: the
    target survives, each signal is counted exactly once, each SIGSTOP stops it, and every
    attach succeeds with a complete dump."""
    with storm.SignalStorm(target, storm.HANDLED, stop_cont=True) as s:
        log = storm.attach_cycles(
            target, 30, tmp_path / "dumps",
            until=lambda: min(s.log.sent[k] for k in storm.HANDLED) >= 20 and s.log.stops >= 10)
    doc = storm.summary(log, s.log)
    storm.print_summary("SIGNAL-STORM", doc)
    assert target.quit() == 0, doc
    assert not s.log.lost and not s.log.doubled and s.log.stops_lost == 0, doc
    assert min(s.log.sent[k] for k in storm.HANDLED) >= 20 and s.log.stops >= 10, doc
    # An attach that found the target stopped by a SIGSTOP leaves it so and says so; every
    # other one succeeds with a complete dump.
    assert all("stopped (SIGSTOP" in kind or "stopped (state T" in kind for kind in log.errors), doc
    assert log.ok >= 15 and not log.bad_dumps, doc
    assert set(log.modes) == {"stub"}, doc


def test_default_dispositions(storm_bin: Path, libjemalloc: Path, gdb: str,
                              tmp_path: Path) -> None:
    """No handlers at all: signals whose default action is harmless (CHLD, URG, WINCH,
    CONT) during 15 attaches leave the target running."""
    t = storm.StormTarget([str(storm_bin), "3", "default"], storm.env_for(str(libjemalloc)))
    try:
        with storm.SignalStorm(t, storm.HARMLESS_DEFAULT, counted=False) as s:
            log = storm.attach_cycles(
                t, 15, tmp_path / "dumps",
                until=lambda: min(s.log.sent[k] for k in storm.HARMLESS_DEFAULT) >= 20)
        doc = storm.summary(log, s.log)
        storm.print_summary("DEFAULT-STORM", doc)
        assert min(s.log.sent[k] for k in storm.HARMLESS_DEFAULT) >= 20, doc
        assert log.ok == log.cycles and not log.bad_dumps, doc
        assert t.quit() == 0
    finally:
        if t.proc.poll() is None:
            t.proc.kill()
            t.proc.wait()


def test_tracer_killed_at_random_moments(target: storm.StormTarget, tmp_path: Path) -> None:
    """heapscope's ptracer SIGKILLed at a random moment of each of 25 attaches: the target
    lives, is never left stopped, and the attaches after them work."""
    with storm.TracerKiller(latest=0.06) as k:
        log = storm.attach_cycles(target, 25, tmp_path / "dumps", until=lambda: k.kills >= 10)
    after = storm.attach_cycles(target, 4, tmp_path / "after")
    doc = storm.summary(log, kills=k.kills, after_ok=after.ok)
    storm.print_summary("TRACER-KILLS", doc)
    assert k.kills >= 10, doc  # kills after the tracer ended do not count
    assert target.proc.poll() is None and storm.state(target.pid) not in ("T", "t", ""), doc
    assert after.ok == 4 and not log.bad_dumps, doc
    for kind in log.errors:  # a killed tracer is said as such, never as something else
        assert "was killed" in kind or "ended before its calls began" in kind, doc
    assert target.quit() == 0


@pytest.mark.parametrize("phase", ["written", "pointed"])
def test_tracer_killed_while_it_holds_a_thread(target: storm.StormTarget, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               phase: str) -> None:
    """The ptracer killed while it holds the thread: after writing the stub and the calls
    but before pointing the thread at them (the thread goes on untouched), or right after
    pointing it (the thread runs the stub by itself: the dump is written all the same)."""
    from heapscope.capture.control import call
    from heapscope.capture.mallctl import Op
    from heapscope.errors import HeapscopeError

    monkeypatch.setenv("HEAPSCOPE_TEST_PTRACER_PAUSE", phase)
    path = tmp_path / "x.heap"
    got: dict[str, object] = {}

    def attach() -> None:
        try:
            got["result"] = call(target.pid, [Op("prof.dump", "str", str(path), True)],
                                 timeout=20)
        except HeapscopeError as e:
            got["error"] = str(e)

    import threading

    th = threading.Thread(target=attach)
    th.start()
    deadline = time.monotonic() + 60
    killed = False
    while not killed and time.monotonic() < deadline:
        for pid in storm.tracer_children():
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"ptracer.py" not in f.read():
                    continue
            time.sleep(1.0)  # it sits at the pause by now
            os.kill(pid, 9)
            killed = True
        time.sleep(0.01)
    th.join(timeout=60)
    assert killed
    assert target.beat()[0] > 0 and storm.state(target.pid) not in ("T", "t", "")
    if phase == "written":
        assert "ended before its calls began" in str(got.get("error")), got
        assert not path.exists()
    else:
        assert "result" in got, got
        assert path.read_text().startswith("heap_v2/")
    again = storm.attach_cycles(target, 2, tmp_path / "again")
    assert again.ok == 2, storm.summary(again)
    assert target.quit() == 0


def test_stuck_call_is_left_to_finish(target: storm.StormTarget, tmp_path: Path) -> None:
    """A thread of the target holds jemalloc's dump lock (its own dump waits to open a FIFO
    nobody reads): heapscope's dump cannot finish, so it gives up after --timeout, says why,
    and leaves the call to finish by itself; the target keeps running, a second attach is
    refused while the first call is out, and once the lock is free the first call completes
    and attaches work again."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert target.ask(f"f {fifo}") == "ok"
    time.sleep(0.3)
    first = tmp_path / "first.heap"
    p = _cli("attach", str(target.pid), "dump", "-o", str(first), "--timeout", "2",
             cache=tmp_path / "c")
    assert p.returncode == 4, p.stderr
    assert "has not returned after 2 s" in p.stderr and str(first) in p.stderr, p.stderr
    # The thread that took the call (the idlest, maybe the one reading our commands) waits
    # with it; the others compute on.
    assert storm.runs_on(target.pid) and target.proc.poll() is None
    busy = _cli("attach", str(target.pid), "status", cache=tmp_path / "c")
    assert busy.returncode == 4 and "still running" in busy.stderr, busy.stderr
    with open(fifo, "rb") as reader:  # the target's own dump gets its reader
        reader.read()
    deadline = time.monotonic() + 30
    while not (first.exists() and first.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert first.read_text().startswith("heap_v2/")
    again = _cli("attach", str(target.pid), "status", "--format", "json", cache=tmp_path / "c")
    assert again.returncode == 0 and json.loads(again.stdout)["opt_prof"], again.stderr
    assert target.quit() == 0


def test_target_exits_during_the_call(storm_bin: Path, libjemalloc: Path, gdb: str,
                                      tmp_path: Path) -> None:
    """The target exits by itself (exit(0) after 3 s) while heapscope waits for a dump that
    a held lock keeps from finishing: one clean line."""
    t = storm.StormTarget([str(storm_bin), "2", "handlers", "0", "3000"],
                          storm.env_for(str(libjemalloc)))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert t.ask(f"f {fifo}") == "ok"
    p = _cli("attach", str(t.pid), "dump", "-o", str(tmp_path / "x.heap"),
             cache=tmp_path / "c")
    assert t.proc.wait(timeout=60) == 0
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 4 and len(lines) == 1, p.stderr
    assert f"process {t.pid} exited" in lines[0], p.stderr


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_killed_run_never_kills_the_program(storm_bin: Path, libjemalloc: Path,
                                            gdb: str, tmp_path: Path, seed: int) -> None:
    """``heapscope run --every`` SIGKILLed at a random moment: the program (which logs to
    stderr 10 times a second) keeps running and logging, exits normally when told, its
    final dump is complete, and ``heapscope leaks`` reads the session, saying the run did
    not finish."""
    rnd = random.Random(seed)
    session = tmp_path / "s"
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"))
    hs = subprocess.Popen([sys.executable, "-m", "heapscope.cli.main", "run", "-o",
                           str(session), "--every", "0.3", "--", str(storm_bin), "2",
                           "handlers", "100"], env=env, stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
    assert hs.stdout is not None and hs.stdin is not None and hs.stderr is not None
    pid = int(hs.stdout.readline().split()[1])
    time.sleep(rnd.uniform(0.2, 2.5))
    hs.kill()
    hs.wait()
    time.sleep(1.0)  # the program logs ten lines meanwhile: no SIGPIPE, no block
    assert storm.state(pid) not in ("", "Z", "X"), "the program died with heapscope"
    hs.stdin.write("b\n")
    hs.stdin.flush()
    assert len(hs.stdout.readline().split()) == 2  # it answers
    hs.stdin.write("q\n")
    hs.stdin.flush()
    deadline = time.monotonic() + 30
    while storm.state(pid) not in ("", "Z", "X") and time.monotonic() < deadline:
        time.sleep(0.05)
    err = hs.stderr.read()
    assert "storm: log line" in err.splitlines()[-1], err[-300:]
    (final,) = (session / "dumps").glob(f"jeprof.{pid}.*.f.heap")
    text = final.read_text()
    assert text.startswith("heap_v2/") and "MAPPED_LIBRARIES:" in text
    leaks = subprocess.run([sys.executable, "-m", "heapscope.cli.main", "leaks", str(session)],
                           env=env, capture_output=True, text=True, timeout=300)
    assert leaks.returncode == 0, leaks.stderr
    assert "the run did not finish" in leaks.stdout, leaks.stdout


@contextlib.contextmanager
def _inside(binary: Path, lib: Path, where: str, helper: bool
            ) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """inside.c placed ``where``, with a second idle thread when ``helper``: (process, tid of
    its main thread). It must end with exit 0 on SIGTERM: it was where it was, and goes on
    from there."""
    argv = [str(binary), where] + (["helper"] if helper else [])
    p = subprocess.Popen(argv, env=storm.env_for(str(lib)), stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline().split()
        assert line[0] == "ready", line
        yield p, int(line[2])
        p.terminate()
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("where, why", [
    ("loader", "inside the loader"),
    ("allocator", "inside the allocator"),
    ("altstack", "alternate signal stack"),
])
def test_no_call_where_it_could_deadlock_or_corrupt(inside_bin: Path, libjemalloc: Path,
                                                    gdb: str, tmp_path: Path,
                                                    where: str, why: str) -> None:
    """The only thread sits inside dl_iterate_phdr (the loader's lock), inside jemalloc
    (malloc_stats_print's callback), or in a signal handler on an alternate stack carved
    from a heap block: heapscope runs no call there, says why, and the process is
    untouched. With a second, idle thread the calls run on that one."""
    with _inside(inside_bin, libjemalloc, where, helper=False) as (p, _main):
        r = _cli("attach", str(p.pid), "status", "--retries", "1", cache=tmp_path / "c")
        assert r.returncode == 4 and why in r.stderr, r.stderr
        assert "no thread could run the call" in r.stderr
    with _inside(inside_bin, libjemalloc, where, helper=True) as (p, main_tid):
        r = _cli("attach", str(p.pid), "status", "--format", "json", cache=tmp_path / "c")
        assert r.returncode == 0, r.stderr
        st = json.loads(r.stdout)
        assert st["attach"]["caller_tid"] not in (0, main_tid), st["attach"]


def test_handler_on_its_own_stack_may_run_the_calls(inside_bin: Path, libjemalloc: Path,
                                                    gdb: str, tmp_path: Path) -> None:
    """A thread inside a signal handler on its own stack (how PostgreSQL before 16 runs its
    forked workers) is not refused for that."""
    with _inside(inside_bin, libjemalloc, "handler", helper=False) as (p, main_tid):
        r = _cli("attach", str(p.pid), "status", "--format", "json", cache=tmp_path / "c")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["attach"]["caller_tid"] == main_tid


_WALK = r"""
import json, os, sys
from heapscope.capture import codemap, ptracer as pt, stub, unwind
from heapscope.symbols.symtab import SymbolTable

pid, tid = int(sys.argv[1]), int(sys.argv[2])
maps = pt.read_maps(pid)
cm = codemap.code_map(pid, stub.read_maps(pid))
proc = pt.Process(pid)
proc.seize(pid)
if tid != pid:
    proc.seize(tid)
proc.mem = os.open(f"/proc/{pid}/mem", os.O_RDWR)
objects = unwind.Objects(unwind.Memory(proc.read), maps)
pt.ptrace(pt.PTRACE_INTERRUPT, tid)
assert proc.wait_stop(tid, 10) == "stopped"
regs = proc.regs(tid)
start = {d: regs[i] for d, i in pt.DWARF_REGS.items()}
frames, end, _ = unwind.walk(objects, unwind.Memory(proc.read), start, set(cm.restorers))
proc.release(tid)
proc.release(pid)
exe = os.readlink(f"/proc/{pid}/exe")
table = SymbolTable.read(exe)
base = min(m[0] for m in maps if m[3] == exe)
names = []
for f in frames:
    m = next((m for m in maps if m[0] <= f.pc < m[1]), None)
    if f.signal:
        names.append("<signal>")
    elif m and m[3] == exe:
        names.append(table.lookup(f.pc - base) or "?")
    else:
        names.append(os.path.basename(m[3]) if m else "?")
print(json.dumps({"frames": names, "end": end}))
"""


def test_stack_walk_of_a_real_thread(inside_bin: Path, libjemalloc: Path, gdb: str,
                                     tmp_path: Path) -> None:
    """A thread asleep in a signal handler, walked with the call frame information read
    from the process's memory: every frame of the program is named as the source nests
    them, the signal frame is crossed, and the walk reaches the outermost frame."""
    with _inside(inside_bin, libjemalloc, "handler", helper=False) as (p, main_tid):
        r = subprocess.run([sys.executable, "-c", _WALK, str(p.pid), str(main_tid)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        walked = json.loads(r.stdout)
    assert walked["end"] == "done", walked
    ours = [n for n in walked["frames"] if not n.startswith("lib")]
    assert ours == ["wait_here", "in_handler", "<signal>", "main", "_start"], walked
