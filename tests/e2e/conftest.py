"""Session fixtures for heapscope's end-to-end tests.

Every test program under ``programs/`` is built ONCE per test session into a temporary
directory and run ONCE under the real jemalloc (LD_PRELOAD) with heap profiling; the
fixtures expose the binaries and the ``.f.heap`` dumps. Truth numbers live in
``jemalloc.py`` (LEAKY_C_*, LEAKY_CPP_*, LEAKY_RS_*) and in each program's header comment.

Fixtures (all session-scoped; each returns a :class:`ProfiledProgram`):

- ``leaky_c``          leaky.c + stripped libhelper.so, every allocation sampled
                       (``lg_prof_sample:0,prof_accum:true,prof_sys_thread_name:true``):
                       jeprof's totals are the exact truth.
- ``leaky_c_sampled``  the same binary, run with ``lg_prof_sample:12`` (4 KiB mean
                       sampling interval, prof_accum, thread names): for comparing
                       heapscope's unbiased estimates with jeprof's.
- ``leaky_cpp``        leaky.cpp (C++17), every allocation sampled.
- ``leaky_rust_legacy`` / ``leaky_rust_v0``  leaky.rs built with legacy and v0 symbol
                       mangling, every allocation sampled.

Prerequisite fixtures skip with a precise reason when something is truly absent:
``libjemalloc`` (a jemalloc with profiling), ``jeprof``, ``gcc``, ``gxx``, ``rustc``.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

try:  # tests/e2e as a package or as a rootdir-inserted directory
    from . import jemalloc as je
except ImportError:
    import jemalloc as je

ALL_SAMPLED = "lg_prof_sample:0,prof_accum:true,prof_sys_thread_name:true"
SAMPLED_4K = "lg_prof_sample:12,prof_accum:true,prof_sys_thread_name:true"

C_FLAGS = ("-O1", "-g", "-fPIE", "-pie", "-pthread")
CXX_FLAGS = ("-std=c++17", "-O1", "-g", "-fPIE", "-pie")
HELPER_FLAGS = ("-O1", "-g", "-fPIC", "-shared", "-fno-toplevel-reorder")
RUST_FLAGS = ("-g", "-C", "opt-level=1")
# How leaky::app::cache::Store::insert is mangled in each variant (symbol-name prefix).
RUST_INSERT_SYMBOL_PREFIX = {
    "legacy": b"_ZN5leaky3app5cache5Store6insert17h",
    "v0": b"5leaky3app5cacheNtB",  # _RNvMNtNtCs<hash>_5leaky3app5cacheNtB2_5Store6insert
}


@dataclass
class ProfiledProgram:
    """A test program built and run once under jemalloc with profiling."""

    name: str
    binary: Path  # absolute, resolved: the path in the dump's MAPPED_LIBRARIES
    dump: Path  # the final dump (<dir>/jeprof.<pid>.0.f.heap)
    dir: Path  # working directory of the run (holds the dump)
    source: Path  # the program's source file (for LEAK:<tag> markers)
    conf: str  # the MALLOC_CONF additions used (besides prof/prof_final/prof_prefix)
    dumps: list[Path] = field(default_factory=list)  # every dump the run wrote, sorted
    lib: Path | None = None  # stripped libhelper.so the binary loads (leaky_c only)
    lib_unstripped: Path | None = None  # an unstripped copy, in another directory
    libjemalloc: Path | None = None
    build_dir: Path | None = None  # where the binary (and libhelper.so) were built

    @property
    def info(self) -> je.DumpInfo:
        return je.dump_info(self.dump)


# --------------------------------------------------------------------------------------
# Prerequisites


@pytest.fixture(scope="session")
def helper_built() -> str:
    """The helper ``run`` preloads (heapscope._preload); skips when it was not built."""
    from heapscope.capture.helper import library

    lib = library()
    if lib is None:
        pytest.skip("heapscope._preload was not built (a C compiler is needed at install)")
    return lib


@pytest.fixture(scope="session")
def libjemalloc() -> Path:
    lib = je.find_libjemalloc()
    if lib is None:
        pytest.skip("libjemalloc2 with profiling not installed: apt-get install libjemalloc2")
    if not je.jemalloc_has_profiling(lib):
        pytest.skip(
            f"{lib} was built without heap profiling (--enable-prof): "
            "install Debian's libjemalloc2, which has it"
        )
    return lib


@pytest.fixture(scope="session")
def jeprof() -> Path:
    path = je.find_jeprof()
    if path is None:
        pytest.skip("jeprof not installed: apt-get install libjemalloc-dev")
    return path


def _tool_or_skip(name: str, package: str) -> Path:
    path = je.find_tool(name)
    if path is None:
        pytest.skip(f"{name} not found: apt-get install {package}")
    return path


@pytest.fixture(scope="session")
def gcc() -> Path:
    _tool_or_skip("strip", "binutils")
    return _tool_or_skip("gcc", "gcc")


@pytest.fixture(scope="session")
def gdb() -> str:
    """gdb (the way to processes the call stub cannot serve)."""
    return str(_tool_or_skip("gdb", "gdb"))


@pytest.fixture(scope="session")
def storm_bin(gcc: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """attachprog/storm.c: every thread allocates, signals counted (see storm.py)."""
    out = tmp_path_factory.mktemp("storm") / "storm"
    subprocess.run([str(gcc), "-O1", "-g", "-pthread", "-o", str(out),
                    str(Path(__file__).resolve().parent / "attachprog" / "storm.c")],
                   check=True)
    return out


@pytest.fixture(scope="session")
def gxx() -> Path:
    return _tool_or_skip("g++", "g++")


@pytest.fixture(scope="session")
def rustc() -> Path:
    path = je.find_tool("rustc")
    if path is None:
        pytest.skip("rustc not found (PATH or ~/.cargo/bin): install a Rust toolchain")
    return path


@pytest.fixture(scope="session")
def e2e_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Session temp directory for builds and runs (resolved: jeprof needs exact paths)."""
    return tmp_path_factory.mktemp("heapscope-e2e").resolve()


def _run(
    name: str,
    binary: Path,
    source: Path,
    run_dir: Path,
    conf: str,
    libjemalloc: Path,
    **extra: object,
) -> ProfiledProgram:
    dumps = je.run_profiled([binary], run_dir, conf, lib=libjemalloc, timeout=120)
    finals = [d for d in dumps if d.name.endswith(".f.heap")]
    if len(finals) != 1:
        raise je.E2EError(f"{name}: expected one .f.heap, got {[d.name for d in dumps]}")
    return ProfiledProgram(
        name=name,
        binary=binary,
        dump=finals[0],
        dir=run_dir,
        source=source,
        conf=conf,
        dumps=dumps,
        libjemalloc=libjemalloc,
        build_dir=binary.parent,
        **extra,  # type: ignore[arg-type]
    )


# --------------------------------------------------------------------------------------
# leaky.c


@dataclass
class _LeakyCBuild:
    binary: Path
    lib: Path
    lib_unstripped: Path


@pytest.fixture(scope="session")
def leaky_c_build(e2e_dir: Path, gcc: Path) -> _LeakyCBuild:
    """leaky (PIE) linked against the stripped libhelper.so next to it (rpath $ORIGIN)."""
    bdir = e2e_dir / "leaky_c"
    bdir.mkdir()
    unstripped_dir = e2e_dir / "leaky_c_unstripped"
    unstripped_dir.mkdir()
    lib_unstripped = je.build(
        [je.PROGRAMS_DIR / "helper.c"],
        unstripped_dir / "libhelper.so",
        HELPER_FLAGS,
        compiler=gcc,
    )
    lib = je.strip_all(lib_unstripped, bdir / "libhelper.so")
    binary = je.build(
        [je.PROGRAMS_DIR / "leaky.c"],
        bdir / "leaky",
        C_FLAGS,
        compiler=gcc,
        link_flags=[f"-L{bdir}", "-lhelper", "-Wl,-rpath,$ORIGIN"],
    )
    return _LeakyCBuild(binary.resolve(), lib.resolve(), lib_unstripped.resolve())


def _leaky_c_run(
    build: _LeakyCBuild, e2e_dir: Path, libjemalloc: Path, name: str, conf: str
) -> ProfiledProgram:
    return _run(
        name,
        build.binary,
        je.PROGRAMS_DIR / "leaky.c",
        e2e_dir / name,
        conf,
        libjemalloc,
        lib=build.lib,
        lib_unstripped=build.lib_unstripped,
    )


@pytest.fixture(scope="session")
def leaky_c(leaky_c_build: _LeakyCBuild, e2e_dir: Path, libjemalloc: Path) -> ProfiledProgram:
    """leaky.c, every allocation sampled: exact truth (jemalloc.LEAKY_C_*)."""
    return _leaky_c_run(leaky_c_build, e2e_dir, libjemalloc, "run_leaky_c", ALL_SAMPLED)


@pytest.fixture(scope="session")
def leaky_c_sampled(
    leaky_c_build: _LeakyCBuild, e2e_dir: Path, libjemalloc: Path
) -> ProfiledProgram:
    """leaky.c with lg_prof_sample:12 (heap_v2/4096): estimates, compare with jeprof."""
    return _leaky_c_run(leaky_c_build, e2e_dir, libjemalloc, "run_leaky_c_sampled", SAMPLED_4K)


# --------------------------------------------------------------------------------------
# leaky.cpp


@pytest.fixture(scope="session")
def leaky_cpp(e2e_dir: Path, gxx: Path, libjemalloc: Path) -> ProfiledProgram:
    """leaky.cpp (C++17, -O1 -g, PIE), every allocation sampled (jemalloc.LEAKY_CPP_*)."""
    bdir = e2e_dir / "leaky_cpp"
    bdir.mkdir()
    src = je.PROGRAMS_DIR / "leaky.cpp"
    binary = je.build([src], bdir / "leaky_cpp", CXX_FLAGS, compiler=gxx).resolve()
    return _run("leaky_cpp", binary, src, e2e_dir / "run_leaky_cpp", ALL_SAMPLED, libjemalloc)


# --------------------------------------------------------------------------------------
# leaky.rs


def _leaky_rust(
    e2e_dir: Path, rustc: Path, libjemalloc: Path, variant: str, extra: tuple[str, ...]
) -> ProfiledProgram:
    bdir = e2e_dir / f"leaky_rust_{variant}"
    bdir.mkdir()
    src = je.PROGRAMS_DIR / "leaky.rs"
    # rustc names the crate after the file ("leaky"): paths are leaky::app::cache::...
    binary = je.build(
        [src],
        bdir / f"leaky_rust_{variant}",
        (*RUST_FLAGS, *extra),
        compiler=rustc,
        cwd=bdir,
    ).resolve()
    symbol = RUST_INSERT_SYMBOL_PREFIX[variant]
    if symbol not in binary.read_bytes():
        if variant == "legacy":
            pytest.skip(
                "this rustc does not use legacy mangling by default, and "
                "-C symbol-mangling-version=legacy needs a nightly rustc"
            )
        raise je.E2EError(f"{binary} has no {symbol!r} symbol")
    return _run(
        f"leaky_rust_{variant}",
        binary,
        src,
        e2e_dir / f"run_leaky_rust_{variant}",
        ALL_SAMPLED,
        libjemalloc,
    )


@pytest.fixture(scope="session")
def leaky_rust_legacy(e2e_dir: Path, rustc: Path, libjemalloc: Path) -> ProfiledProgram:
    """leaky.rs with rustc's default (legacy, ``_ZN..17h<hash>E``) mangling."""
    return _leaky_rust(e2e_dir, rustc, libjemalloc, "legacy", ())


@pytest.fixture(scope="session")
def leaky_rust_v0(e2e_dir: Path, rustc: Path, libjemalloc: Path) -> ProfiledProgram:
    """leaky.rs with ``-C symbol-mangling-version=v0`` (``_R...`` symbols)."""
    return _leaky_rust(e2e_dir, rustc, libjemalloc, "v0", ("-C", "symbol-mangling-version=v0"))


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One HEAPSCOPE_CACHE_DIR for the e2e tests that may share a symbol cache."""
    return tmp_path_factory.mktemp("hs-cache")
