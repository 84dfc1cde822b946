"""Helpers for heapscope's end-to-end tests: build programs, run them under real
jemalloc with heap profiling, and ask the real ``jeprof`` for reference numbers.

Used by ``tests/e2e/conftest.py`` (fixtures) and by ``bench/run.py``. Nothing in here
imports heapscope: these helpers produce the ground truth heapscope is checked against.

Facts relied on (see shared/reference/jemalloc-and-jeprof.md §1, §2, §5):
- ``MALLOC_CONF=prof:true,prof_final:true,prof_prefix:<dir>/jeprof`` makes jemalloc
  write ``<dir>/jeprof.<pid>.<seq>.f.heap`` at exit (``heap_v2`` format).
- ``lg_prof_sample:0`` samples every allocation, so jeprof's unbiased totals equal the
  true usable-size totals (to ~0.03%: scale = 1/(1-exp(-size)) with R = 1).
- jeprof prints ``Total: N B`` (``--show_bytes``) or ``Total: N objects``, or nothing
  at all when the total is 0 (e.g. ``--alloc_space`` without ``prof_accum``).
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS_DIR = Path(__file__).resolve().parent / "programs"

LIBJEMALLOC_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib64/libjemalloc.so.2",
    "/usr/lib/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
)

JEPROF_METRICS = ("inuse_space", "inuse_objects", "alloc_space", "alloc_objects")

_TOTAL_RE = re.compile(r"^Total(?: \(t[^)]*\))?:\s+(-?[0-9.]+(?:e[+-]?\d+)?)\s+(\S+)", re.M)
_ROW_RE = re.compile(
    r"^\s*(-?[0-9.]+)\s+(-?[0-9.]+)%\s+(-?[0-9.]+)%\s+(-?[0-9.]+)\s+(-?[0-9.]+)%\s+(.*)$"
)


class E2EError(RuntimeError):
    """A build, a profiled run or a jeprof invocation failed."""


class BuildError(E2EError):
    """The compiler failed; the message carries its command line and stderr."""


# --------------------------------------------------------------------------------------
# Locating prerequisites


def find_libjemalloc() -> Path | None:
    """Path of a jemalloc shared library, or None.

    ``HEAPSCOPE_TEST_LIBJEMALLOC`` overrides the search; then the usual Debian/RPM
    locations; then ``ldconfig -p``.
    """
    env = os.environ.get("HEAPSCOPE_TEST_LIBJEMALLOC")
    if env:
        p = Path(env)
        return p if p.is_file() else None
    for cand in LIBJEMALLOC_CANDIDATES:
        p = Path(cand)
        if p.is_file():
            return p
    ldconfig = shutil.which("ldconfig")
    if ldconfig is None and Path("/sbin/ldconfig").exists():
        ldconfig = "/sbin/ldconfig"
    if ldconfig:
        try:
            out = subprocess.run(
                [ldconfig, "-p"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            if "libjemalloc.so" in line and "=>" in line:
                p = Path(line.split("=>", 1)[1].strip())
                if p.is_file():
                    return p
    return None


def jemalloc_has_profiling(lib: Path) -> bool:
    """True when *lib* accepts ``prof:true`` and writes a final dump.

    A jemalloc built without ``--enable-prof`` prints ``Invalid conf pair: prof:true``
    and writes nothing.
    """
    true = shutil.which("true") or "/bin/true"
    with tempfile.TemporaryDirectory(prefix="hs-jeprobe-") as d:
        env = dict(os.environ)
        env["LD_PRELOAD"] = str(lib)
        env["MALLOC_CONF"] = f"prof:true,prof_final:true,prof_prefix:{d}/probe"
        try:
            proc = subprocess.run(
                [true], env=env, capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return False
        if "Invalid conf" in proc.stderr:
            return False
        return any(Path(d).glob("probe.*.heap"))


def find_jeprof() -> Path | None:
    """``HEAPSCOPE_TEST_JEPROF``, else ``jeprof`` on PATH, else /usr/bin/jeprof."""
    env = os.environ.get("HEAPSCOPE_TEST_JEPROF")
    if env:
        return Path(env) if Path(env).is_file() else None
    found = shutil.which("jeprof")
    if found:
        return Path(found)
    return Path("/usr/bin/jeprof") if Path("/usr/bin/jeprof").is_file() else None


def find_tool(name: str) -> Path | None:
    """A compiler or tool on PATH; ``rustc`` is also looked for in ``~/.cargo/bin``."""
    found = shutil.which(name)
    if found:
        return Path(found)
    if name in ("rustc", "cargo"):
        for home in (os.environ.get("CARGO_HOME"), str(Path.home() / ".cargo")):
            if home and (Path(home) / "bin" / name).is_file():
                return Path(home) / "bin" / name
    return None


# --------------------------------------------------------------------------------------
# Building


def _compiler_for(sources: Sequence[Path]) -> str:
    suffixes = {Path(s).suffix for s in sources}
    if ".rs" in suffixes:
        return "rustc"
    if suffixes & {".cpp", ".cc", ".cxx", ".C"}:
        return "g++"
    return "gcc"


def build(
    sources: Sequence[Path | str],
    out: Path | str,
    flags: Sequence[str] = (),
    *,
    compiler: str | Path | None = None,
    link_flags: Sequence[str] = (),
    cwd: Path | str | None = None,
    timeout: float = 300,
) -> Path:
    """Compile *sources* into *out* with ONE compiler invocation and return *out*.

    The compiler is ``gcc`` for C, ``g++`` for C++ and ``rustc`` for Rust unless
    *compiler* is given. The command is ``<cc> <flags> <sources> -o <out> <link_flags>``.
    Raises :class:`BuildError` with the command line and the compiler's stderr on failure.
    """
    srcs = [Path(s) for s in sources]
    out = Path(out)
    cc = str(compiler) if compiler else _compiler_for(srcs)
    if not Path(cc).is_absolute():
        found = find_tool(cc)
        if found is None:
            raise BuildError(f"compiler {cc!r} not found")
        cc = str(found)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [cc, *flags, *map(str, srcs), "-o", str(out), *link_flags]
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"compiler timed out after {timeout}s: {' '.join(cmd)}") from e
    if proc.returncode != 0 or not out.exists():
        raise BuildError(
            f"build failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr}{proc.stdout}"
        )
    return out


def strip_all(path: Path, out: Path | None = None) -> Path:
    """``strip --strip-all`` *path* (in place, or into *out*)."""
    strip = find_tool("strip")
    if strip is None:
        raise BuildError("strip (binutils) not found")
    cmd = [str(strip), "--strip-all", str(path)]
    if out is not None:
        cmd += ["-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildError(f"strip failed: {' '.join(cmd)}\n{proc.stderr}")
    return out or path


# --------------------------------------------------------------------------------------
# Running under jemalloc


def _dump_sort_key(p: Path) -> tuple[object, ...]:
    # <prefix>.<pid>.<seq>.<kind><vseq>.heap; kind f (final) sorts after i/m/u.
    parts = p.name.split(".")
    try:
        pid, seq = int(parts[-4]), int(parts[-3])
        return (0, pid, seq, parts[-2] == "f", parts[-2], p.name)
    except (IndexError, ValueError):
        return (1, 0, 0, False, "", p.name)


def malloc_conf(workdir: Path | str, conf: str = "", prefix: str = "jeprof") -> str:
    """The MALLOC_CONF string run_profiled() uses."""
    base = f"prof:true,prof_final:true,prof_prefix:{Path(workdir)}/{prefix}"
    conf = conf.strip().strip(",")
    return f"{base},{conf}" if conf else base


def run_profiled(
    cmd: Sequence[str | Path],
    workdir: Path | str,
    conf: str = "",
    env: Mapping[str, str] | None = None,
    *,
    prefix: str = "jeprof",
    lib: Path | None = None,
    timeout: float = 600,
    check: bool = True,
) -> list[Path]:
    """Run *cmd* with ``LD_PRELOAD=<libjemalloc>`` and heap profiling on.

    ``MALLOC_CONF=prof:true,prof_final:true,prof_prefix:<workdir>/<prefix>,<conf>``;
    the process runs in *workdir*. Returns the dump files this run wrote
    (``<prefix>.*.heap`` that did not exist before), sorted by pid, sequence, final last.
    Raises :class:`E2EError` (with stderr) if the program fails or writes no dump.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    lib = lib or find_libjemalloc()
    if lib is None:
        raise E2EError("libjemalloc not found")
    before = set(workdir.glob(f"{prefix}.*.heap"))
    full_env = dict(os.environ)
    for k in ("MALLOC_CONF", "_RJEM_MALLOC_CONF", "LD_PRELOAD"):
        full_env.pop(k, None)
    if env:
        full_env.update(env)
    full_env["LD_PRELOAD"] = str(lib)
    full_env["MALLOC_CONF"] = malloc_conf(workdir, conf, prefix)
    argv = [str(c) for c in cmd]
    try:
        proc = subprocess.run(
            argv,
            cwd=workdir,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise E2EError(f"{argv} timed out after {timeout}s") from e
    if check and proc.returncode != 0:
        raise E2EError(
            f"{argv} exited {proc.returncode} (MALLOC_CONF={full_env['MALLOC_CONF']}):\n"
            f"{proc.stderr}"
        )
    dumps = sorted(set(workdir.glob(f"{prefix}.*.heap")) - before, key=_dump_sort_key)
    if check and not dumps:
        raise E2EError(
            f"{argv} wrote no heap dump in {workdir} (MALLOC_CONF={full_env['MALLOC_CONF']});"
            f" stderr:\n{proc.stderr}"
        )
    return dumps


# --------------------------------------------------------------------------------------
# Reading dumps (just enough for fixtures and the benchmark; heapscope has the real parser)


@dataclass
class DumpInfo:
    """A few facts about a heap_v2 dump, read without heapscope."""

    header: str  # first line, e.g. "heap_v2/4096"
    sample_period: int | None  # R from "heap_v2/R"
    stacks: int  # number of "@" lines
    unique_addresses: int
    has_mapped_libraries: bool
    threads: dict[str, str] = field(default_factory=dict)  # "t0" -> name ("" if none)
    maps: str = ""  # the text after MAPPED_LIBRARIES:
    size: int = 0  # bytes


def dump_info(path: Path | str, *, addresses: bool = True) -> DumpInfo:
    """Scan a heap_v2 dump: header, stack count, distinct frame addresses, thread names."""
    path = Path(path)
    data = path.read_bytes()
    marker = b"\nMAPPED_LIBRARIES:\n"
    idx = data.find(marker)
    body = data if idx < 0 else data[:idx]
    maps = "" if idx < 0 else data[idx + len(marker) :].decode("utf-8", "replace")
    first_nl = body.find(b"\n")
    header = body[: first_nl if first_nl >= 0 else len(body)].decode("utf-8", "replace").strip()
    m = re.match(r"heap_v2/(\d+)", header)
    period = int(m.group(1)) if m else None
    threads: dict[str, str] = {}
    for line in body[first_nl + 1 :].split(b"\n"):
        if line.startswith(b"@"):
            break
        tm = re.match(rb"\s*(t\d+):\s+\d+:\s+\d+\s+\[\d+:\s+\d+\](?: (.*))?$", line)
        if tm:
            threads[tm.group(1).decode()] = (tm.group(2) or b"").decode("utf-8", "replace")
    stack_lines = re.findall(rb"^@[^\n]*", body, re.M)
    uniq: set[bytes] = set()
    if addresses:
        for line in stack_lines:
            uniq.update(line.split()[1:])
    return DumpInfo(
        header=header,
        sample_period=period,
        stacks=len(stack_lines),
        unique_addresses=len(uniq),
        has_mapped_libraries=idx >= 0,
        threads=threads,
        maps=maps,
        size=len(data),
    )


# --------------------------------------------------------------------------------------
# jeprof


@dataclass(frozen=True)
class JeprofRow:
    flat: float
    flat_pct: float
    sum_pct: float
    cum: float
    cum_pct: float
    name: str  # the rest of the line: function name (and file:line with --lines)


def parse_total(text: str) -> tuple[float, str] | None:
    """``(value, unit)`` of the first ``Total: N unit`` line, or None if there is none."""
    m = _TOTAL_RE.search(text)
    if not m:
        return None
    return float(m.group(1)), m.group(2)


def parse_jeprof_text(text: str) -> tuple[float, list[JeprofRow]]:
    """Parse ``jeprof --text`` output: (total, rows). Total is 0 when absent."""
    total = parse_total(text)
    rows = []
    for line in text.splitlines():
        m = _ROW_RE.match(line)
        if m:
            rows.append(
                JeprofRow(
                    float(m.group(1)),
                    float(m.group(2)),
                    float(m.group(3)),
                    float(m.group(4)),
                    float(m.group(5)),
                    m.group(6).rstrip(),
                )
            )
    return (total[0] if total else 0.0), rows


def _jeprof_cmd(binary: Path | str, dumps: Sequence[Path | str], args: Iterable[str]) -> list[str]:
    jeprof = find_jeprof()
    if jeprof is None:
        raise E2EError("jeprof not found")
    return [str(jeprof), *args, str(Path(binary).resolve()), *map(str, dumps)]


def jeprof_text(
    binary: Path | str,
    dump: Path | str | Sequence[Path | str],
    args: Iterable[str] = (),
    *,
    timeout: float = 900,
) -> str:
    """stdout of ``jeprof --text <args> <binary> <dump...>``; raises E2EError on failure.

    The binary path must be the one in the dump's maps (jeprof matches it exactly);
    it is passed resolved (absolute).
    """
    dumps = [dump] if isinstance(dump, (str, Path)) else list(dump)
    cmd = _jeprof_cmd(binary, dumps, ["--text", *args])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise E2EError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr}")
    return proc.stdout


def jeprof_top(
    binary: Path | str, dump: Path | str, extra_args: Sequence[str] = ()
) -> list[JeprofRow]:
    """Rows of ``jeprof --text <extra_args> binary dump`` (flat, flat%, sum%, cum, cum%, name)."""
    return parse_jeprof_text(jeprof_text(binary, dump, extra_args))[1]


def jeprof_totals(
    binary: Path | str, dump: Path | str, extra_args: Sequence[str] = ()
) -> dict[str, float]:
    """``Total:`` of jeprof for the four heap metrics, as floats.

    Keys: inuse_space, inuse_objects (jeprof's default metric and --inuse_objects),
    alloc_space, alloc_objects; space in bytes (``--show_bytes``). jeprof prints no
    Total line when a total is 0 (alloc_* without prof_accum); that gives 0.0.
    The four jeprof processes run concurrently.
    """

    def one(metric: str) -> float:
        text = jeprof_text(binary, dump, ["--show_bytes", f"--{metric}", *extra_args])
        total = parse_total(text)
        return total[0] if total else 0.0

    with ThreadPoolExecutor(max_workers=len(JEPROF_METRICS)) as pool:
        values = list(pool.map(one, JEPROF_METRICS))
    return dict(zip(JEPROF_METRICS, values, strict=True))


# --------------------------------------------------------------------------------------
# Ground truth


def size_class(n: int) -> int:
    """jemalloc 5.x usable size for a request of *n* bytes (x86-64: 16 B quantum).

    8; multiples of 16 up to 128; above that four classes per doubling
    (160, 192, 224, 256, 320, ...), which also holds for large sizes (1 MiB -> 1 MiB).
    """
    if n <= 8:
        return 8
    if n <= 128:
        return (n + 15) // 16 * 16
    lg = (n - 1).bit_length() - 1  # floor(log2(n - 1))
    delta = 1 << (lg - 2)
    return (n + delta - 1) // delta * delta


def source_line(path: Path | str, tag: str) -> int:
    """1-based line number of the ``LEAK:<tag>`` marker comment in a program source."""
    pat = re.compile(rf"LEAK:{re.escape(tag)}(?![\w-])")
    lines = Path(path).read_text().splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if pat.search(line)]
    if len(hits) != 1:
        raise ValueError(f"marker LEAK:{tag} found {len(hits)} times in {path}")
    return hits[0]


@dataclass(frozen=True)
class LeakSite:
    """One leaking call site of a test program and its exact truth."""

    function: str  # the function a correct report names as the leaf (after pruning)
    tag: str  # LEAK:<tag> marker in the source
    thread: str  # thread name (prof_sys_thread_name:true)
    objects: int
    request: tuple[int, ...]  # requested sizes, cycled over the objects
    module: str = ""  # "" = the main binary; else the shared object's file name
    caller: str = ""  # the next frame a correct report shows (inline chains, pruning)

    @property
    def bytes(self) -> int:
        """Live bytes in jemalloc usable sizes."""
        k = len(self.request)
        return sum(size_class(self.request[i % k]) for i in range(self.objects))


# leaky.c: see the table at the top of programs/leaky.c.
LEAKY_C_SITES: tuple[LeakSite, ...] = (
    LeakSite("leak_small", "small", "leaky-main", 20_000, (48,), caller="main"),
    LeakSite("leak_big", "big", "leaky-main", 8, (1 << 20,), caller="main"),
    LeakSite("worker_alloc", "worker", "leaky-worker", 2_000, (3000,), caller="worker_main"),
    # strdup (libc) must be pruned as an allocator frame: the leaf is copy_names.
    LeakSite(
        "copy_names",
        "strdup",
        "leaky-main",
        1_000,
        tuple(6 + 10 * k for k in range(10)),
        caller="main",
    ),
    # inline_alloc is always_inline: an inline frame inside via_inline.
    LeakSite("inline_alloc", "inline", "leaky-main", 5_000, (256,), caller="via_inline"),
    # static helper_internal_alloc in the stripped libhelper.so: no symbol covers it,
    # so the leaf must be "libhelper.so+0x<off>", never helper_public_a/_b.
    LeakSite(
        "",
        "helper",
        "leaky-main",
        3_000,
        (1000,),
        module="libhelper.so",
        caller="helper_public_a",
    ),
    LeakSite("recurse_alloc", "recurse", "leaky-main", 100, (512,), caller="recurse_alloc"),
)
LIBHELPER_EXPORTS = ("helper_public_a", "helper_public_b")
LEAKY_C_INUSE_BYTES = 19_952_608
LEAKY_C_INUSE_OBJECTS = 31_108
LEAKY_C_CHURN_BYTES = 50_000 * 4096  # malloc(4096)/free x 50,000 in churn()
LEAKY_C_CHURN_OBJECTS = 50_000
LEAKY_C_ALLOC_BYTES = LEAKY_C_INUSE_BYTES + LEAKY_C_CHURN_BYTES  # 224,752,608
LEAKY_C_ALLOC_OBJECTS = LEAKY_C_INUSE_OBJECTS + LEAKY_C_CHURN_OBJECTS  # 81,108
# Allocations by the runtime, not by leaky.c, measured with Debian 12: libstdc++'s
# emergency EH pool (81,920 B; libjemalloc.so.2 links libstdc++) and the worker
# thread's DTV (320 B). Tests allow up to this much on top of the program's truth.
RUNTIME_EXTRA_BYTES_MAX = 100 * 1024
RUNTIME_EXTRA_OBJECTS_MAX = 10

LEAKY_RECURSE_DEPTH = 40  # recurse_alloc activations on the recursion stack

# leaky.cpp: see the table at the top of programs/leaky.cpp.
LEAKY_CPP_INUSE_BYTES = 2_919_968
LEAKY_CPP_INUSE_OBJECTS = 5_002

# leaky.rs: see the table at the top of programs/leaky.rs.
LEAKY_RS_INUSE_BYTES = 867_072
LEAKY_RS_INUSE_OBJECTS = 1_501


def within(value: float, truth: float, rel: float) -> bool:
    """|value - truth| <= rel * truth."""
    return math.isclose(value, truth, rel_tol=rel, abs_tol=0.0)


HEAPSCOPE_CMD = (sys.executable, "-m", "heapscope.cli.main")
PROFILING_ENV = ("LD_PRELOAD", "MALLOC_CONF", "_RJEM_MALLOC_CONF")


def run_heapscope(*args: str, cache: Path | None = None, stdin: str | None = None,
                  cwd: Path | None = None, env: dict[str, str] | None = None,
                  timeout: float = 300, check: bool = False,
                  unprofiled: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real ``heapscope`` command line in a subprocess.

    ``cache`` becomes its HEAPSCOPE_CACHE_DIR; ``unprofiled`` removes LD_PRELOAD and
    MALLOC_CONF from the environment so heapscope itself is not profiled; ``check`` turns a
    non-zero exit into an assertion with its stderr. A traceback is always a failure.
    """
    full = dict(os.environ)
    if unprofiled:
        for key in PROFILING_ENV:
            full.pop(key, None)
    if cache is not None:
        full["HEAPSCOPE_CACHE_DIR"] = str(cache)
    full.update(env or {})
    p = subprocess.run([*HEAPSCOPE_CMD, *args], env=full, input=stdin, capture_output=True,
                       text=True, timeout=timeout, cwd=cwd)
    if check and p.returncode != 0:
        raise AssertionError(f"heapscope {' '.join(args)} failed ({p.returncode}):\n{p.stderr}")
    assert "Traceback" not in p.stderr, p.stderr
    return p


LEAKPROG_DIR = Path(__file__).resolve().parent / "leakprog"


def series_session(root: Path, compiler: Path) -> tuple[Path, dict[str, str]]:
    """A finished ``heapscope run`` session of ``leakprog/series.c`` (its ``cache`` scenario,
    20 steps of 40 ms, sampled every 4 KiB) in ``root``, and the environment heapscope's
    commands ran with (its own cache folder; no profiling or frame settings inherited)."""
    binary = build([LEAKPROG_DIR / "series.c"], root / "series",
                   ("-O1", "-g", "-fno-omit-frame-pointer", "-fno-optimize-sibling-calls"),
                   compiler=compiler, link_flags=["-ldl"])
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(root / "cache"))
    for key in (*PROFILING_ENV, "HEAPSCOPE_OWN", "HEAPSCOPE_ALLOC_FN"):
        env.pop(key, None)
    out = root / "session"
    p = subprocess.run([*HEAPSCOPE_CMD, "run", "-o", str(out), "--sample", "4k", "--",
                        str(binary), "--step-ms", "40", "cache", "20"],
                       env=env, capture_output=True, text=True, timeout=300, cwd=root)
    assert p.returncode == 0, p.stderr[-3000:]
    return out, env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server a test starts)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
