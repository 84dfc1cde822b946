#!/usr/bin/env python3
"""Benchmark heapscope against jemalloc's jeprof on large generated heap profiles.

    python bench/run.py            # ~21 MB dump, ~65k stacks
    python bench/run.py --large    # ~92 MB dump, ~280k stacks (jeprof takes minutes)

Steps:
1. Generate (bench/bench_gen.py: 3,000 functions in 20 translation units, 4 call sites
   each) and build the program once; builds and dumps are cached in bench/.work/.
2. Run it under LD_PRELOAD=libjemalloc.so.2 with
   ``prof:true,prof_final:true,prof_accum:true,lg_prof_sample:0`` (every allocation
   sampled) and report the dump's size, stack count and distinct addresses.
3. Time ``jeprof --text --show_bytes <bin> <dump>`` once and ``heapscope top --show-bytes
   <dump>`` ``--runs`` times (default 5) cold (HEAPSCOPE_CACHE_DIR = a fresh empty directory),
   each followed by a warm run (same directory again), in this one run of the script;
   medians are reported (wall via time.perf_counter, peak RSS via ``/usr/bin/time -f %M``
   or getrusage). ``--show_bytes``/``--show-bytes`` only change the unit, not the work;
   they make the ``Total: N B`` lines comparable: heapscope's total must equal jeprof's.
4. Compare whole ``top`` tables (by function, by line, cumulative allocations by line)
   with bench/golden/ (``--update-golden`` writes them): every allocation is sampled, so
   names and bytes do not depend on the run.
5. Time ``flamegraph`` and ``export --format pprof`` cold (medium dump only).

Targets (``--check`` exits 1 if one is missed): jeprof/heapscope cold >= 30x on the
~20 MB dump and >= 40x on the ~90 MB one, peak RSS <= 500 MB on the ~90 MB one, warm >= 2x
faster than cold, Totals equal to jeprof's, tables equal to the golden ones.

``--cached-jeprof`` reuses jeprof's time from an earlier run on the same dump (kept in
``jeprof.json`` next to it: the large run takes minutes), ``--no-jeprof`` skips it.
The heapscope command is ``--heapscope CMD`` if given, else ``heapscope`` on PATH, else
``python -m heapscope.cli.main`` with ``src/`` on PYTHONPATH. A failing heapscope is
reported, not fatal.
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import hashlib
import json
import os
import platform
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import bench_gen  # noqa: E402
import jemalloc as je  # noqa: E402  (tests/e2e/jemalloc.py)

GEN_PARAMS = {"functions": 3000, "tus": 20, "layers": 10, "seed": 1}
CFLAGS = ("-O1", "-g", "-fno-optimize-sibling-calls", "-fno-inline")
MEDIUM_STACKS = 65_000
LARGE_STACKS = 280_000
BENCH_CONF = "lg_prof_sample:0,prof_accum:true"

TARGET_SPEEDUP = 30.0  # jeprof / heapscope cold, on the ~20 MB dump
TARGET_LARGE_SPEEDUP = 40.0  # on the ~90 MB dump
TARGET_LARGE_RSS_MB = 500.0  # heapscope's peak on the ~90 MB dump
TARGET_WARM_RATIO = 2.0  # cold / warm


@dataclass
class Measured:
    label: str
    cmd: list[str]
    ok: bool
    returncode: int
    wall_s: float
    rss_mb: float | None
    rss_exact: bool
    total: float | None
    total_unit: str | None
    error: str = ""
    cached_from: str = ""


def _gnu_time() -> str | None:
    t = "/usr/bin/time"
    if not os.access(t, os.X_OK):
        return None
    try:
        p = subprocess.run(
            [t, "-f", "%M", "true"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return t if p.returncode == 0 and p.stderr.strip().isdigit() else None


GNU_TIME = _gnu_time()


def measure(
    label: str,
    cmd: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 3600,
    *,
    expect_total: bool = True,
) -> Measured:
    """Run *cmd*, return wall time, peak RSS and the parsed ``Total:`` line (if expected)."""
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    with tempfile.NamedTemporaryFile(prefix="hs-bench-time-", delete=False) as tf:
        time_file = Path(tf.name)
    argv = [GNU_TIME, "-f", "%M", "-o", str(time_file), *cmd] if GNU_TIME else list(cmd)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            argv, env=full_env, capture_output=True, text=True, timeout=timeout, check=False
        )
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired:
        rc, out, err = -1, "", f"timed out after {timeout}s"
    except OSError as e:
        rc, out, err = -1, "", str(e)
    wall = time.perf_counter() - t0
    rss: float | None = None
    exact = False
    if GNU_TIME:
        try:
            lines = [ln for ln in time_file.read_text().splitlines() if ln.strip().isdigit()]
            rss = int(lines[-1]) / 1024.0 if lines else None
            exact = rss is not None
        except OSError:
            rss = None
    if rss is None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        # ru_maxrss of all children ever: exact only if this one is the largest so far.
        rss = after / 1024.0 if after > before else None
    time_file.unlink(missing_ok=True)
    total = je.parse_total(out)
    ok = rc == 0 and (total is not None or not expect_total)
    error = ""
    if not ok:
        tail = "\n".join((err or out).strip().splitlines()[-15:])
        error = (
            f"exit {rc}"
            + ("" if total is not None or not expect_total else ", no 'Total:' line")
            + (f"\n{tail}" if tail else "")
        )
    return Measured(
        label,
        list(cmd),
        ok,
        rc,
        wall,
        rss,
        exact,
        total[0] if total else None,
        total[1] if total else None,
        error,
    )


# --------------------------------------------------------------------------------------


def prepare(work: Path, stacks: int, repeat: int, fresh: bool) -> tuple[Path, Path]:
    """Build the generated program and produce its dump (cached). Returns (binary, dump)."""
    gcc = je.find_tool("gcc")
    if gcc is None:
        sys.exit("gcc not found: apt-get install gcc")
    lib = je.find_libjemalloc()
    if lib is None or not je.jemalloc_has_profiling(lib):
        sys.exit("libjemalloc2 with profiling not installed: apt-get install libjemalloc2")
    gcc_version = subprocess.run(
        [str(gcc), "-dumpfullversion"], capture_output=True, text=True, check=False
    ).stdout.strip()
    key_src = json.dumps(
        [GEN_PARAMS, CFLAGS, gcc_version, Path(bench_gen.__file__).read_text()], sort_keys=True
    )
    key = hashlib.sha256(key_src.encode()).hexdigest()[:12]
    gdir = work / f"gen-{key}"
    binary = gdir / "bench_prog"
    if fresh and gdir.exists():
        shutil.rmtree(gdir)
    if not binary.exists():
        print(f"generating and building {gdir} ...", flush=True)
        t0 = time.perf_counter()
        sources = bench_gen.generate(gdir / "src", **GEN_PARAMS)
        je.build(sources, binary, CFLAGS, compiler=gcc, timeout=1800)
        print(f"  built in {time.perf_counter() - t0:.1f} s", flush=True)
    run_dir = gdir / f"run-{stacks}x{repeat}"
    dumps = sorted(run_dir.glob("jeprof.*.f.heap")) if run_dir.exists() else []
    if len(dumps) != 1:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        print(f"running {binary.name} {stacks} {repeat} under jemalloc ...", flush=True)
        t0 = time.perf_counter()
        dumps = je.run_profiled(
            [binary, str(stacks), str(repeat)], run_dir, BENCH_CONF, lib=lib, timeout=3600
        )
        dumps = [d for d in dumps if d.name.endswith(".f.heap")]
        print(f"  ran in {time.perf_counter() - t0:.1f} s", flush=True)
    return binary.resolve(), dumps[0].resolve()


def heapscope_command(arg: str | None) -> tuple[list[str], dict[str, str]]:
    if arg:
        return shlex.split(arg), {}
    exe = shutil.which("heapscope")
    if exe:
        return [exe], {}
    pp = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    return [sys.executable, "-m", "heapscope.cli.main"], {"PYTHONPATH": pp}


def jeprof_measurement(binary: Path, dump: Path, rerun: bool) -> Measured | None:
    jeprof = je.find_jeprof()
    if jeprof is None:
        print("jeprof not found (apt-get install libjemalloc-dev): skipping jeprof")
        return None
    cache = dump.parent / "jeprof.json"
    if cache.exists() and not rerun:
        try:
            data = json.loads(cache.read_text())
            if data.get("dump_mtime") == dump.stat().st_mtime_ns:
                m = Measured(**data["measured"])
                m.cached_from = data.get("when", "?")
                return m
        except (ValueError, TypeError, KeyError):
            pass
    print("timing jeprof --text (this takes a while) ...", flush=True)
    m = measure("jeprof --text", [str(jeprof), "--text", "--show_bytes", str(binary), str(dump)])
    if m.ok:
        cache.write_text(
            json.dumps(
                {
                    "dump_mtime": dump.stat().st_mtime_ns,
                    "when": time.strftime("%Y-%m-%d %H:%M:%S"),
                    "measured": asdict(m),
                },
                indent=1,
            )
        )
    return m


def fmt_rss(m: Measured) -> str:
    if m.rss_mb is None:
        return "?"
    return f"{m.rss_mb:,.0f} MB" + ("" if m.rss_exact else " (>=)")


def fmt_total(m: Measured) -> str:
    return "-" if m.total is None else f"{m.total:,.0f} {m.total_unit}"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def median_of(runs: list[Measured]) -> Measured:
    """One row standing for several runs: the run with the median wall time (failed runs
    win, so a failure is never hidden behind a median)."""
    failed = [m for m in runs if not m.ok]
    if failed:
        return failed[0]
    wall = statistics.median(m.wall_s for m in runs)
    mid = sorted(runs, key=lambda m: m.wall_s)[(len(runs) - 1) // 2]
    rss = [m.rss_mb for m in runs if m.rss_mb is not None]
    return Measured(mid.label, mid.cmd, True, 0, wall, statistics.median(rss) if rss else None,
                    mid.rss_exact, mid.total, mid.total_unit)


def time_heapscope(hs_cmd: list[str], hs_env: dict[str, str], dump: Path, runs: int
                   ) -> tuple[list[Measured], list[Measured]]:
    """``runs`` cold runs of ``heapscope top``, each in a fresh cache directory and followed
    by one warm run in it."""
    top = [*hs_cmd, "top", "--show-bytes", str(dump)]
    cold: list[Measured] = []
    warm: list[Measured] = []
    for _ in range(runs):
        cache_dir = Path(tempfile.mkdtemp(prefix="heapscope-bench-cache-"))
        try:
            env = {**hs_env, "HEAPSCOPE_CACHE_DIR": str(cache_dir)}
            c = measure("heapscope top (cold)", top, env)
            cold.append(c)
            if c.ok:
                warm.append(measure("heapscope top (warm)", top, env))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
    return cold, warm


def compare(jp: Measured | None, cold: Measured, warm: Measured | None, target: float
            ) -> tuple[float | None, float | None, bool | None]:
    """Print and return jeprof/heapscope cold, cold/warm and whether the Totals agree
    (None where a run failed or was skipped)."""
    speedup = jp.wall_s / cold.wall_s if jp and jp.ok and cold.ok else None
    ratio_warm = cold.wall_s / warm.wall_s if cold.ok and warm and warm.ok else None
    print("jeprof/heapscope cold : "
          + (f"{speedup:.1f}x" if speedup is not None else "n/a")
          + f"   (target >= {target:.0f}x)")
    print("cold/warm             : "
          + (f"{ratio_warm:.2f}x" if ratio_warm is not None else "n/a")
          + f"   (target >= {TARGET_WARM_RATIO:.0f}x)")
    totals_equal: bool | None = None
    if jp and jp.ok and cold.ok:
        totals_equal = (jp.total_unit == cold.total_unit and jp.total is not None
                        and cold.total is not None and abs(jp.total - cold.total) <= 1.0)
        print(f"Total                 : jeprof {fmt_total(jp)}, heapscope {fmt_total(cold)}"
              f" -> {'equal' if totals_equal else 'DIFFERENT'}")
    return speedup, ratio_warm, totals_equal


GOLDEN_VIEWS = {
    "functions": ["--show-bytes", "-n", "0"],
    "lines": ["--show-bytes", "-n", "0", "--lines"],
    "alloc-cum-lines": ["--show-bytes", "-n", "0", "--alloc-space", "--cum", "--lines"],
}


def golden_check(hs_cmd: list[str], hs_env: dict[str, str], dump: Path, stacks: int,
                 update: bool) -> bool | None:
    """Compare whole ``top`` tables (every row: names, files, lines, bytes) with the ones
    kept in bench/golden/ for this generated program (every allocation is sampled, so they
    do not depend on the run). ``update`` writes them instead. None: no golden file."""
    same: bool | None = True
    for view, argv in GOLDEN_VIEWS.items():
        golden = BENCH_DIR / "golden" / f"top-{stacks}-{view}.txt.gz"
        out = subprocess.run([*hs_cmd, "top", *argv, str(dump)], capture_output=True,
                             text=True, env={**os.environ, **hs_env}, check=False).stdout
        if update:
            golden.parent.mkdir(exist_ok=True)
            golden.write_bytes(gzip.compress(out.encode(), mtime=0))
            print(f"wrote {golden.relative_to(REPO)} ({len(out.splitlines()):,} rows)")
            continue
        if not golden.exists():
            print(f"golden {view:<16}: no {golden.relative_to(REPO)} (--update-golden)")
            same = None if same else same
            continue
        want = gzip.decompress(golden.read_bytes()).decode()
        if out == want:
            print(f"golden {view:<16}: same {len(want.splitlines()):,} rows")
            continue
        same = False
        diff = difflib.unified_diff(want.splitlines(), out.splitlines(), "golden", "now",
                                    lineterm="", n=0)
        print(f"golden {view:<16}: DIFFERENT")
        for line in list(diff)[:12]:
            print(f"    {line}")
    return same


def main() -> int:
    ap = argparse.ArgumentParser(description="heapscope vs jeprof benchmark")
    ap.add_argument("--large", action="store_true", help=f"{LARGE_STACKS:,}-stack dump")
    ap.add_argument("--stacks", type=int, help="distinct stacks (overrides --large)")
    ap.add_argument("--repeat", type=int, default=1, help="passes over the stacks")
    ap.add_argument("--work", type=Path, default=BENCH_DIR / ".work")
    ap.add_argument("--fresh", action="store_true", help="regenerate, rebuild and rerun")
    ap.add_argument("--heapscope", help="heapscope command (default: heapscope on PATH)")
    ap.add_argument("--runs", type=int, default=5,
                    help="cold (and warm) runs of heapscope; medians are reported")
    ap.add_argument("--no-jeprof", action="store_true", help="do not time jeprof")
    ap.add_argument("--cached-jeprof", action="store_true",
                    help="reuse jeprof's time from an earlier run on this dump")
    ap.add_argument("--no-pictures", action="store_true", help="skip flamegraph and export")
    ap.add_argument("--update-golden", action="store_true",
                    help="write bench/golden/ from this heapscope's output")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = ap.parse_args()

    stacks = args.stacks or (LARGE_STACKS if args.large else MEDIUM_STACKS)
    large = stacks >= LARGE_STACKS
    args.work = args.work.resolve()  # the program runs in its run folder: paths absolute
    args.work.mkdir(parents=True, exist_ok=True)
    binary, dump = prepare(args.work, stacks, args.repeat, args.fresh)

    info = je.dump_info(dump)
    print()
    print(f"machine : {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"binary  : {binary}")
    print(f"dump    : {dump}")
    print(
        f"          {info.size / 1e6:,.1f} MB, {info.stacks:,} stacks, "
        f"{info.unique_addresses:,} unique addresses, {info.header}"
    )
    print()

    hs_cmd, hs_env = heapscope_command(args.heapscope)
    runs = max(1, args.runs)
    results: list[Measured] = []
    # jeprof first, in this run, so both are timed on the machine as it is now.
    jp = None if args.no_jeprof else jeprof_measurement(binary, dump, not args.cached_jeprof)
    if jp:
        results.append(jp)
    print(f"timing heapscope top ({runs} x cold, each followed by a warm run) ...", flush=True)
    cold_runs, warm_runs = time_heapscope(hs_cmd, hs_env, dump, runs)
    cold = median_of(cold_runs)
    cold.label = f"heapscope top (cold, median of {len(cold_runs)})"
    results.append(cold)
    warm = median_of(warm_runs) if warm_runs else None
    if warm:
        warm.label = f"heapscope top (warm, median of {len(warm_runs)})"
        results.append(warm)
    pictures: list[Measured] = []
    if not large and not args.no_pictures:
        # Pictures and exports of the same dump (cold symbol cache each), target < 5 s.
        out_dir = Path(tempfile.mkdtemp(prefix="heapscope-bench-out-"))
        try:
            for label, argv in (
                ("heapscope flamegraph", ["flamegraph", str(dump), "-o",
                                          str(out_dir / "f.html")]),
                ("heapscope export pprof", ["export", str(dump), "--format", "pprof", "-o",
                                            str(out_dir / "p.pb.gz")]),
            ):
                cache_dir = Path(tempfile.mkdtemp(prefix="heapscope-bench-cache-"))
                env = {**hs_env, "HEAPSCOPE_CACHE_DIR": str(cache_dir)}
                pictures.append(measure(label, [*hs_cmd, *argv], env, expect_total=False))
                shutil.rmtree(cache_dir, ignore_errors=True)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
        results.extend(pictures)

    print()
    print(f"{'command':<38} {'wall':>9} {'peak RSS':>10} {'Total':>16}  status")
    print("-" * 84)
    for m in results:
        status = "ok" if m.ok else "FAILED"
        if m.cached_from:
            status += f" (cached {m.cached_from})"
        print(f"{m.label:<38} {m.wall_s:>8.2f}s {fmt_rss(m):>10} {fmt_total(m):>16}  {status}")
    print(f"  cold runs: {', '.join(f'{m.wall_s:.2f}s' for m in cold_runs)}")
    if warm_runs:
        print(f"  warm runs: {', '.join(f'{m.wall_s:.2f}s' for m in warm_runs)}")
    for m in results:
        if not m.ok:
            print(f"\n{m.label} failed: {' '.join(m.cmd)}\n{m.error}")
    print()

    target = TARGET_LARGE_SPEEDUP if large else TARGET_SPEEDUP
    warm_rss = f", {fmt_rss(warm)} warm" if warm else ""
    print(f"heapscope peak RSS    : {fmt_rss(cold)} cold{warm_rss}")
    speedup, ratio_warm, totals_equal = compare(jp, cold, warm, target)
    checks: list[tuple[str, bool | None]] = [
        (f"jeprof/heapscope cold >= {target:.0f}x",
         None if speedup is None else speedup >= target)]
    if large:
        rss_ok = None if cold.rss_mb is None else cold.rss_mb <= TARGET_LARGE_RSS_MB
        checks.append((f"large: peak RSS <= {TARGET_LARGE_RSS_MB:.0f} MB", rss_ok))
    checks.append((f"warm >= {TARGET_WARM_RATIO:.0f}x faster than cold",
                   None if ratio_warm is None else ratio_warm >= TARGET_WARM_RATIO))
    checks.append(("heapscope Total == jeprof Total", totals_equal))
    golden = golden_check(hs_cmd, hs_env, dump, stacks, args.update_golden)
    if not args.update_golden:
        checks.append(("top tables == bench/golden", golden))
    for m in pictures:
        checks.append((f"{m.label} < 5 s (cold)", m.ok and m.wall_s < 5.0))
    print()
    for name, ok in checks:
        print(f"  [{verdict(ok):>4}] {name}")

    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "dump": str(dump),
                    "size": info.size,
                    "stacks": info.stacks,
                    "unique_addresses": info.unique_addresses,
                    "results": [asdict(m) for m in results],
                    "cold_runs": [m.wall_s for m in cold_runs],
                    "warm_runs": [m.wall_s for m in warm_runs],
                    "speedup_cold": speedup,
                    "cold_over_warm": ratio_warm,
                    "totals_equal": totals_equal,
                    "checks": dict(checks),
                },
                indent=1,
            )
        )
    if args.check and any(ok is not True for _, ok in checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
