"""``heapscope run`` on a Rust program that links jemalloc itself with tikv-jemallocator's prefix.

``rust_rjem/`` is a tiny cargo project whose ``#[global_allocator]`` calls jemalloc-sys's
``_rjem_mallocx``/``_rjem_sdallocx``/``_rjem_rallocx``/``_rjem_calloc``: jemalloc (built with
``--enable-prof``) is linked statically with the ``_rjem_`` prefix, exactly as with
tikv-jemallocator, so it reads ``_RJEM_MALLOC_CONF`` and ignores ``MALLOC_CONF`` and
``LD_PRELOAD``. heapscope must notice this from the executable alone, set the prefixed
variable, preload nothing, prune jemalloc's ``_rjem_je_*`` frames and Rust's allocator shims,
and name the leak ``rjem_leaky::app::store::Store::insert``.

The crate is built ONCE per test session, offline, against Debian's packaged crates
(``librust-jemalloc-sys-dev``: jemalloc-sys 0.3.2 with jemalloc's source, and its build
dependencies cc, fs_extra and libc) in ``/usr/share/cargo/registry``: a private CARGO_HOME in
the session's temporary directory replaces crates.io with that directory source. The project
is copied there first, so neither ``target/`` nor a ``Cargo.lock`` is ever written into the
repository (the lock is not committed: the directory source holds exactly one version of each
crate, and a committed lock would break when Debian updates one of them). Building jemalloc
takes about a minute on two cores.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jemalloc as je
import pytest
import sitecheck as sc

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROJECT_DIR = Path(__file__).resolve().parent / "rust_rjem"
SOURCE = PROJECT_DIR / "src" / "main.rs"
SITES_DIR = Path(__file__).resolve().parent / "sites"
BIN_NAME = "rjem_leaky"
DEBIAN_REGISTRY = Path(os.environ.get("HEAPSCOPE_TEST_CARGO_REGISTRY", "/usr/share/cargo/registry"))
# jemalloc-sys and its (build) dependencies, as Debian's librust-*-dev packages install them.
REGISTRY_CRATES = {
    "jemalloc-sys-0.3.": "librust-jemalloc-sys-dev",
    "cc-1.": "librust-cc-dev",
    "fs_extra-1.": "librust-fs-extra-dev",
    "libc-0.2.": "librust-libc-dev",
}
CARGO_CONFIG = f"""\
[source.crates-io]
replace-with = "debian"

[source.debian]
directory = "{DEBIAN_REGISTRY}"

[net]
offline = true
"""

# Truth (see the table in rust_rjem/src/main.rs): 20,000 leaked Box<[u8; 1024]>.
LEAK_OBJECTS = 20_000
LEAK_BYTES = LEAK_OBJECTS * je.size_class(1024)  # 20,480,000 B = 20,000 KiB
SAMPLING_REL = 0.15  # --sample 4k: ~5,000 samples, so a few % at most; 15 % is generous

# No suspect may be named after the allocator: jemalloc's public and internal (prefixed)
# functions, its profiler, Rust's allocator shims and the alloc crate's machinery.
ALLOCATOR_PREFIXES = ("_rjem_", "je_", "prof_", "__rust_alloc", "alloc::", "<alloc::",
                      # rustc >= 1.88 mangles the shims in a `__rustc` crate (v0 symbols
                      # _RNvCs..._7___rustc12___rust_alloc), demangled __rustc::__rust_alloc.
                      "__rustc::")

RunResult = tuple[Path, subprocess.CompletedProcess[str]]  # (session folder, heapscope run)


def hs(*args: str, cache: Path, cwd: Path | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope(*args, cache=cache, cwd=cwd, timeout=timeout, unprofiled=True)


# --------------------------------------------------------------------------------------
# Fixtures


def _registry_or_skip() -> None:
    if not DEBIAN_REGISTRY.is_dir():
        pytest.skip(f"{DEBIAN_REGISTRY} does not exist: apt-get install librust-jemalloc-sys-dev")
    names = [p.name for p in DEBIAN_REGISTRY.iterdir()]
    for prefix, package in REGISTRY_CRATES.items():
        if not any(n.startswith(prefix) for n in names):
            pytest.skip(f"no {prefix}* crate in {DEBIAN_REGISTRY}: apt-get install {package}")
    jsys = max(DEBIAN_REGISTRY / n for n in names if n.startswith("jemalloc-sys-0.3."))
    if not (jsys / "jemalloc" / "src" / "prof.c").is_file():
        pytest.skip(f"{jsys} does not bundle jemalloc's source (jemalloc/src/prof.c)")


@pytest.fixture(scope="session")
def rjem_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built with ``cargo build --release``: its directory (holds target/release)."""
    cargo = je.find_tool("cargo")
    if cargo is None:
        pytest.skip("cargo not found (PATH or ~/.cargo/bin): install a Rust toolchain")
    for tool, package in (("make", "make"), ("cc", "gcc")):  # jemalloc's configure && make
        if je.find_tool(tool) is None:
            pytest.skip(f"{tool} not found (needed to build jemalloc): apt-get install {package}")
    _registry_or_skip()

    root = tmp_path_factory.mktemp("rust-rjem").resolve()
    proj = root / "rust_rjem"
    shutil.copytree(PROJECT_DIR, proj, ignore=shutil.ignore_patterns("target", "Cargo.lock"))
    # bin/sites.rs includes ../../../sites/leaks.rs: keep that layout beside the copy.
    (root / "sites").mkdir()
    shutil.copy(SITES_DIR / "leaks.rs", root / "sites" / "leaks.rs")
    cargo_home = root / "cargo-home"
    cargo_home.mkdir()
    (cargo_home / "config.toml").write_text(CARGO_CONFIG)
    env = dict(os.environ, CARGO_HOME=str(cargo_home), CARGO_BUILD_JOBS="2",
               CARGO_TARGET_DIR=str(proj / "target"), CARGO_TERM_COLOR="never")
    env["PATH"] = os.pathsep.join([str(cargo.parent), env.get("PATH", "")])
    for var in ("RUSTFLAGS", "CARGO_ENCODED_RUSTFLAGS", "MALLOC_CONF", "_RJEM_MALLOC_CONF",
                "JEMALLOC_OVERRIDE", "CARGO_BUILD_TARGET"):
        env.pop(var, None)
    p = subprocess.run([str(cargo), "build", "--release", "--offline"], cwd=proj, env=env,
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise je.E2EError(f"cargo build failed ({p.returncode}) in {proj}:\n{p.stderr[-6000:]}")
    binary = proj / "target" / "release" / BIN_NAME
    data = binary.read_bytes()
    # The build must really be prefixed, profiling-enabled jemalloc linked in.
    for symbol in (b"_rjem_mallctl", b"_rjem_mallocx", b"_rjem_je_prof_backtrace"):
        if symbol not in data:
            raise je.E2EError(f"{binary} has no {symbol.decode()} symbol")
    return proj


@pytest.fixture(scope="module")
def rjem_session(rjem_build: Path, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """``heapscope run -o SESSION --sample 4k -- ./target/release/rjem_leaky``, run once."""
    root = tmp_path_factory.mktemp("rust-rjem-run").resolve()
    session = root / "session"
    p = hs("run", "-o", str(session), "--sample", "4k", "--", f"./target/release/{BIN_NAME}",
           cache=root / "cache", cwd=rjem_build)
    return session, p


def _json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


# --------------------------------------------------------------------------------------
# Tests


def test_rjem_run_uses_the_programs_own_prefixed_jemalloc(
        rjem_session: RunResult, rjem_build: Path) -> None:
    session, p = rjem_session
    assert p.returncode == 0, p.stderr
    manifest = _json(session / "manifest.json")
    assert manifest["exit_status"] == 0
    assert manifest["conf_variable"] == "_RJEM_MALLOC_CONF"
    assert manifest["jemalloc"]["preloaded"] is False
    assert manifest["jemalloc"]["prefix"] == "_rjem_"
    conf = manifest["malloc_conf"]
    assert "prof:true" in conf and "lg_prof_sample:12" in conf  # --sample 4k = 2**12
    binary = str(rjem_build / "target" / "release" / BIN_NAME)
    assert binary in manifest["modules"]
    # A dump exists only if jemalloc really read _RJEM_MALLOC_CONF.
    assert list((session / "dumps").glob("jeprof.*.f.heap"))
    # jemalloc's own messages: a jemalloc linked in with the _rjem_ prefix does not export
    # its malloc_message for the helper to take, so they stay the program's stderr, untouched.
    assert "Leak approximation summary" in p.stderr
    (proc,) = _json(session / "report.json")["processes"]
    # One dump at exit: what is left live, not a judged leak.
    assert proc["role"] == "main" and proc["verdict"] == "unjudged"
    assert proc["left_bytes"] >= LEAK_BYTES * (1 - SAMPLING_REL)


def test_rjem_report_names_the_rust_leak(
        rjem_session: RunResult) -> None:
    session, p = rjem_session
    assert p.returncode == 0, p.stderr
    suspects = _json(session / "report.json")["suspects"]
    first = suspects[0]
    assert first["verdict"] == "live"
    assert first["bytes"] == pytest.approx(LEAK_BYTES, rel=SAMPLING_REL)
    assert first["objects"] == pytest.approx(LEAK_OBJECTS, rel=SAMPLING_REL)
    # rustc 1.95's global-allocator shim (v0 symbol "__rustc::__rust_alloc") is pruned,
    # so the first suspect is the line that keeps the memory.
    assert first["function"] == "rjem_leaky::app::store::Store::insert", first["stack"][:8]
    assert "app::store::Store" in first["function"] and "insert" in first["function"]
    assert first["file"].endswith("src/main.rs")
    assert first["line"] == je.source_line(SOURCE, "insert")
    assert first["stack"][1].startswith("rjem_leaky::main ")
    for s in suspects:
        assert not s["function"].startswith(ALLOCATOR_PREFIXES), s["stack"][:8]
    assert "rjem_leaky::app::store::Store::insert" in p.stderr


def test_rjem_top_json(rjem_session: RunResult,
                       tmp_path: Path) -> None:
    session, _ = rjem_session
    top = hs("top", "--format", "json", str(session), cache=tmp_path / "c")
    assert top.returncode == 0, top.stderr
    data = json.loads(top.stdout)
    assert data["sample_type"] == "inuse_space" and data["unit"] == "bytes"
    row = data["rows"][0]
    assert row["flat"] == pytest.approx(LEAK_BYTES, rel=SAMPLING_REL)
    assert row["module"] == BIN_NAME
    assert row["name"] == "rjem_leaky::app::store::Store::insert", row
    for r in data["rows"]:
        if r["flat"] > 0:
            assert not r["name"].startswith(ALLOCATOR_PREFIXES), r


def test_attach_to_a_running_prefixed_jemalloc(rjem_build: Path, tmp_path: Path) -> None:
    """heapscope attach finds tikv-jemallocator's _rjem_mallctl in a live Rust process."""
    if not shutil.which("gdb"):
        pytest.skip("gdb not installed: apt-get install gdb")
    env = dict(os.environ, RJEM_STAY_SECONDS="60",
               _RJEM_MALLOC_CONF=f"prof:true,lg_prof_sample:12,prof_prefix:{tmp_path}/jeprof")
    env.pop("LD_PRELOAD", None)
    binary = rjem_build / "target" / "release" / BIN_NAME
    proc = subprocess.Popen([str(binary)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        status = hs("attach", str(proc.pid), "status", "--format", "json", cache=tmp_path / "c")
        assert status.returncode == 0, status.stderr
        facts = json.loads(status.stdout)
        assert facts["opt_prof"] is True and facts["symbol"] == "_rjem_mallctl"
        session = tmp_path / "s"
        dump = hs("attach", str(proc.pid), "dump", "-o", str(session), cache=tmp_path / "c")
        assert dump.returncode == 0, dump.stderr
        top = hs("top", "--format", "json", "-n", "3", str(session), cache=tmp_path / "c")
        first = json.loads(top.stdout)["rows"][0]["name"]
        assert "app::store::Store" in first and "insert" in first, first
        assert proc.poll() is None  # still running after the attaches
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_rjem_collections_name_the_users_line(rjem_build: Path,
                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    """The leaks of sites/leaks.rs under the ``_rjem_`` jemalloc: each named by its own line
    (the same program as test_sites.py's, with the allocator linked in)."""
    root = tmp_path_factory.mktemp("rust-rjem-sites").resolve()
    s = sc.run(["./target/release/sites"], root / "session", root / "cache", cwd=rjem_build)
    sc.check_session(s, SITES_DIR / "leaks.rs", sc.RUST_LEAKS, root / "cache")
