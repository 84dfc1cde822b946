"""Symbolization speed: 20,000 distinct addresses in a generated 5,000-function PIE.

Times symbolize() cold (one llvm-symbolizer run), warm (the build-id cache, no llvm-symbolizer)
and without cache, and checks every address is named. Run: python bench/symbolize_speed.py
(building the binary takes a while on 2 cores).
"""

from __future__ import annotations

import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.unit.test_symbols_support import (  # noqa: E402
    EXE_BASE,
    CountingBackend,
    functions,
    mappings_for,
    profile,
    run,
)

from heapscope.symbols import SymbolOptions, symbolize  # noqa: E402
from heapscope.symbols.symtab import SymbolTable  # noqa: E402

N_FUNCTIONS = 5000
N_ADDRESSES = 20_000
N_UNITS = 4


def generate(d: Path) -> list[Path]:
    """C sources with N_FUNCTIONS noinline functions, each with two always_inline helpers."""
    sources = []
    per_unit = N_FUNCTIONS // N_UNITS
    for unit in range(N_UNITS):
        lines = ["#include <stdlib.h>", "#include <string.h>"]
        for k in range(unit * per_unit, (unit + 1) * per_unit):
            lines += [
                f"static inline __attribute__((always_inline)) long h1_{k}(long x)",
                f"{{ char *p = malloc((size_t)(x % 64) + {k % 13 + 1}); if (!p) return 0;",
                f"  memset(p, {k % 251}, 1); long r = p[0] * x; free(p); return r; }}",
                f"static inline __attribute__((always_inline)) long h2_{k}(long x)",
                f"{{ return h1_{k}(x + {k}) ^ (x >> 3); }}",
                f"__attribute__((noinline)) long fn_{k}(long x)",
                f"{{ long s = 0; for (long i = 0; i < x; i++) s += h2_{k}(i * {k + 1});",
                "  return s; }",
            ]
        path = d / f"unit{unit}.c"
        path.write_text("\n".join(lines) + "\n")
        sources.append(path)
    main = d / "main.c"
    main.write_text("int main(void) { return 0; }\n")
    return [*sources, main]


def bench(tmp_path: Path) -> int:
    """Build the binary, symbolize cold, warm and without cache; print; 0 when checks hold."""
    t0 = time.perf_counter()
    exe = tmp_path / "big"
    run("gcc", "-O2", "-g", "-fPIE", "-pie", "-o", exe, *generate(tmp_path))
    build_s = time.perf_counter() - t0

    syms = sorted(v for n, v in functions(exe).items() if n.startswith("fn_"))
    rng = random.Random(42)
    chosen: set[int] = set()
    while len(chosen) < N_ADDRESSES:
        start, size = rng.choice(syms)
        chosen.add(start + rng.randrange(size))
    addrs = sorted(EXE_BASE + v for v in chosen)
    # Stacks of 4 frames; every address appears, most of them as return addresses.
    stacks = [addrs[i : i + 4] for i in range(0, len(addrs), 4)]
    prof = profile(stacks, mappings_for(exe, EXE_BASE))
    opts = SymbolOptions(
        cache_dir=str(tmp_path / "cache"),
        debuginfod_urls=(),
        system_debug_dir=str(tmp_path / "none"),
    )

    t0 = time.perf_counter()
    symtab = SymbolTable.read(str(exe))
    symtab_s = time.perf_counter() - t0

    backend = CountingBackend()
    t0 = time.perf_counter()
    cold = symbolize(prof, opts, backend=backend)
    cold_s = time.perf_counter() - t0

    warm_backend = CountingBackend()
    t0 = time.perf_counter()
    warm = symbolize(prof, opts, backend=warm_backend)
    warm_s = time.perf_counter() - t0

    nocache = SymbolOptions(
        cache_dir=None, debuginfod_urls=(), system_debug_dir=str(tmp_path / "none")
    )
    t0 = time.perf_counter()
    symbolize(prof, nocache)
    nocache_s = time.perf_counter() - t0

    locs = cold.profile.locations
    frames = sum(len(loc.frames) for loc in locs.values())
    inlined = sum(1 for loc in locs.values() if len(loc.frames) > 1)
    named = sum(1 for loc in locs.values() if loc.frames)
    print(
        f"\nbinary: {exe.stat().st_size / 1e6:.1f} MB, {len(symtab)} sized function symbols, "
        f"built in {build_s:.1f} s; symtab read {symtab_s * 1000:.0f} ms\n"
        f"{len(locs)} addresses: {named} named, {inlined} with inlined frames, {frames} frames\n"
        f"cold {cold_s:.2f} s ({len(backend.calls)} llvm-symbolizer run), "
        f"warm {warm_s:.2f} s ({len(warm_backend.calls)} runs), no-cache {nocache_s:.2f} s"
    )
    checks = [
        ("every address symbolized", len(locs) == N_ADDRESSES and named == N_ADDRESSES),
        ("one llvm-symbolizer run cold, none warm",
         len(backend.calls) == 1 and warm_backend.calls == []),
        ("warm gives the same frames", warm.profile.locations == locs),
        ("warm at least 2x faster than cold", warm_s < cold_s / 2),
    ]
    for name, ok in checks:
        print(f"  [{'PASS' if ok else 'MISS'}] {name}")
    return 0 if all(ok for _n, ok in checks) else 1


def main() -> int:
    for tool in ("gcc", "llvm-symbolizer"):
        if shutil.which(tool) is None:
            print(f"{tool} not found (apt-get install gcc llvm)", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="heapscope-symbench-") as d:
        return bench(Path(d))


if __name__ == "__main__":
    sys.exit(main())
