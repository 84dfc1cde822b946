"""The site of a leak is the program's own line, whatever library allocated for it.

Real programs compiled here from ``sites/`` (C++17 at -O2 through the standard containers,
Rust through Vec/String/format!/Box/HashMap/Arc on the system allocator, C through libxml2,
libcrypto, libsqlite3 and zlib, C with its own malloc wrapper) and a script under Debian's
``python3.11d`` (full DWARF) are run with every allocation sampled; see
:mod:`sitecheck` for what is asserted. The Rust program under the ``_rjem_`` jemalloc is
checked in ``test_run_rust.py`` (it shares that file's cargo build).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import jemalloc as je
import pytest
import sitecheck as sc

pytestmark = pytest.mark.e2e

SITES = Path(__file__).resolve().parent / "sites"
WRAPPER_NAMES = re.compile(r"PyMem_|PyObject_(?:Malloc|Calloc|Realloc)|_PyMem_Debug|pymalloc_"
                           r"|checked_alloc|^operator new|^malloc$|^calloc$")

# Hand counts from the tables in the sources' headers (jemalloc size classes).
CPP_LEAKS = [
    sc.Leak("registry", r"^store::Registry<.*>::insert$", 2000 * (8192 + 2048 + 128),
            end="registry-end"),
    sc.Leak("blobs", r"^load_blobs$", 1500 * 16384),
    sc.Leak("names", r"^collect_names$", 3000 * 4096),
    sc.Leak("tree", r"^fill_tree$", 2500 * 3072),
    sc.Leak("hash", r"^fill_hash$", 2000 * 5120),
    sc.Leak("shared", r"^make_shared_parts$", 1000 * 10240),
    sc.Leak("unique", r"^make_unique_parts$", 1200 * 6144),
    sc.Leak("lambda", r"^run_lambda\(int\)::\{lambda", 1000 * 12288),
]
WRAPPER_LEAKS = [
    sc.Leak("header", r"^parse_header$", 2000 * 4096),
    sc.Leak("body", r"^parse_body$", 500 * 32768),
    sc.Leak("trailer", r"^parse_trailer$", 3000 * 1024),
    sc.Leak("record", r"^make_record$", 1000 * 2048),
]
THIRD_PARTY = {"xml": r"^keep_documents$", "cipher": r"^open_ciphers$",
               "mprintf": r"^format_messages$", "zlib": r"^start_streams$"}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sites").resolve()


@pytest.fixture(scope="module")
def cache(work: Path) -> Path:
    return work / "cache"


def _build(argv: list[str | Path], cwd: Path) -> None:
    p = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                       timeout=600)
    if p.returncode != 0:
        raise je.BuildError(f"{' '.join(map(str, argv))} failed:\n{p.stderr[-4000:]}")


def _run(work: Path, cache: Path, name: str, argv: list[str | Path],
         *options: str) -> sc.Session:
    return sc.run(argv, work / f"session-{name}", cache, cwd=work, options=options)


@pytest.fixture(scope="module")
def cpp_session(work: Path, cache: Path, gxx: Path, libjemalloc: Path) -> sc.Session:
    _build([gxx, "-std=c++17", "-O2", "-g", SITES / "containers.cpp", "-o", "containers"], work)
    return _run(work, cache, "cpp", ["./containers"])


def test_cpp_containers_name_the_users_line(cpp_session: sc.Session, cache: Path) -> None:
    sc.check_session(cpp_session, SITES / "containers.cpp", CPP_LEAKS, cache)
    # The registry line leaks through a map node, a vector and a string: the vector is its
    # biggest path, shown as what the line called.
    reg = next(x for x in cpp_session.suspects() if "Registry" in x["function"])
    assert reg["via"] and reg["via"][-1]["kind"] == "library", reg
    assert reg["via"][-1]["function"].startswith("std::"), reg
    assert reg["leaf"].startswith("std::"), reg


def test_raw_frames_bring_back_the_library_leaf(cpp_session: sc.Session, cache: Path) -> None:
    rows = [r for r in sc.top_rows(cpp_session.path, cache, "--frames", "raw")
            if r["flat"] > 0]
    assert rows[0]["name"].startswith("std::"), rows[:3]
    assert all(r["via"] == [] for r in rows), rows[:3]


@pytest.fixture(scope="module")
def rust_session(work: Path, cache: Path, rustc: Path, libjemalloc: Path) -> sc.Session:
    _build([rustc, "-g", "-C", "opt-level=2", SITES / "collections.rs", "-o", "collections"],
           work)
    return _run(work, cache, "rust", ["./collections"])


def test_rust_collections_name_the_users_line(rust_session: sc.Session, cache: Path) -> None:
    sc.check_session(rust_session, SITES / "leaks.rs", sc.RUST_LEAKS, cache)
    text = next(x for x in rust_session.suspects() if x["function"].endswith("collect_text"))
    assert text["via"], text


@pytest.fixture(scope="module")
def thirdparty_session(work: Path, cache: Path, gcc: Path, libjemalloc: Path) -> sc.Session:
    pkg = shutil.which("pkg-config")
    if pkg is None:
        pytest.skip("pkg-config not found: apt-get install pkg-config")
    flags = subprocess.run([pkg, "--cflags", "--libs", "libxml-2.0"], capture_output=True,
                           text=True, check=False)
    if flags.returncode != 0:
        pytest.skip("libxml2 headers not found: apt-get install libxml2-dev")
    _build([gcc, "-O2", "-g", SITES / "thirdparty.c", "-o", "thirdparty", *flags.stdout.split(),
            "-lssl", "-lcrypto", "-lsqlite3", "-lz", "-ldl"], work)
    return _run(work, cache, "thirdparty", ["./thirdparty"])


def test_third_party_libraries_fold_into_their_caller(thirdparty_session: sc.Session,
                                                      cache: Path) -> None:
    s = thirdparty_session
    truth = sc.truths(s.proc.stdout)
    assert set(truth) == set(THIRD_PARTY), s.proc.stdout
    leaks = [sc.Leak(tag, fn, truth[tag]) for tag, fn in THIRD_PARTY.items()]
    sc.check_session(s, SITES / "thirdparty.c", leaks, cache)
    docs = next(x for x in s.suspects() if x["function"] == "keep_documents")
    assert docs["via"][-1]["function"] == "xmlReadMemory", docs
    assert {v["kind"] for v in docs["via"]} == {"dependency"}, docs


def test_own_makes_a_library_the_site(thirdparty_session: sc.Session, cache: Path) -> None:
    rows = [r for r in sc.top_rows(thirdparty_session.path, cache, "--own", "libxml2")
            if r["flat"] > 0]
    xml = [r for r in rows if r["module"].startswith("libxml2")]
    assert xml and not any(r["name"] == "keep_documents" for r in rows), rows[:6]


@pytest.fixture(scope="module")
def wrapper_session(work: Path, cache: Path, gcc: Path, libjemalloc: Path) -> sc.Session:
    _build([gcc, "-O2", "-g", SITES / "wrapper.c", "-o", "wrapper"], work)
    return _run(work, cache, "wrapper", ["./wrapper"], "-v")


def test_own_wrapper_folds_into_its_callers(wrapper_session: sc.Session, cache: Path) -> None:
    s = wrapper_session
    sc.check_session(s, SITES / "wrapper.c", WRAPPER_LEAKS, cache)
    assert not any(x["function"] == "checked_alloc" for x in s.suspects()), s.describe()
    assert {"function": "checked_alloc", "why": "profile", "callers": 3} in \
        s.report["wrappers"], s.report["wrappers"]
    assert "folded as allocation wrappers: checked_alloc (3 callers)" in s.proc.stderr
    body = next(x for x in s.suspects() if x["function"] == "parse_body")
    assert [(v["function"], v["kind"]) for v in body["via"]] == [("checked_alloc", "wrapper")]
    record = next(x for x in s.suspects() if x["function"] == "make_record")
    assert record["via"] == [], record


PY_SCRIPT = """\
import ctypes, os
jemalloc = ctypes.CDLL(None)
counters = []
for name in (b"thread.allocatedp", b"thread.deallocatedp"):
    p = ctypes.POINTER(ctypes.c_uint64)()
    n = ctypes.c_size_t(ctypes.sizeof(p))
    assert jemalloc.mallctl(name, ctypes.byref(p), ctypes.byref(n), None, ctypes.c_size_t(0)) == 0
    counters.append(p)
def live():
    return counters[0][0] - counters[1][0]
print(f"pid={os.getpid()}", flush=True)
keep = [None] * 400
before = live()
for i in range(400):
    keep[i] = bytes(100_000)
print(f"truth bytes {live() - before}", flush=True)
# Dump now and leave without the interpreter's teardown (which frees everything).
assert jemalloc.mallctl(b"prof.dump", None, None, None, ctypes.c_size_t(0)) == 0
os._exit(0)
"""


def test_python_debug_interpreter_sites(work: Path, cache: Path, libjemalloc: Path) -> None:
    python = shutil.which("python3.11d")
    if python is None:
        pytest.skip("python3.11d not found: apt-get install python3.11-dbg")
    (work / "bytes_leak.py").write_text(PY_SCRIPT)
    s = _run(work, cache, "python", [python, "bytes_leak.py"])
    assert s.proc.returncode == 0, s.describe()
    truth = sc.truths(s.proc.stdout)["bytes"]
    head = s.suspects()[0]
    # bytes(n) is allocated by _PyBytes_FromSize (Objects/bytesobject.c) through
    # PyObject_Calloc and the debug build's _PyMem_Debug* hooks: the site is the former.
    assert head["function"] == "_PyBytes_FromSize", s.describe()
    assert head["file"].endswith("Objects/bytesobject.c"), s.describe()
    assert abs(head["bytes"] - truth) <= sc.TOLERANCE * truth, (head["bytes"], truth)
    assert any(v["kind"] == "wrapper" for v in head["via"]), head
    assert not any(WRAPPER_NAMES.search(x["function"]) for x in s.suspects()[:10]), \
        s.describe()
    rows = [r for r in sc.top_rows(s.path, cache) if r["flat"] > 0]
    assert rows[0]["name"] == "_PyBytes_FromSize", rows[:3]
    assert not any(WRAPPER_NAMES.search(r["name"]) for r in rows[:10]), rows[:10]


@pytest.mark.parametrize("tags", ["--enable-new-dtags", "--disable-new-dtags"])
def test_runpath_read_from_a_real_binary(work: Path, gcc: Path, tags: str) -> None:
    """The folders a program's RUNPATH (or old-style RPATH) names are where its own
    libraries live; $ORIGIN is the binary's folder."""
    from heapscope.symbols.elf import search_path

    (work / "bin").mkdir(exist_ok=True)
    out = work / "bin" / f"rp{tags}"
    _build([gcc, "-O1", SITES / "wrapper.c", "-o", out,
            f"-Wl,{tags},-rpath,$ORIGIN/../lib/myapp:/opt/vendor/lib"], work)
    assert search_path(str(out)) == (str(work / "lib" / "myapp"), "/opt/vendor/lib")
    assert search_path(str(SITES / "wrapper.c")) == ()
