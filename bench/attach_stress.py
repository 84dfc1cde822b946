"""The full storm behind heapscope's promise never to harm a process, and the pause an attach
causes: a stress script, run by hand (the full run takes tens of minutes; a slice of it runs
in the suite as tests/e2e/test_attach_safety.py).

Against tests/e2e/attachprog/storm.c (every thread allocates all the time; each signal counted
by a handler, or default dispositions) under jemalloc with profiling:

1. CYCLES attaches alternating dump and status, under storms of SIGINT, SIGTERM, SIGHUP,
   SIGUSR1, SIGUSR2, SIGCHLD, SIGALRM, SIGPIPE, SIGTRAP, SIGCONT and SIGSTOP/SIGCONT pairs with
   handlers installed, then CYCLES/4 under the default dispositions of CHLD, URG, WINCH and
   CONT: target deaths, lost and doubled signals, stops that did not stop, bad dumps;
2. KILLS kills of heapscope's tracer (the ptracer process) at random moments of an attach;
3. RUNS ``heapscope run --every 0.3`` SIGKILLed at a random moment while the program logs to
   stderr ten times a second: program deaths, final dumps incomplete;
4. the pause each attach causes, as a distribution (median, p99, worst): how long one thread
   was held stopped, and the longest gap of the target's 1 ms heartbeat, on this machine as it
   is and with LOAD busy workers (twice the cores by default) running beside it.

    .venv/bin/python bench/attach_stress.py [--cycles 2000] [--kills 200] [--runs 100]
    .venv/bin/python bench/attach_stress.py --quick      # a few minutes
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.e2e import storm  # noqa: E402

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def _busy(stop: Any) -> None:
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


class Load:
    """``n`` busy processes beside the storm (a loaded machine, like a busy CI box)."""

    def __init__(self, n: int) -> None:
        self.stop = multiprocessing.Event()
        self.procs = [multiprocessing.Process(target=_busy, args=(self.stop,), daemon=True)
                      for _ in range(n)]

    def __enter__(self) -> Load:
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for p in self.procs:
            p.join(timeout=10)


def signal_storms(binary: Path, cycles: int, work: Path) -> bool:
    ok = True
    t = storm.StormTarget([str(binary), "3"], storm.env_for(JEMALLOC))
    with storm.SignalStorm(t, storm.HANDLED, stop_cont=True) as s:
        log = storm.attach_cycles(t, cycles, work / "handled")
    rc = t.quit()
    doc = storm.summary(log, s.log, exit=rc)
    storm.print_summary("signals, handlers installed", doc)
    ok &= rc == 0 and not s.log.lost and not s.log.doubled and not s.log.stops_lost \
        and not log.bad_dumps
    t = storm.StormTarget([str(binary), "3", "default"], storm.env_for(JEMALLOC))
    with storm.SignalStorm(t, storm.HARMLESS_DEFAULT, counted=False) as s:
        log = storm.attach_cycles(t, max(cycles // 4, 10), work / "default")
    rc = t.quit()
    storm.print_summary("signals, default dispositions", storm.summary(log, s.log, exit=rc))
    return ok and rc == 0 and not log.bad_dumps


def tracer_kills(binary: Path, kills: int, work: Path) -> bool:
    t = storm.StormTarget([str(binary), "3"], storm.env_for(JEMALLOC))
    with storm.TracerKiller(latest=0.06) as k:
        log = storm.attach_cycles(t, kills, work / "kills", until=lambda: k.kills >= kills)
    after = storm.attach_cycles(t, 4, work / "after")
    alive = t.proc.poll() is None and storm.state(t.pid) not in ("T", "t")
    rc = t.quit()
    storm.print_summary("tracer killed", storm.summary(log, kills=k.kills, after_ok=after.ok,
                                                        after_errors=dict(after.errors),
                                                        alive=alive, exit=rc))
    return alive and rc == 0 and after.ok == 4


def run_kills(binary: Path, runs: int, work: Path) -> bool:
    deaths = incomplete = 0
    for i in range(runs):
        session = work / f"run{i}"
        hs = subprocess.Popen([sys.executable, "-m", "heapscope.cli.main", "run", "-o",
                               str(session), "--every", "0.3", "--", str(binary), "2",
                               "handlers", "100"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              bufsize=1, env=dict(os.environ, HEAPSCOPE_CACHE_DIR=str(work /
                                                                                     "c")))
        assert hs.stdout is not None and hs.stdin is not None
        pid = int(hs.stdout.readline().split()[1])
        time.sleep(random.uniform(0.05, 2.5))
        hs.kill()
        hs.wait()
        time.sleep(0.5)
        if storm.state(pid) in ("", "Z", "X"):
            deaths += 1
            continue
        hs.stdin.write("q\n")
        hs.stdin.flush()
        deadline = time.monotonic() + 30
        while storm.state(pid) not in ("", "Z", "X") and time.monotonic() < deadline:
            time.sleep(0.05)
        finals = list((session / "dumps").glob(f"jeprof.{pid}.*.f.heap"))
        if len(finals) != 1 or "MAPPED_LIBRARIES:" not in finals[0].read_text():
            incomplete += 1
        shutil.rmtree(session, ignore_errors=True)
    storm.print_summary("heapscope run killed", {"runs": runs, "program_deaths": deaths,
                                                 "final_dumps_incomplete": incomplete})
    return deaths == 0 and incomplete == 0


def pauses(binary: Path, cycles: int, load: int, work: Path) -> None:
    """How long one thread is held per attach, and the target's heartbeat gaps with the
    attaches and, over as long, without them (what the machine alone does to it)."""
    for label, n in (("idle machine", 0), (f"loaded: {load} busy workers", load)):
        with Load(n):
            t = storm.StormTarget([str(binary), "3"], storm.env_for(JEMALLOC))
            started = time.monotonic()
            log = storm.attach_cycles(t, cycles, work / f"pause{n}")
            each = (time.monotonic() - started) / max(log.cycles, 1)
            t.beat()
            quiet = []
            for _ in range(log.cycles):
                time.sleep(each)
                quiet.append(t.beat()[1] / 1000)
            t.quit()
        doc = storm.summary(log)
        doc["heartbeat_gap_ms_without_attaches"] = storm.summary(
            storm.CycleLog(gaps_ms=quiet))["heartbeat_gap_ms"]
        storm.print_summary(f"pause, {label}", doc)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--kills", type=int, default=200)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--load", type=int, default=2 * (os.cpu_count() or 1))
    ap.add_argument("--quick", action="store_true", help="100 cycles, 20 kills, 10 runs")
    args = ap.parse_args()
    if args.quick:
        args.cycles, args.kills, args.runs = 100, 20, 10
    work = Path(tempfile.mkdtemp(prefix="heapscope-stress-"))
    try:
        binary = storm.build(os.environ.get("CC", "gcc"), work / "storm")
        ok = signal_storms(binary, args.cycles, work)
        ok &= tracer_kills(binary, args.kills, work)
        ok &= run_kills(binary, args.runs, work)
        pauses(binary, min(args.cycles, 200), args.load, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("no harm seen" if ok else "HARM SEEN: see the lines above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
