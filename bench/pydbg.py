#!/usr/bin/env python3
"""Benchmark symbolization against a real DWARF-heavy program: Debian's debug CPython.

    python bench/pydbg.py              # 3 runs of each command, medians
    python bench/pydbg.py --runs 5

What it measures: how long ``heapscope top --show-bytes DUMP`` takes on a heap dump of
``/usr/bin/python3.11d`` (package python3.11-dbg: a ~24 MB executable with full DWARF, plus
libc, libm, libz, libexpat, libjemalloc, … and CPython's extension modules), compared with
``jeprof --text --show_bytes /usr/bin/python3.11d DUMP``:

* cold: ``HEAPSCOPE_CACHE_DIR`` is a fresh empty directory for every run, so heapscope
  reads ELF files and symbol tables and runs llvm-symbolizer for every module;
* warm: the same directory again right after a cold run, so every frame comes from the
  symbol cache.

Unlike bench/run.py's generated program (one big module with simple DWARF), this dump has
dozens of modules of real-world DWARF (inlining, many compilation units), so its cold time is
dominated by per-module work: ELF headers, build-ids, symbol tables, one llvm-symbolizer
per module. The floor is Python start-up plus the slowest single llvm-symbolizer run.

The dump comes from running a stdlib-heavy script (json, re, decimal, collections, zlib,
xml.etree, …; a few seconds) under ``LD_PRELOAD=libjemalloc.so.2`` with
``MALLOC_CONF=prof:true,prof_final:true,lg_prof_sample:4,...``; it is cached in
``bench/.work/pydbg-<key>/`` (the key hashes the script, the interpreter and the config) and
reused by later runs. ``--fresh`` makes a new one.

Reported: a table of medians (wall, peak RSS, ``Total:``), jeprof/heapscope cold (target
>= 10x), cold/warm (target >= 2x) and whether heapscope's ``Total: N B`` equals jeprof's.
``--check`` exits 1 when a target is missed. Timing, RSS and Total parsing come from
bench/run.py.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "e2e"))

import jemalloc as je  # noqa: E402  (tests/e2e/jemalloc.py: run_profiled(), dump_info())
import run as bench  # noqa: E402  (bench/run.py: measure(), heapscope_command(), fmt_*)
from run import Measured  # noqa: E402

PYTHON_DBG = Path("/usr/bin/python3.11d")
CONF = "lg_prof_sample:4"  # a sample every ~16 bytes: nearly every allocation has a stack
ENV = {"PYTHONMALLOC": "malloc"}
TARGET_SPEEDUP = 10.0  # jeprof / heapscope cold
TARGET_WARM_RATIO = 2.0  # heapscope cold / warm

# The profiled workload: a bit of everything in the standard library that allocates, so the
# stacks run through the interpreter loop, the object allocators, the parsers and the C
# extension modules (_json, _decimal, zlib, pyexpat, _sre, _collections, ...).
WORKLOAD = r'''
import collections, decimal, io, json, random, re, zlib
import xml.etree.ElementTree as ET

random.seed(1)
keep = []
words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
for round_ in range(3):
    docs = [{"id": i, "name": random.choice(words) * (i % 7 + 1),
             "tags": [random.choice(words) for _ in range(i % 5)],
             "score": random.random()} for i in range(6000)]
    text = json.dumps(docs)
    back = json.loads(text)
    keep.append(back[: 2000 * (round_ + 1)])
    pat = re.compile(r"(\w+)a(\w*)")
    found = collections.Counter(m.group(1) for m in pat.finditer(text))
    keep.append(found.most_common(20))
    decimal.getcontext().prec = 50
    total = decimal.Decimal(0)
    for d in docs:
        total += decimal.Decimal(d["score"]).sqrt() / decimal.Decimal(d["id"] + 1)
    keep.append(total)
    packed = zlib.compress(text.encode(), 6)
    keep.append(zlib.decompress(packed)[:1000])
    root = ET.Element("root")
    for d in docs[:3000]:
        e = ET.SubElement(root, "doc", id=str(d["id"]))
        e.text = d["name"]
    xml = ET.tostring(root)
    keep.append(ET.fromstring(xml))
    dq = collections.deque(maxlen=5000)
    od = collections.OrderedDict()
    for i in range(20000):
        dq.append((i, str(i)))
        od[i % 3000] = [i] * (i % 4)
    keep.append((dq, od, packed))
    buf = io.StringIO()
    for d in docs:
        buf.write(f"{d['id']:>8} {d['name']:<40} {d['score']:.6f}\n")
    keep.append(buf.getvalue()[:500])
# Python frees nearly everything at exit, before jemalloc writes the final dump; one extra
# reference on what was kept leaks it, so the dump has the stacks that allocated it.
import ctypes
ctypes.pythonapi.Py_IncRef(ctypes.py_object(keep))
print(len(keep))
'''


def ensure_python_dbg() -> None:
    """Exit with a hint when the debug interpreter is not installed."""
    if not os.access(PYTHON_DBG, os.X_OK):
        sys.exit(f"{PYTHON_DBG} not found: apt-get install -y python3.11-dbg")


def prepare(work: Path, fresh: bool) -> Path:
    """Run the workload under jemalloc profiling once (cached); return its final dump."""
    ensure_python_dbg()
    lib = je.find_libjemalloc()
    if lib is None or not je.jemalloc_has_profiling(lib):
        sys.exit("libjemalloc2 with profiling not installed: apt-get install libjemalloc2")
    st = PYTHON_DBG.stat()
    key_src = json.dumps([WORKLOAD, CONF, ENV, str(lib), st.st_size, st.st_mtime_ns])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:12]
    run_dir = work / f"pydbg-{key}"
    if fresh and run_dir.exists():
        shutil.rmtree(run_dir)
    dumps = sorted(run_dir.glob("jeprof.*.f.heap")) if run_dir.exists() else []
    if len(dumps) != 1:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        script = run_dir / "workload.py"
        script.write_text(WORKLOAD)
        print(f"running {script.name} under {PYTHON_DBG} with jemalloc profiling ...",
              flush=True)
        t0 = time.perf_counter()
        # PYTHONMALLOC=malloc: small objects too go through malloc (not pymalloc's mmap'ed
        # arenas), so jemalloc sees, and the dump holds, the interpreter's own stacks.
        dumps = je.run_profiled([PYTHON_DBG, script], run_dir, CONF, ENV, lib=lib,
                                timeout=1800)
        dumps = [d for d in dumps if d.name.endswith(".f.heap")]
        if not dumps:
            sys.exit(f"{PYTHON_DBG} left no final dump in {run_dir}")
        print(f"  ran in {time.perf_counter() - t0:.1f} s", flush=True)
    return dumps[0].resolve()


def main() -> int:
    """Prepare the dump, time jeprof and heapscope, print the table and the verdicts."""
    ap = argparse.ArgumentParser(description="heapscope vs jeprof on a python3.11d dump")
    ap.add_argument("--runs", type=int, default=3, help="runs of each command (median)")
    ap.add_argument("--work", type=Path, default=BENCH_DIR / ".work")
    ap.add_argument("--fresh", action="store_true", help="profile the workload again")
    ap.add_argument("--heapscope", help="heapscope command (default: heapscope on PATH)")
    ap.add_argument("--no-jeprof", action="store_true", help="do not time jeprof")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = ap.parse_args()
    runs = max(1, args.runs)

    args.work.mkdir(parents=True, exist_ok=True)
    dump = prepare(args.work, args.fresh)
    info = je.dump_info(dump)
    print()
    print(f"machine : {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"binary  : {PYTHON_DBG} ({PYTHON_DBG.stat().st_size / 1e6:,.1f} MB)")
    print(f"dump    : {dump}")
    print(f"          {info.size / 1e6:,.1f} MB, {info.stacks:,} stacks, "
          f"{info.unique_addresses:,} unique addresses")
    print()

    results: list[Measured] = []
    jp: Measured | None = None
    jeprof = None if args.no_jeprof else je.find_jeprof()
    if jeprof is not None:
        print(f"timing jeprof --text ({runs} runs) ...", flush=True)
        cmd = [str(jeprof), "--text", "--show_bytes", str(PYTHON_DBG), str(dump)]
        jp = bench.median_of([bench.measure("jeprof --text", cmd) for _ in range(runs)])
        results.append(jp)
    elif not args.no_jeprof:
        print("jeprof not found (apt-get install libjemalloc-dev): skipping jeprof")

    hs_cmd, hs_env = bench.heapscope_command(args.heapscope)
    print(f"timing heapscope top ({runs} x cold, then warm) ...", flush=True)
    cold_runs, warm_runs = bench.time_heapscope(hs_cmd, hs_env, dump, runs)
    cold = bench.median_of(cold_runs)
    results.append(cold)
    warm = bench.median_of(warm_runs) if warm_runs else None
    if warm is not None:
        results.append(warm)

    print()
    print(f"{'command (median of ' + str(runs) + ')':<26} {'wall':>9} {'peak RSS':>12} "
          f"{'Total':>18}  status")
    print("-" * 78)
    for m in results:
        status = "ok" if m.ok else "FAILED"
        print(f"{m.label:<26} {m.wall_s:>8.2f}s {bench.fmt_rss(m):>12} "
              f"{bench.fmt_total(m):>18}  {status}")
    for m in results:
        if not m.ok:
            print(f"\n{m.label} failed: {' '.join(m.cmd)}\n{m.error}")
    print(f"  heapscope cold runs: {', '.join(f'{m.wall_s:.2f}s' for m in cold_runs)}")
    if warm_runs:
        print(f"  heapscope warm runs: {', '.join(f'{m.wall_s:.2f}s' for m in warm_runs)}")
    print()

    speedup, ratio_warm, totals_equal = bench.compare(jp, cold, warm, TARGET_SPEEDUP)
    checks: list[tuple[str, bool | None]] = [
        (f"jeprof/heapscope cold >= {TARGET_SPEEDUP:.0f}x",
         None if speedup is None else speedup >= TARGET_SPEEDUP),
        (f"cold >= {TARGET_WARM_RATIO:.0f}x warm",
         None if ratio_warm is None else ratio_warm >= TARGET_WARM_RATIO),
        ("heapscope Total == jeprof Total", totals_equal),
    ]
    print()
    for name, ok in checks:
        print(f"  [{bench.verdict(ok):>4}] {name}")
    if args.check and any(ok is not True for _, ok in checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
