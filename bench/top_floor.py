#!/usr/bin/env python3
"""How far ``heapscope top`` is from jeprof and from the floor, on dumps of several shapes.

    python bench/top_floor.py                 # all shapes, 5 runs each
    python bench/top_floor.py --shapes wide --runs 3 --cached-jeprof

The dumps (built and taken once, cached in bench/.work/):

- ``deep``: bench/run.py's generated program (3,000 functions in 20 translation units,
  depth ~12, 4 call sites each), 65,000 stacks, every allocation sampled (~21 MB).
- ``wide``: many distinct functions, shallow stacks: 20,000 functions in 40 translation units
  (:func:`generate_wide`), ``main -> a_k -> b_m -> malloc``, 40,000 stacks, every allocation
  sampled.
- ``redis``: a real server, Debian's redis-server (``build/redis``, as the e2e tests use it)
  under redis-benchmark (all its tests, twice), every allocation sampled, the final dump at
  SHUTDOWN.

Per dump it measures, in this one run: ``jeprof --text --show_bytes`` once
(``--cached-jeprof`` reuses the time kept in ``jeprof-top-floor.json`` beside the dump, keyed
by the dump's SHA-256) and checks heapscope's Total against jeprof's;
``heapscope top --show-bytes`` cold (a fresh empty HEAPSCOPE_CACHE_DIR) and warm (the same
folder again), ``--runs`` times, medians; and the floor:

1. reading the bytes: ``cat DUMP > /dev/null`` and Python's ``read()`` of the file, both
   from the page cache (median; the smaller one counts);
2. llvm-symbolizer's own time on the addresses heapscope asks it for: the (file, addresses)
   requests of a cold run are recorded, then each file's addresses go to one llvm-symbolizer
   process on stdin with heapscope's flags (:data:`heapscope.symbols.llvm.FLAGS`, ``--obj``,
   answers to a file), one file after another; only those processes are timed. The same
   processes run all at once are shown too (heapscope runs its lookups concurrently).

floor = read + symbolizer (one after another). Targets: jeprof/cold >= 30x and
cold/floor <= 3x on every dump (``--check`` exits 1 if one is missed).

Then ``--runs`` more cold runs per dump in a child process (bench/top_stages.py) with
wrappers around heapscope's passes (no profiler, so no overhead to speak of) say where the
cold time goes: start-up (the interpreter, the first imports, the program's llvm-symbolizer
started ahead, exit), the subcommand's imports, the argument parser, reading, unsampling,
symbolizing (and how long its llvm-symbolizer runs took, summed over runs that overlap),
pruning, folding, storing the prepared profile, aggregation, rendering, debug-info hints.

The machine's load is printed before and after: numbers taken beside other work are noisy.
This is a bench, not a test: nothing in the test suite runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import jemalloc as je  # noqa: E402  (tests/e2e/jemalloc.py)
import run as deep_bench  # noqa: E402  (bench/run.py: the deep generated dump)
from top_stages import STAGES  # noqa: E402

TARGET_SPEEDUP = 30.0  # jeprof / heapscope cold
TARGET_FLOOR = 3.0  # heapscope cold / floor
SHAPES = ("deep", "wide", "redis")
ALL_SAMPLED = "lg_prof_sample:0,prof_accum:true"

# ------------------------------------------------------------------------------ dumps


@dataclass
class Dump:
    """A bench dump and the program jeprof is given for it."""

    shape: str
    path: Path
    binary: Path
    env: dict[str, str] = field(default_factory=dict)  # for jeprof (library path)


WIDE = {"a": 10_000, "b": 10_000, "tus": 40, "seed": 2}
WIDE_STACKS = 40_000  # a functions x 2 call sites x 2 malloc sites
CFLAGS = ("-O1", "-g", "-fno-optimize-sibling-calls", "-fno-inline")


def generate_wide(outdir: Path, a: int, b: int, tus: int, seed: int) -> list[Path]:
    """C sources of a program with ``a + b`` functions and stacks three frames deep.

    ``main`` calls ``a_k`` through a table; ``a_k`` has two call sites, each into a
    different ``b_m`` (chosen with ``seed``); ``b_m`` has two ``malloc`` call sites. Run as
    ``./prog N``, iteration ``i`` calls ``a_(i mod a)`` with ``x = i / a``: bit 0 picks the
    call site in ``a_k``, bit 1 the one in ``b_m``, so the first ``4 * a`` iterations walk
    pairwise different return-address stacks. One block in three leaks.
    """
    rng = random.Random(seed)
    outdir.mkdir(parents=True, exist_ok=True)
    decl = ["#include <stdlib.h>", "extern void *volatile sink;"]
    decl += [f"void a{k}(unsigned x);" for k in range(a)]
    decl += [f"void b{m}(unsigned x);" for m in range(b)]
    (outdir / "wide.h").write_text("\n".join(decl) + "\n")
    bodies: list[list[str]] = [['#include "wide.h"'] for _ in range(tus)]
    for k in range(a):
        m0, m1 = rng.sample(range(b), 2)
        bodies[k % tus].append(
            f"void a{k}(unsigned x) {{ if (x & 1u) b{m0}(x >> 1); else b{m1}(x >> 1); }}")
    for m in range(b):
        bodies[(m * 7 + 3) % tus].append(
            f"void b{m}(unsigned x) {{ void *p; if (x & 1u) p = malloc(16 + (x * 40u + {m}u)"
            f" % 1008u); else p = malloc(24 + ({m}u * 13u) % 1000u); sink = p;"
            f" if ((x + {m}u) % 3u) free(p); }}")
    sources = []
    for t, body in enumerate(bodies):
        src = outdir / f"tu{t:02d}.c"
        src.write_text("\n".join(body) + "\n")
        sources.append(src)
    table = ",\n".join(f"  a{k}" for k in range(a))
    main = outdir / "main.c"
    main.write_text(
        '#include "wide.h"\nvoid *volatile sink;\n'
        f"static void (*const A[{a}])(unsigned) = {{\n{table}\n}};\n"
        "int main(int argc, char **argv) {\n"
        f"  unsigned n = argc > 1 ? (unsigned)atoi(argv[1]) : {4 * a}u;\n"
        f"  for (unsigned i = 0; i < n; i++) A[i % {a}u](i / {a}u);\n"
        "  return 0;\n}\n")
    return [*sources, main]


def _compile(sources: list[Path], binary: Path, gcc: str) -> None:
    """Compile each source on its own (two at a time: the machine has two cores), link."""
    objs = [s.with_suffix(".o") for s in sources]
    pending = list(zip(sources, objs, strict=True))
    running: list[subprocess.Popen[bytes]] = []
    while pending or running:
        while pending and len(running) < (os.cpu_count() or 2):
            src, obj = pending.pop(0)
            running.append(subprocess.Popen([gcc, *CFLAGS, "-c", str(src), "-o", str(obj)]))
        proc = running.pop(0)
        if proc.wait() != 0:
            sys.exit(f"compiling failed: {proc.args!r}")
    subprocess.run([gcc, *CFLAGS, *map(str, objs), "-o", str(binary)], check=True)


def _lib() -> Path:
    """The libjemalloc to preload, one built with profiling."""
    lib = je.find_libjemalloc()
    if lib is None or not je.jemalloc_has_profiling(lib):
        sys.exit("libjemalloc2 with profiling not installed: apt-get install libjemalloc2")
    return Path(lib)


def wide_dump(work: Path) -> Dump:
    """Build the wide program (cached by its parameters and this file) and take its dump."""
    gcc = je.find_tool("gcc")
    if gcc is None:
        sys.exit("gcc not found: apt-get install gcc")
    # Keyed by the generator's source, not this whole file: other edits rebuild nothing.
    import inspect

    key_src = json.dumps([WIDE, CFLAGS, WIDE_STACKS, inspect.getsource(generate_wide)])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:12]
    gdir = work / f"wide-{key}"
    binary = gdir / "wide_prog"
    if not binary.exists():
        print(f"generating and building {gdir} ...", flush=True)
        t0 = time.perf_counter()
        _compile(generate_wide(gdir / "src", **WIDE), binary, str(gcc))
        print(f"  built in {time.perf_counter() - t0:.1f} s", flush=True)
    run_dir = gdir / f"run-{WIDE_STACKS}"
    dumps = sorted(run_dir.glob("jeprof.*.f.heap")) if run_dir.exists() else []
    if len(dumps) != 1:
        shutil.rmtree(run_dir, ignore_errors=True)
        got = je.run_profiled([binary.resolve(), str(WIDE_STACKS)], run_dir, ALL_SAMPLED,
                              lib=_lib(), timeout=1800)
        dumps = [d for d in got if d.name.endswith(".f.heap")]
    return Dump("wide", dumps[0].resolve(), binary.resolve())


def deep_dump(work: Path) -> Dump:
    """bench/run.py's ~21 MB, 65,000-stack dump (built and taken by run.py's code)."""
    binary, dump = deep_bench.prepare(work, deep_bench.MEDIUM_STACKS, 1, False)
    return Dump("deep", dump, binary)



def redis_dump(work: Path) -> Dump | None:
    """Debian's redis-server under redis-benchmark, every allocation sampled (cached)."""
    root = REPO / "build" / "redis"
    server = root / "usr" / "bin" / "redis-server"
    bench = root / "usr" / "bin" / "redis-benchmark"
    if not server.exists() or not bench.exists():
        print("redis: build/redis not found (apt-get download redis-tools liblzf1; "
              "dpkg-deb -x each into build/redis): skipped")
        return None
    libs = root / "usr" / "lib" / "x86_64-linux-gnu"
    env = {"LD_LIBRARY_PATH": str(libs)} if libs.is_dir() else {}
    run_dir = work / "redis-dump"
    dumps = sorted(run_dir.glob("jeprof.*.f.heap")) if run_dir.exists() else []
    if len(dumps) != 1:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        with socket.socket() as s:  # a free port
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        full = {**os.environ, **env, "LD_PRELOAD": str(_lib()),
                "MALLOC_CONF": je.malloc_conf(run_dir, ALL_SAMPLED)}
        print("running redis-server under redis-benchmark ...", flush=True)
        proc = subprocess.Popen(
            [str(server), "--port", str(port), "--save", "", "--appendonly", "no"],
            cwd=run_dir, env=full, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            bench_env = {**os.environ, **env}
            for _ in range(100):
                if subprocess.run([str(root / "usr" / "bin" / "redis-cli"), "-p", str(port),
                                   "ping"], env=bench_env, capture_output=True,
                                  check=False).stdout.strip() == b"PONG":
                    break
                time.sleep(0.1)
            # redis-benchmark's every test, small values one by one, then larger ones
            # pipelined (other buffer and encoding paths: more distinct stacks).
            for pipeline, size in (("1", "3"), ("16", "600")):
                subprocess.run([str(bench), "-p", str(port), "-q", "-n", "20000", "-r",
                                "100000", "-P", pipeline, "-d", size], env=bench_env,
                               stdout=subprocess.DEVNULL, check=True, timeout=600)
            subprocess.run([str(root / "usr" / "bin" / "redis-cli"), "-p", str(port),
                            "shutdown", "nosave"], env=bench_env, capture_output=True,
                           check=False)
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        dumps = sorted(run_dir.glob("jeprof.*.f.heap"))
        if len(dumps) != 1:
            sys.exit(f"redis: expected one final dump in {run_dir}, found {dumps}")
    return Dump("redis", dumps[0].resolve(), server.resolve(), env)


# ------------------------------------------------------------------------------ timing


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


Total = tuple[float, str] | None  # a report's "Total: N B" line


def jeprof_seconds(d: Dump, cached: bool) -> tuple[float | None, str, Total]:
    """jeprof --text's wall time on the dump, where it comes from ("now" or a date) and
    the Total it printed."""
    jeprof = je.find_jeprof()
    if jeprof is None:
        return None, "jeprof not found (apt-get install libjemalloc-dev)", None
    cache = d.path.parent / "jeprof-top-floor.json"  # run.py keeps its own jeprof.json
    digest = _sha256(d.path)
    if cached and cache.exists():
        kept = json.loads(cache.read_text())
        if kept.get("sha256") == digest and "seconds" in kept and kept.get("total"):
            total = kept["total"]
            return (float(kept["seconds"]), f"cached {kept.get('when', '?')}",
                    (float(total[0]), str(total[1])))
    print(f"  timing jeprof --text on {d.shape} ...", flush=True)
    t0 = time.perf_counter()
    p = subprocess.run([str(jeprof), "--text", "--show_bytes", str(d.binary), str(d.path)],
                       capture_output=True, text=True, env={**os.environ, **d.env},
                       check=False)
    wall = time.perf_counter() - t0
    total = je.parse_total(p.stdout)
    if p.returncode != 0 or total is None:
        return None, f"jeprof failed: {p.stderr.strip()[-300:]}", None
    cache.write_text(json.dumps({"sha256": digest, "seconds": wall, "total": list(total),
                                 "when": time.strftime("%Y-%m-%d %H:%M:%S")}))
    return wall, "now", (float(total[0]), str(total[1]))


def heapscope_total(d: Dump) -> Total:
    """The Total line of ``heapscope top --show-bytes`` (not timed): the same work as
    jeprof's only if the Totals agree."""
    p = subprocess.run([*heapscope_cmd(), "top", "--show-bytes", str(d.path)],
                       capture_output=True, text=True, check=False)
    got = je.parse_total(p.stdout) if p.returncode == 0 else None
    return None if got is None else (float(got[0]), str(got[1]))


def _timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                       check=False)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr.decode(errors='replace')[-2000:]}")
    return wall


def heapscope_cmd() -> list[str]:
    """How heapscope is started: the project's entry point when installed, as users do."""
    exe = shutil.which("heapscope")
    return [exe] if exe else [sys.executable, "-m", "heapscope.cli.main"]


def time_top(d: Dump, runs: int) -> tuple[list[float], list[float]]:
    """Cold runs of ``heapscope top`` (fresh cache folder each), each followed by a warm."""
    cmd = [*heapscope_cmd(), "top", "--show-bytes", str(d.path)]
    cold, warm = [], []
    for _ in range(runs):
        cache = Path(tempfile.mkdtemp(prefix="heapscope-floor-cache-"))
        try:
            env = {**os.environ, "HEAPSCOPE_CACHE_DIR": str(cache)}
            cold.append(_timed(cmd, env))
            warm.append(_timed(cmd, env))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return cold, warm


def read_floor(path: Path, runs: int) -> tuple[float, float]:
    """Medians of ``cat FILE > /dev/null`` and of Python's read() of the file (page cache)."""
    path.read_bytes()  # into the page cache
    cat, py = [], []
    for _ in range(max(runs, 5)):
        t0 = time.perf_counter()
        with open(os.devnull, "wb") as null:
            subprocess.run(["cat", str(path)], stdout=null, check=True)
        cat.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with path.open("rb") as f:
            f.read()
        py.append(time.perf_counter() - t0)
    return statistics.median(cat), statistics.median(py)


def symbolizer_floor(requests: dict[str, list[int]], runs: int) -> tuple[float, float]:
    """llvm-symbolizer's own time on the recorded addresses: medians of the per-file
    processes run one after another (summed) and all at once (wall)."""
    from heapscope.symbols.llvm import FLAGS, find_symbolizer

    exe = find_symbolizer()
    inputs = {path: "".join(f"{v:#x}\n" for v in sorted(vs)).encode()
              for path, vs in requests.items()}

    def start(path: str) -> tuple[subprocess.Popen[bytes], Any]:
        out = tempfile.TemporaryFile()  # noqa: SIM115  (closed by the caller)
        proc = subprocess.Popen([exe, f"--obj={path}", *FLAGS], stdin=subprocess.PIPE,
                                stdout=out, stderr=subprocess.DEVNULL)
        return proc, out

    failed: list[str] = []  # also from the feeder threads below

    def finish(proc: subprocess.Popen[bytes], out: Any, data: bytes) -> None:
        proc.communicate(data)
        out.close()
        if proc.returncode != 0:
            failed.append(f"llvm-symbolizer failed: {proc.args!r}")

    serial, together = [], []
    for _ in range(runs):
        total = 0.0
        for path, data in inputs.items():
            t0 = time.perf_counter()
            proc, out = start(path)
            finish(proc, out, data)
            total += time.perf_counter() - t0
        serial.append(total)
        t0 = time.perf_counter()
        # A thread per process feeds its stdin: a pipe holds 64 KiB, and a process waiting
        # for its input behind another's would not run at the same time.
        feeders = [threading.Thread(target=finish, args=(*start(path), data))
                   for path, data in inputs.items()]
        for t in feeders:
            t.start()
        for t in feeders:
            t.join()
        together.append(time.perf_counter() - t0)
        if failed:
            sys.exit(failed[0])
    return statistics.median(serial), statistics.median(together)


# ------------------------------------------------------------------------------ stages

def stages(d: Dump, runs: int) -> tuple[dict[str, float], dict[str, list[int]]]:
    """Cold runs in child processes with their passes timed (bench/top_stages.py): median
    seconds per stage (STAGES, plus "total", the child's wall time) and the llvm-symbolizer
    requests (file -> addresses) of a cold run."""
    got: list[dict[str, float]] = []
    requests: dict[str, list[int]] = {}
    for _ in range(runs):
        cache = Path(tempfile.mkdtemp(prefix="heapscope-floor-cache-"))
        out = cache / "stages.json"
        try:
            env = {**os.environ, "HEAPSCOPE_CACHE_DIR": str(cache / "c")}
            wall = _timed([sys.executable, str(BENCH_DIR / "top_stages.py"), str(d.path),
                           str(out)], env)
            child = json.loads(out.read_text())
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        requests = child["requests"]
        spent: dict[str, float] = child["spent"]
        s = {k: spent.get(k, 0.0) for k, _ in STAGES}
        # The program's symbolizer is started ahead inside main(), before the dispatch.
        s["start"] = wall - child["main"] + spent.get("ahead", 0.0)
        passes = sum(s[k] for k, _ in STAGES if k not in ("start", "llvm", "other"))
        s["other"] = child["main"] - spent.get("ahead", 0.0) - passes
        s["total"] = wall
        got.append(s)
    return {k: statistics.median(g[k] for g in got) for k in got[0]}, requests


# ------------------------------------------------------------------------------ main


@dataclass
class Row:
    """One dump's measurements (seconds)."""

    shape: str
    size: int
    stacks: int
    addresses: int
    sent: int
    modules: int
    jeprof: float | None
    jeprof_from: str
    jeprof_total: Total
    heapscope_total: Total
    cold: float
    warm: float
    cold_runs: list[float]
    warm_runs: list[float]
    cat: float
    pyread: float
    sym_serial: float
    sym_together: float
    stages: dict[str, float]

    @property
    def floor(self) -> float:
        return min(self.cat, self.pyread) + self.sym_serial

    @property
    def speedup(self) -> float | None:
        return None if self.jeprof is None else self.jeprof / self.cold


def measure_dump(d: Dump, runs: int, cached_jeprof: bool) -> Row:
    info = je.dump_info(d.path)
    print(f"{d.shape}: {d.path} ({info.size / 1e6:.1f} MB, {info.stacks:,} stacks)",
          flush=True)
    jp, jp_from, jp_total = jeprof_seconds(d, cached_jeprof)
    print(f"  heapscope top: {runs} x cold + warm ...", flush=True)
    cold, warm = time_top(d, runs)
    print(f"  stages and llvm-symbolizer requests ({runs} instrumented cold runs) ...",
          flush=True)
    st, requests = stages(d, runs)
    print("  floors ...", flush=True)
    cat, pyread = read_floor(d.path, runs)
    serial, together = symbolizer_floor(requests, runs) if requests else (0.0, 0.0)
    return Row(d.shape, info.size, info.stacks, info.unique_addresses,
               sum(len(v) for v in requests.values()), len(requests), jp, jp_from,
               jp_total, heapscope_total(d),
               statistics.median(cold), statistics.median(warm), cold, warm, cat, pyread,
               serial, together, st)


def _total(t: Total) -> str:
    return "-" if t is None else f"{t[0]:,.0f} {t[1]}"


def _f(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def report(rows: list[Row]) -> list[tuple[str, bool | None]]:
    """Print the tables; return the target checks."""
    print()
    head = (f"{'dump':<6} {'MB':>5} {'stacks':>7} {'addrs':>6} {'jeprof':>7} {'cold':>6} "
            f"{'warm':>6} {'read':>6} {'llvm':>6} {'floor':>6} {'jp/cold':>8} "
            f"{'cold/floor':>10}  targets")
    print(head)
    print("-" * len(head))
    checks: list[tuple[str, bool | None]] = []
    for r in rows:
        sp = r.speedup
        ratio = r.cold / r.floor
        ok_sp = None if sp is None else sp >= TARGET_SPEEDUP
        ok_fl = ratio <= TARGET_FLOOR
        same = (None if r.jeprof_total is None or r.heapscope_total is None
                else r.jeprof_total[1] == r.heapscope_total[1]
                and abs(r.jeprof_total[0] - r.heapscope_total[0]) <= 1.0)
        checks += [(f"{r.shape}: jeprof/cold >= {TARGET_SPEEDUP:.0f}x", ok_sp),
                   (f"{r.shape}: cold <= {TARGET_FLOOR:.0f}x floor", ok_fl),
                   (f"{r.shape}: heapscope's Total == jeprof's", same)]
        mark = " ".join(("n/a" if ok is None else "ok" if ok else "MISS")
                        for ok in (ok_sp, ok_fl))
        print(f"{r.shape:<6} {r.size / 1e6:>5.1f} {r.stacks:>7,} {r.addresses:>6,} "
              f"{_f(r.jeprof, '.2f'):>7} {r.cold:>6.2f} {r.warm:>6.2f} "
              f"{min(r.cat, r.pyread):>6.3f} {r.sym_serial:>6.3f} {r.floor:>6.3f} "
              f"{_f(sp, '.1f', 'x'):>8} {ratio:>9.1f}x  {mark}")
    print()
    print("addrs: distinct addresses in the dump; llvm: llvm-symbolizer on what heapscope asks")
    print("it (one process per file, one after another); floor = read + llvm; medians.")
    for r in rows:
        print(f"  {r.shape}: jeprof {r.jeprof_from}; cold runs "
              + ", ".join(f"{x:.2f}" for x in r.cold_runs) + "; warm runs "
              + ", ".join(f"{x:.2f}" for x in r.warm_runs)
              + f"; read: cat {r.cat * 1e3:.1f} ms, Python {r.pyread * 1e3:.1f} ms; "
              f"llvm-symbolizer on {r.sent:,} addresses of {r.modules} files: "
              f"{r.sym_serial:.3f} s one after another, {r.sym_together:.3f} s all at once"
              f"; Total: jeprof {_total(r.jeprof_total)}, heapscope {_total(r.heapscope_total)}")
    print()
    print("Where a cold run's time goes (instrumented cold runs, median seconds per stage;")
    print("the medians need not add up to the median total):")
    names = [r.shape for r in rows]
    print(f"  {'stage':<62}" + "".join(f"{n:>8}" for n in names))
    for key, label in STAGES:
        print(f"  {label:<62}" + "".join(f"{r.stages[key]:>8.3f}" for r in rows))
    print(f"  {'total (wall of the instrumented run)':<62}"
          + "".join(f"{r.stages['total']:>8.3f}" for r in rows))
    return checks


def python_start(runs: int) -> tuple[float, float]:
    """Medians of ``python -c pass`` and of importing heapscope's CLI: what any run of a
    Python command costs before it reads a byte (not part of the floor; beside it)."""
    bare = [_timed([sys.executable, "-c", "pass"], dict(os.environ)) for _ in range(runs)]
    cli = [_timed([sys.executable, "-c", "import heapscope.cli.main"], dict(os.environ))
           for _ in range(runs)]
    return statistics.median(bare), statistics.median(cli)


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description="heapscope top vs jeprof and the floor")
    ap.add_argument("--shapes", default=",".join(SHAPES),
                    help=f"comma-separated, of {', '.join(SHAPES)}")
    ap.add_argument("--runs", type=int, default=5, help="runs per measurement (medians)")
    ap.add_argument("--work", type=Path, default=BENCH_DIR / ".work")
    ap.add_argument("--cached-jeprof", action="store_true",
                    help="reuse jeprof's time from an earlier run on the same dump")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = ap.parse_args()
    shapes = [s for s in args.shapes.split(",") if s]
    unknown = set(shapes) - set(SHAPES)
    if unknown:
        ap.error(f"unknown shapes: {', '.join(sorted(unknown))}")
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    makers = {"deep": deep_dump, "wide": wide_dump, "redis": redis_dump}
    dumps = [d for s in shapes if (d := makers[s](work)) is not None]
    print(f"\nmachine: {os.cpu_count()} CPUs, load average {loadavg()} (before); "
          f"heapscope: {' '.join(heapscope_cmd())}\n")
    rows = [measure_dump(d, max(1, args.runs), args.cached_jeprof) for d in dumps]
    checks = report(rows)
    bare, cli = python_start(max(1, args.runs))
    print(f"\nfor scale: python -c pass {bare:.3f} s; python -c 'import heapscope.cli.main' "
          f"{cli:.3f} s (medians)")
    print(f"\nload average after: {loadavg()}")
    for name, ok in checks:
        print(f"  [{'n/a' if ok is None else 'PASS' if ok else 'MISS':>4}] {name}")
    if args.json:
        args.json.write_text(json.dumps(
            {"rows": [{**r.__dict__, "floor": r.floor, "speedup": r.speedup} for r in rows],
             "python_start": bare, "cli_import": cli, "checks": dict(checks)}, indent=1))
    if args.check and any(ok is not True for _, ok in checks):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
