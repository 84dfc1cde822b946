#!/usr/bin/env python3
"""How fast is ``heapscope leaks`` on a long series of big dumps?

    python bench/leaks_speed.py --dumps 300     # 300 dumps of a ~20k-stack process
    python bench/leaks_speed.py --stacks 2000 --dumps 1440   # a day of `watch --every 60`
    python bench/leaks_speed.py --stacks 50000 --dumps 200 --check

Targets (cold = empty HEAPSCOPE_CACHE_DIR, warm = the same directory again; medians of
``--runs`` runs, each cold then warm):
- 300 dumps of a 20,000-stack process: <= 4 s cold, <= 1.5 s warm, <= 400 MB peak RSS;
- 100 dumps of a 20,000-stack process: < 10 s cold;
- 1,440 dumps of a 2,000-stack process: <= 3 s cold, and in under 5 s when one more
  dump is added to a series already judged ("+1": the series without its last running dump
  is judged first, then the dump is added and the series judged again with the same cache).

Beside them the floor: the time to read every byte of the dumps from the page cache (one
process, after a first read to fill the cache), so a run reads as a multiple of it.

Steps:
1. Generate bench/bench_gen.py's call tree (3,000 functions in 20 translation units, 4 call
   sites each; the same parameters as bench/run.py) and link it with bench/many_stacks.c
   (the driver) and a generated roots.c (the tree's root, taken from the generator's
   main.c). Builds are cached in bench/.work/leaks-<key>/.
2. ``heapscope run -o SESSION --sample 128 --no-symbolize -- many_stacks STACKS DUMPS``:
   one live object (1-2 KiB) on each of STACKS distinct stacks, then DUMPS steps each
   ending with a manual ``prof.dump``; one stack in 200 leaks 8 objects per step, one in
   200 grows as fast during the first third only, one in 200 churns, the rest stay. With objects of
   >= 1 KiB a 128-byte sample period samples nearly every object, so each dump holds
   ~STACKS stacks (jemalloc aggregates objects per stack: the dump size depends on the
   stack count, not on the sample period). The session is reused while it is complete
   (``--fresh`` makes a new one).
3. Time ``heapscope leaks --format json SESSION`` cold (HEAPSCOPE_CACHE_DIR a new empty
   directory) and warm (the same directory again); wall time and peak RSS.

The heapscope command is ``--heapscope CMD`` if given, else ``heapscope`` on PATH, else
``python -m heapscope.cli.main`` with ``src/`` on PYTHONPATH. ``--check`` exits 1 when the
cold run misses the target (or fails).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import bench_gen  # noqa: E402
import jemalloc as je  # noqa: E402  (tests/e2e/jemalloc.py)
from run import CFLAGS, GEN_PARAMS, GNU_TIME, heapscope_command  # noqa: E402  (bench/run.py)

DRIVER = BENCH_DIR / "many_stacks.c"
EVERY = 200  # many_stacks.c: one stack in EVERY leaks, one is bounded, one churns
#: (stacks, dumps) -> limits: cold and warm seconds, peak RSS in MB (10**6 bytes).
TARGETS: dict[tuple[int, int], dict[str, float]] = {
    (20_000, 300): {"cold": 4.0, "warm": 1.5, "rss": 400.0},
    (20_000, 100): {"cold": 10.0},
    (2_000, 1_440): {"cold": 3.0},
}
PLUS_ONE_SECONDS = 5.0

_ROOT_CASE = re.compile(r"case (\d)u: (f\d+)\(x >> 2\); break;")


def write_roots(src: Path) -> Path:
    """roots.c with the generator's hs_root (static in its main.c), made extern."""
    main_c = (src / "main.c").read_text()
    body = main_c[main_c.index("static void hs_root(") :]
    body = body[: body.index("\n}\n") + 3]
    cases = _ROOT_CASE.findall(body)
    if len(cases) != bench_gen.FANOUT:
        raise SystemExit(f"cannot find hs_root's {bench_gen.FANOUT} cases in {src}/main.c")
    lines = ['#include "gen.h"', "", "void hs_root(unsigned x)", "{", "    switch (x & 3u) {"]
    lines += [f"    case {c}u: {f}(x >> 2); break;" for c, f in cases]
    lines += ["    }", "    hs_depth_guard++;", "}", ""]
    path = src / "roots.c"
    path.write_text("\n".join(lines))
    return path


def build(work: Path, fresh: bool) -> Path:
    gcc = je.find_tool("gcc")
    if gcc is None:
        sys.exit("gcc not found: apt-get install gcc")
    version = subprocess.run([str(gcc), "-dumpfullversion"], capture_output=True, text=True,
                             check=False).stdout.strip()
    key_src = json.dumps([GEN_PARAMS, CFLAGS, version, Path(bench_gen.__file__).read_text(),
                          DRIVER.read_text()], sort_keys=True)
    gdir = work / f"leaks-{hashlib.sha256(key_src.encode()).hexdigest()[:12]}"
    binary = gdir / "many_stacks"
    if fresh and gdir.exists():
        shutil.rmtree(gdir)
    if not binary.exists():
        print(f"generating and building {binary} ...", flush=True)
        t0 = time.perf_counter()
        sources = bench_gen.generate(gdir / "src", **GEN_PARAMS)
        tus = [s for s in sources if s.name != "main.c"]
        roots = write_roots(gdir / "src")
        je.build([*tus, roots, DRIVER], binary, (*CFLAGS, f"-I{gdir / 'src'}"), compiler=gcc,
                 link_flags=["-ldl"], timeout=1800)
        print(f"  built in {time.perf_counter() - t0:.1f} s", flush=True)
    return binary.resolve()


def session_dumps(session: Path) -> list[Path]:
    return sorted((session / "dumps").glob("*.heap"), key=lambda p: je._dump_sort_key(p))


def record(session: Path, hs: list[str], env: dict[str, str], binary: Path, stacks: int,
           dumps: int, sample: int, symbolize: bool) -> float | None:
    """Run the program under ``heapscope run`` unless SESSION already holds its series.
    Returns the run's wall time (None when reused)."""
    have = [d for d in session_dumps(session) if ".m" in d.name] if session.exists() else []
    if len(have) == dumps and (session / "manifest.json").exists():
        print(f"reusing {session} ({len(have)} dumps; --fresh to record again)", flush=True)
        return None
    if session.exists():
        shutil.rmtree(session)
    argv = [*hs, "run", "-o", str(session), "--sample", str(sample),
            *([] if symbolize else ["--no-symbolize"]), "--", str(binary), str(stacks),
            str(dumps)]
    print(f"$ {' '.join(argv)}", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hs-leaks-bench-cache-") as cache:
        p = subprocess.run(argv, env={**env, "HEAPSCOPE_CACHE_DIR": cache},
                           capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"heapscope run exited {p.returncode}:\n{p.stderr[-3000:]}")
    print(f"  recorded in {wall:.1f} s", flush=True)
    return wall


def timed(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str],
                                                          float, float | None]:
    """(process, wall seconds, peak RSS in MiB or None)."""
    with tempfile.NamedTemporaryFile(prefix="hs-bench-time-", delete=False) as tf:
        time_file = Path(tf.name)
    full = [GNU_TIME, "-f", "%M", "-o", str(time_file), *argv] if GNU_TIME else argv
    t0 = time.perf_counter()
    p = subprocess.run(full, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    rss = None
    if GNU_TIME:
        nums = [ln for ln in time_file.read_text().splitlines() if ln.strip().isdigit()]
        rss = int(nums[-1]) / 1024 if nums else None
    time_file.unlink(missing_ok=True)
    return p, wall, rss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", type=int, default=20_000)
    ap.add_argument("--dumps", type=int, default=100)
    ap.add_argument("--sample", type=int, default=128, help="heapscope run --sample (bytes)")
    ap.add_argument("--work", type=Path, default=BENCH_DIR / ".work")
    ap.add_argument("--fresh", action="store_true", help="rebuild and record again")
    ap.add_argument("--symbolize-in-run", action="store_true",
                    help="let heapscope run write symbolized/ (default --no-symbolize)")
    ap.add_argument("--heapscope", help="heapscope command line (default: see --help)")
    ap.add_argument("--check", action="store_true", help="exit 1 when the target is missed")
    ap.add_argument("--runs", type=int, default=3,
                    help="cold+warm runs; medians are compared with the targets")
    args = ap.parse_args()

    lib = je.find_libjemalloc()
    if lib is None or not je.jemalloc_has_profiling(lib):
        sys.exit("libjemalloc2 with profiling not installed: apt-get install libjemalloc2")
    args.work.mkdir(parents=True, exist_ok=True)
    binary = build(args.work, args.fresh)
    hs, extra_env = heapscope_command(args.heapscope)
    env = {**os.environ, **extra_env}
    for k in ("LD_PRELOAD", "MALLOC_CONF", "_RJEM_MALLOC_CONF"):
        env.pop(k, None)
    session = binary.parent / (f"session-{args.stacks}x{args.dumps}-s{args.sample}"
                               + ("-sym" if args.symbolize_in_run else ""))
    record(session, hs, env, binary, args.stacks, args.dumps, args.sample,
           args.symbolize_in_run)

    dumps = session_dumps(session)
    manual = [d for d in dumps if ".m" in d.name]
    size = sum(d.stat().st_size for d in dumps)
    probes = [manual[0], manual[len(manual) // 2], manual[-1]] if manual else dumps[-1:]
    per_dump = [je.dump_info(d, addresses=False).stacks for d in probes]
    print(f"series: {len(dumps)} dumps ({len(manual)} manual + final), "
          f"{size / 1e6:.0f} MB in all, {size / max(1, len(dumps)) / 1e6:.1f} MB per dump; "
          f"stacks per dump (first/middle/last): {'/'.join(map(str, per_dump))}", flush=True)

    floor = statistics.median(read_floor(dumps) for _ in range(max(1, args.runs)))
    print(f"floor: reading the {size / 1e6:.0f} MB from the page cache takes {floor:.2f} s "
          "(median)", flush=True)

    argv = [*hs, "leaks", "--format", "json", str(session)]
    walls: dict[str, list[float]] = {"cold": [], "warm": []}
    peaks: dict[str, list[float]] = {"cold": [], "warm": []}
    cold: subprocess.CompletedProcess[str] | None = None
    failed = False
    for run in range(1, max(1, args.runs) + 1):
        with tempfile.TemporaryDirectory(prefix="hs-leaks-bench-cache-") as cache:
            for label in ("cold", "warm"):
                p, wall, rss = timed(argv, {**env, "HEAPSCOPE_CACHE_DIR": cache})
                if label == "cold" and cold is None:
                    cold = p
                walls[label].append(wall)
                if rss is not None:
                    peaks[label].append(rss * 1024 * 1024 / 1e6)
                rss_text = f"{rss * 1024 * 1024 / 1e6:.0f} MB" if rss is not None else "?"
                status = "" if p.returncode == 0 else f"  FAILED (exit {p.returncode})"
                print(f"run {run}: heapscope leaks ({label} cache): {wall:.2f} s, peak RSS "
                      f"{rss_text}{status}", flush=True)
                if p.returncode != 0:
                    print("\n".join(p.stderr.strip().splitlines()[-15:]))
                    failed = True
                    break
        if failed:
            break
    median = {k: statistics.median(v) for k, v in walls.items() if v}
    peak = {k: statistics.median(v) for k, v in peaks.items() if v}
    for label in ("cold", "warm"):
        if label in median:
            rss_text = f", peak RSS {peak[label]:.0f} MB" if label in peak else ""
            print(f"median of {len(walls[label])}, {label}: {median[label]:.2f} s "
                  f"({median[label] / floor:.1f}x the floor){rss_text}", flush=True)

    assert cold is not None
    ok = cold.returncode == 0 and not failed
    if cold.returncode == 0:
        try:
            report = json.loads(cold.stdout)
            verdicts = Counter(s.get("verdict") for s in report.get("suspects", []))
            n = (args.stacks + EVERY - 1) // EVERY
            print(f"suspects: {sum(verdicts.values())} "
                  f"({', '.join(f'{v} {n}' for v, n in verdicts.most_common())}); "
                  f"truth: {n} leaking, {n} bounded, {n} churning stacks, the rest steady "
                  "(sites that merge stacks merge their verdicts)")
        except ValueError:
            print("heapscope leaks printed no JSON")
            ok = False
    ran = ok  # each target is judged on its own: a slow run may still meet the memory one
    for what, limit in TARGETS.get((args.stacks, args.dumps), {}).items():
        if what == "rss":
            got = max(peak.values()) if peak else None
            shown = f"{got:.0f} MB" if got is not None else "unknown"
            wanted = f"peak RSS <= {limit:.0f} MB"
        else:
            got = median.get(what)
            shown = f"{got:.2f} s" if got is not None else "failed"
            wanted = f"<= {limit:g} s {what}"
        met = ran and got is not None and got <= limit
        print(f"target: {args.dumps} dumps of a {args.stacks}-stack process, {wanted}: "
              f"{shown} -> {'met' if met else 'MISSED'}")
        ok = ok and met
    if ran and args.dumps >= 100:
        plus = plus_one(session, hs, env)
        met = plus is not None and plus < PLUS_ONE_SECONDS
        print(f"target: one more dump judged in under {PLUS_ONE_SECONDS:.0f} s: "
              f"{'failed' if plus is None else f'{plus:.2f} s'} -> "
              f"{'met' if met else 'MISSED'}")
        ok = ok and met
    return 1 if args.check and not ok else 0


def read_floor(dumps: list[Path]) -> float:
    """Seconds to read every byte of ``dumps`` once they are in the page cache."""
    for d in dumps:  # fill the cache first: the floor is the machine's, not the disk's
        d.read_bytes()
    t0 = time.perf_counter()
    for d in dumps:
        with d.open("rb", buffering=0) as f:
            while f.read(1 << 22):
                pass
    return time.perf_counter() - t0


def plus_one(session: Path, hs: list[str], env: dict[str, str]) -> float | None:
    """Seconds to judge the series again after one more running dump arrives."""
    dumps = session_dumps(session)
    manual = [d for d in dumps if ".m" in d.name]
    if len(manual) < 3:
        return None
    with tempfile.TemporaryDirectory(prefix="hs-leaks-plus1-") as tmp:
        folder = Path(tmp) / "dumps"
        folder.mkdir()
        for d in manual[:-1]:
            (folder / d.name).symlink_to(d)
        argv = [*hs, "leaks", "--format", "json", str(folder)]
        cache = {**env, "HEAPSCOPE_CACHE_DIR": str(Path(tmp) / "cache")}
        first, wall, _ = timed(argv, cache)
        if first.returncode != 0:
            return None
        print(f"heapscope leaks, {len(manual) - 1} dumps (cold cache): {wall:.2f} s", flush=True)
        (folder / manual[-1].name).symlink_to(manual[-1])
        again, wall, rss = timed(argv, cache)
        rss_text = f"{rss * 1024 * 1024 / 1e6:.0f} MB" if rss is not None else "?"
        print(f"heapscope leaks, one more dump ({len(manual)}): {wall:.2f} s, peak RSS "
              f"{rss_text}", flush=True)
        return wall if again.returncode == 0 else None


if __name__ == "__main__":
    sys.exit(main())
