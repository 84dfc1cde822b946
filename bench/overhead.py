"""Wall-time overhead of ``heapscope run`` (default sampling) against plain jemalloc.

Builds bench/alloc_heavy.c, then alternates runs of the same workload under
``LD_PRELOAD=libjemalloc.so.2`` with no profiling, and under ``heapscope run`` with its
defaults, and prints the medians and the overhead. Two numbers: the program's own wall time
under heapscope (start to exit, what production would feel) and heapscope's whole command
(including its start-up, jemalloc probe and the report). Target: <= 3%.

Run: python bench/overhead.py [--runs N] [--iterations N] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LIB_CANDIDATES = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib64/libjemalloc.so.2",
                  "/usr/lib/libjemalloc.so.2")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=20_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--touch", type=int, choices=(0, 1), default=None,
                    help="1: the program writes all it allocates; 0: pure malloc/free "
                         "(worst case); default: both")
    args = ap.parse_args()
    lib = next((p for p in LIB_CANDIDATES if os.path.exists(p)), None)
    if lib is None:
        print("no libjemalloc.so.2: apt-get install libjemalloc2", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="heapscope-overhead-"))
    prog = work / "alloc_heavy"
    subprocess.run(["gcc", "-O2", "-g", "-pthread", "-o", str(prog), str(HERE / "alloc_heavy.c")],
                   check=True)
    for touch in ([args.touch] if args.touch is not None else [0, 1]):
        cmd = [str(prog), str(args.threads), str(args.iterations), str(touch)]
        label = "writes all it allocates" if touch else "pure malloc/free, worst case"
        _measure(cmd, label, lib, work, args.runs)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _measure(cmd: list[str], label: str, lib: str, work: Path, runs: int) -> None:
    heapscope = [sys.executable, "-m", "heapscope.cli.main"]
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(work / "cache"))
    plain, by_hand, program, whole = [], [], [], []
    for k in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, env=dict(os.environ, LD_PRELOAD=lib), check=True,
                       stdout=subprocess.DEVNULL)
        plain.append(time.perf_counter() - t)
        # The same profiling settings heapscope uses, set by hand: jemalloc's own cost.
        conf = ("prof:true,prof_final:true,prof_leak:true,lg_prof_sample:19,"
                f"prof_sys_thread_name:true,prof_prefix:{work}/hand{k}")
        t = time.perf_counter()
        subprocess.run(cmd, env=dict(os.environ, LD_PRELOAD=lib, MALLOC_CONF=conf), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        by_hand.append(time.perf_counter() - t)
        session = Path(tempfile.mkdtemp(dir=work)) / "session"
        t = time.perf_counter()
        subprocess.run([*heapscope, "run", "-o", str(session), "--", *cmd], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        whole.append(time.perf_counter() - t)
        manifest = json.loads((session / "manifest.json").read_text())
        program.append(manifest["end_time"] - manifest["start_time"])
    base = statistics.median(plain)
    rows = [("plain jemalloc (no profiling)", base),
            ("jemalloc profiling set by hand", statistics.median(by_hand)),
            ("program under heapscope run", statistics.median(program)),
            ("whole heapscope run command", statistics.median(whole))]
    print(f"workload: {label}: {' '.join(cmd[1:])} (threads, iterations, touch); "
          f"{runs} runs each, medians")
    for name, value in rows:
        extra = "" if value is base else f"   overhead {100 * (value / base - 1):+.1f}%"
        print(f"  {name:<32} {value:7.2f} s{extra}")
    over = 100 * (statistics.median(program) / base - 1)
    ours = 100 * (statistics.median(program) / statistics.median(by_hand) - 1)
    print(f"  heapscope's own share (vs the same settings by hand): {ours:+.1f}%")
    print(f"  [{'PASS' if over <= 3 else 'MISS'}] program overhead <= 3% ({over:+.1f}%)")


if __name__ == "__main__":
    sys.exit(main())
