#!/usr/bin/env python3
"""How fast does ``heapscope serve`` show a 20,000-stack dump?

    python bench/serve_speed.py                  # 20,000 stacks, 3 dumps
    python bench/serve_speed.py --stacks 50000

Target: the first view of a 20,000-stack dump (its top table) in under 1 s warm, i.e. with
the prepared profile already in the cache folder, as on any look after the first; zooming in
the flame graph happens in the browser (no request at all).

Steps:
1. Build bench/many_stacks.c with the generated call tree of bench/leaks_speed.py (cached in
   bench/.work/) and record ``heapscope run --no-symbolize -- many_stacks STACKS DUMPS``:
   each dump holds about STACKS stacks, raw (symbolized at the first look).
2. In this process, through Starlette's TestClient (the ASGI app without sockets), time the
   endpoints the page calls (top, flame graph, call graph, callers, diff, hide, another
   --alloc-fn, a merged set of every dump, the leak report): with an empty cache folder
   (cold: read, symbolize, fold), with a new server on the same cache folder (warm: the
   prepared profile read back), and again
   on the same server (hot: kept in memory). Each is the median of ``--repeat`` runs, each
   on a new server (and, cold, a new empty cache folder).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "src"))

import jemalloc as je  # noqa: E402  (tests/e2e/jemalloc.py)
from leaks_speed import build, record, session_dumps  # noqa: E402
from run import heapscope_command  # noqa: E402


def client(session: Path, cache: str) -> Any:
    """A TestClient on a new viewer of ``session`` using the cache folder ``cache``."""
    os.environ["HEAPSCOPE_CACHE_DIR"] = cache
    from starlette.testclient import TestClient

    from heapscope.analysis.fold import FramePolicy
    from heapscope.inputs import recorded_facts
    from heapscope.serve.app import create_app
    from heapscope.serve.catalog import Catalog
    from heapscope.serve.views import Settings, Workbench
    from heapscope.symbols import SymbolOptions

    paths = [str(session)]
    options = SymbolOptions(cache_dir=cache, recorded=recorded_facts(paths))
    bench = Workbench(Catalog(paths), Settings(options, FramePolicy.from_env()))
    c = TestClient(create_app(bench, "t"))
    c.headers["X-Heapscope-Token"] = "t"
    return c


def timed(c: Any, url: str) -> float:
    """Seconds ``GET url`` took on the viewer ``c``."""
    t0 = time.perf_counter()
    r = c.get(url)
    took = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"{url}: {r.status_code} {r.text[:300]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stacks", type=int, default=20_000)
    ap.add_argument("--dumps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--work", type=Path, default=BENCH_DIR / ".work")
    args = ap.parse_args()

    lib = je.find_libjemalloc()
    if lib is None or not je.jemalloc_has_profiling(lib):
        sys.exit("libjemalloc2 with profiling not installed: apt-get install libjemalloc2")
    args.work.mkdir(parents=True, exist_ok=True)
    binary = build(args.work, False)
    hs, extra_env = heapscope_command(None)
    env = {**os.environ, **extra_env}
    for k in ("LD_PRELOAD", "MALLOC_CONF", "_RJEM_MALLOC_CONF"):
        env.pop(k, None)
    session = binary.parent / f"session-{args.stacks}x{args.dumps}-s128"
    record(session, hs, env, binary, args.stacks, args.dumps, 128, False)
    dumps = session_dumps(session)
    last = dumps[-1]
    stacks = je.dump_info(last, addresses=False).stacks
    print(f"dump: {last.name}, {stacks} stacks, {last.stat().st_size / 1e6:.1f} MB")

    import gc

    gc.enable()
    results: dict[str, list[float]] = {}

    def note(label: str, seconds: float) -> None:
        results.setdefault(label, []).append(seconds)

    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory(prefix="hs-serve-bench-") as cache:
            c = client(session, cache)
            ids = [d["id"] for d in c.get("/api/inputs").json()["inputs"][0]["dumps"]]
            dump = ids[-1]
            note("top table, cold (empty cache)",
                 timed(c, f"/api/dump/{dump}/top"))
            note("flame graph data, cold",
                 timed(c, f"/api/dump/{dump}/flame"))
            w = client(session, cache)
            note("top table, warm (new server, cache folder filled)",
                 timed(w, f"/api/dump/{dump}/top"))
            note("flame graph data, warm",
                 timed(w, f"/api/dump/{dump}/flame"))
            note("top table again with a focus (hot)",
                 timed(w, f"/api/dump/{dump}/top?focus=f1"))
            note("callers/callees (hot)",
                 timed(w, f"/api/dump/{dump}/peek?function=main"))
            if len(ids) > 1:
                note("diff of two dumps' top tables (one new dump, warm)",
                     timed(w, f"/api/diff?a={ids[0]}&b={dump}"))
            note("call graph, DOT and SVG by graphviz (warm)",
                 timed(w, f"/api/dump/{dump}/graph"))
            note("call graph again with a focus (hot)",
                 timed(w, f"/api/dump/{dump}/graph?focus=f1"))
            note("top table with a hide pattern (hot)",
                 timed(w, f"/api/dump/{dump}/top?hide=f1"))
            note("top table with another --alloc-fn (a new fold, warm)",
                 timed(w, f"/api/dump/{dump}/top?alloc_fn=f1$"))
            merged = ",".join(str(i) for i in ids)
            note(f"merged set of {len(ids)} dumps: top table (warm)",
                 timed(w, f"/api/merged/top?ids={merged}"))
            note(f"merged set of {len(ids)} dumps: call graph (warm)",
                 timed(w, f"/api/merged/graph?ids={merged}"))
            note("leak report of the session (warm)",
                 timed(w, "/api/session/0/leaks"))
    width = max(len(k) for k in results)
    for label, values in results.items():
        print(f"{label:<{width}}  {statistics.median(values):6.2f} s   "
              f"(runs: {', '.join(f'{v:.2f}' for v in values)})")
    warm = statistics.median(results["top table, warm (new server, cache folder filled)"])
    print(f"target: first view of a {stacks}-stack dump under 1 s warm: {warm:.2f} s -> "
          f"{'met' if warm < 1.0 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
