"""Build recipes for heapscope's `run` scenarios (no Makefile; stdlib only).

Every scenario's truth is in its source's header comment. Each ``build_*`` function
compiles into *out_dir* with one compiler call and returns what it built; failures raise
:class:`ScenarioBuildError` carrying the command line and the compiler's output.

By hand::

    python3 tests/e2e/scenarios/build.py /tmp/scn          # builds what this machine can
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \\
    MALLOC_CONF=prof:true,prof_final:true,lg_prof_sample:12,prof_prefix:/tmp/scn/jeprof \\
        /tmp/scn/prefork
    heapscope top --lines /tmp/scn/jeprof.<worker-2-pid>.0.f.heap

Scenarios:

- ``prefork``        prefork.c: master + 3 forked workers; worker 2 leaks in leak_in_worker.
- ``threads``        threads.c: 4 named threads; "cache-fill" leaks in thread_leak.
- ``libcleak.so``    libcleak.c, loaded by leaky.py with ctypes: cl_make_record leaks.
- ``InflaterLeak``   InflaterLeak.java: Inflaters never end()ed: zlib state + windows leak.
- ``leakext.so``     leakext.c: PostgreSQL 15 C functions leak_top(n) and leak_blocks(n, size)
                     palloc into TopMemoryContext and never free; pool_fill(n, size, cap)
                     fills a context of its own up to cap bytes, then stops (SQL:
                     leakext--1.0.sql, MODULE_PATHNAME replaced).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

SCENARIOS_DIR = Path(__file__).resolve().parent

C_FLAGS = ("-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra")
EXE_FLAGS = (*C_FLAGS, "-fPIE", "-pie")
SO_FLAGS = (*C_FLAGS, "-fPIC", "-shared")

PREFORK_SRC = SCENARIOS_DIR / "prefork.c"
THREADS_SRC = SCENARIOS_DIR / "threads.c"
LIBCLEAK_SRC = SCENARIOS_DIR / "libcleak.c"
LEAKY_PY = SCENARIOS_DIR / "leaky.py"
INFLATER_SRC = SCENARIOS_DIR / "InflaterLeak.java"
LEAKEXT_SRC = SCENARIOS_DIR / "leakext.c"
LEAKEXT_SQL = SCENARIOS_DIR / "leakext--1.0.sql"
LEAKEXT_CONTROL = SCENARIOS_DIR / "leakext.control"


class ScenarioBuildError(RuntimeError):
    """A compiler (gcc, javac, pg_config) failed."""


def _run(cmd: Sequence[str | Path], *, cwd: Path | None = None, timeout: float = 300) -> str:
    argv = [str(c) for c in cmd]
    try:
        proc = subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ScenarioBuildError(f"{' '.join(argv)}: {e}") from e
    if proc.returncode != 0:
        raise ScenarioBuildError(
            f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
        )
    return proc.stdout


def _cc(gcc: str | Path, flags: Sequence[str], src: Path, out: Path, *libs: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    _run([gcc, *flags, src, "-o", out, *libs])
    return out.resolve()


def build_prefork(out_dir: Path, gcc: str | Path = "gcc") -> Path:
    return _cc(gcc, EXE_FLAGS, PREFORK_SRC, out_dir / "prefork")


def build_threads(out_dir: Path, gcc: str | Path = "gcc") -> Path:
    return _cc(gcc, (*EXE_FLAGS, "-pthread"), THREADS_SRC, out_dir / "threads")


def build_libcleak(out_dir: Path, gcc: str | Path = "gcc") -> Path:
    return _cc(gcc, SO_FLAGS, LIBCLEAK_SRC, out_dir / "libcleak.so")


def build_inflater_leak(out_dir: Path, javac: str | Path = "javac") -> Path:
    """javac InflaterLeak.java into *out_dir*/classes; returns that class path."""
    classes = out_dir / "classes"
    classes.mkdir(parents=True, exist_ok=True)
    _run([javac, "-d", classes, INFLATER_SRC])
    return classes.resolve()


def pg_config_value(pg_config: str | Path, option: str) -> str:
    return _run([pg_config, option]).strip()


def build_leakext(
    out_dir: Path, pg_config: str | Path = "pg_config", gcc: str | Path = "gcc"
) -> Path:
    """leakext.so, compiled against ``pg_config --includedir-server`` (no PGXS)."""
    include = pg_config_value(pg_config, "--includedir-server")
    if not (Path(include) / "postgres.h").is_file():
        raise ScenarioBuildError(f"{include}/postgres.h missing: install postgresql-server-dev-15")
    return _cc(gcc, (*SO_FLAGS, f"-I{include}"), LEAKEXT_SRC, out_dir / "leakext.so")


def leakext_sql(module: Path) -> str:
    """leakext--1.0.sql with MODULE_PATHNAME = *module* and psql meta-commands removed."""
    lines = [
        line
        for line in LEAKEXT_SQL.read_text().splitlines()
        if not line.startswith("\\") and not line.startswith("--")
    ]
    return "\n".join(lines).replace("MODULE_PATHNAME", str(module)).strip() + "\n"


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print(f"usage: {sys.argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    recipes: list[tuple[str, str, Callable[[], Path]]] = [
        ("prefork", "gcc", lambda: build_prefork(out)),
        ("threads", "gcc", lambda: build_threads(out)),
        ("libcleak.so", "gcc", lambda: build_libcleak(out)),
        ("InflaterLeak", "javac", lambda: build_inflater_leak(out)),
        ("leakext.so", "pg_config", lambda: build_leakext(out)),
    ]
    status = 0
    for name, tool, recipe in recipes:
        if shutil.which(tool) is None:
            print(f"skip  {name}: {tool} not found")
            continue
        try:
            print(f"built {name}: {recipe()}")
        except ScenarioBuildError as e:
            print(f"FAIL  {name}: {e}")
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
