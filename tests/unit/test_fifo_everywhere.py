"""No name heapscope opens can make it wait forever: each test puts a FIFO (with no writer)
at exactly a path a command would read (a dump, a binary the dump maps, a debug file, a perf
map, a suppressions or config file, a session file, a cache entry) and runs the real command.
It must end, well within :data:`TIMEOUT` (a hang fails the test and is killed), with what a
user should get: a one-line error naming a FIFO given as the input, or the same report as
without the file when the FIFO stands where heapscope only looks for something."""

from __future__ import annotations

import contextlib
import gzip
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from heapscope.symbols.elf import ElfInfo

from .test_symbols_ahead import write_dump
from .test_symbols_support import (
    EXE_BASE,
    build_c,
    functions,
    mappings_for,
    need,
    return_address,
    run,
    split_debug,
)

# Generous: a loaded machine runs one of these commands in well under a few seconds, and
# a command blocked on a FIFO never ends.
TIMEOUT = 60.0
PID = 4242  # the pid in dump names (and perf map names)
NOT_REGULAR = "not a regular file (a FIFO, device or socket?)"


def bounded(argv: Sequence[str | Path], env: dict[str, str], stdin: str = ""
            ) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; fail the test if it hangs or prints a traceback."""
    words = [str(a) for a in argv]
    # A session of its own: on a hang, the whole group (an llvm-symbolizer it started
    # included) is killed, not only the command.
    proc = subprocess.Popen(words, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(stdin, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"hung (killed after {TIMEOUT:.0f} s): {' '.join(words)}")
    assert "Traceback" not in err, err
    return subprocess.CompletedProcess(words, proc.returncode, out, err)


def heapscope(*args: str | Path, env: dict[str, str], stdin: str = ""
              ) -> subprocess.CompletedProcess[str]:
    """Run the real command line, :func:`bounded`."""
    return bounded([sys.executable, "-m", "heapscope.cli.main", *args], env, stdin)


def fifo(path: Path) -> Path:
    """A FIFO at ``path`` (its folders made), replacing whatever was there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() or path.is_symlink():
        path.unlink()
    os.mkfifo(path)
    return path


class Built:
    """The fixture program, built once: with DWARF, and stripped beside its debug file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "dwarf").mkdir()
        self.prog = build_c("inline.c", root / "dwarf" / "prog", "-O1", "-g", "-fPIE", "-pie")
        (root / "split").mkdir()
        self.stripped = build_c("inline.c", root / "split" / "prog", "-O1", "-g", "-fPIE",
                                "-pie")
        self.debug = root / "split" / "prog.debug"
        split_debug(self.stripped, self.debug)  # debuglink "prog.debug"
        self.build_id = ElfInfo.read(str(self.stripped)).build_id
        # malloc called from inner_alloc (inlined into outer_alloc), called from main; the
        # stripped copy is the same code.
        self.stack = [EXE_BASE + return_address(self.prog, "outer_alloc", "malloc"),
                      EXE_BASE + return_address(self.prog, "main", "outer_alloc")]

    def dump(self, path: Path, binary: Path, mapped: str | None = None,
             extra: Sequence[int] = ()) -> Path:
        """A dump of ``binary`` (mapped under the name ``mapped``, by default its own) with
        the program's stack and the addresses ``extra`` as a stack of its own."""
        stacks = [self.stack] + ([list(extra)] if extra else [])
        return write_dump(path, stacks, mappings_for(binary, EXE_BASE, mapped))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    need("gcc", "llvm-symbolizer", "objdump", "objcopy", "strip")
    return Built(tmp_path_factory.mktemp("fifo-bin"))


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """heapscope's environment: a cache of this test's own, no debuginfod, no preload."""
    out = {k: v for k, v in os.environ.items()
           if k not in ("DEBUGINFOD_URLS", "LD_PRELOAD", "MALLOC_CONF", "HEAPSCOPE_SYMBOLIZER")}
    out["HEAPSCOPE_CACHE_DIR"] = str(tmp_path / "cache")
    return out


@pytest.fixture
def good(built: Built, tmp_path: Path) -> Path:
    """A readable dump of the program with DWARF."""
    return built.dump(tmp_path / "good" / f"jeprof.{PID + 1}.0.f.heap", built.prog)


def top_names(*args: str | Path, env: dict[str, str]) -> tuple[set[str], str]:
    """The names ``top --format json`` gives (it must succeed), and its stderr."""
    p = heapscope("top", "--format", "json", "-n", "0", *args, env=env)
    assert p.returncode == 0, p.stderr
    data: dict[str, Any] = json.loads(p.stdout)
    return {r["name"] for r in data["rows"]}, p.stderr


DWARF_NAMES = {"inner_alloc", "outer_alloc", "main"}  # inner_alloc: inlined, DWARF only


# ---------------------------------------------------------------------------- dumps


@pytest.mark.parametrize("name", [f"jeprof.{PID}.0.f.heap", "x.heap.gz", "x.heap.json.gz"])
def test_a_dump_that_is_a_fifo_is_a_one_line_error(name: str, tmp_path: Path,
                                                   env: dict[str, str]) -> None:
    dump = fifo(tmp_path / name)
    p = heapscope("top", dump, env=env)
    assert p.returncode == 3
    assert p.stderr.splitlines() == [f"heapscope: error: {dump}: {NOT_REGULAR}"]


@pytest.mark.parametrize("command", [
    ["leaks", "{fifo}"],
    ["diff", "{good}", "{fifo}"],
    ["diff", "{fifo}", "{good}"],
    ["top", "{good}", "--base", "{fifo}"],
    ["export", "{fifo}", "-o", "{out}/x.pb.gz"],
    ["flamegraph", "{fifo}", "-o", "{out}/x.html"],
    ["flamegraph", "{good}", "--base", "{fifo}", "-o", "{out}/x.html"],
    ["graph", "{fifo}", "-o", "{out}/x.dot"],
    ["shell", "{fifo}"],
], ids=lambda c: "-".join(w.strip("{}-").split("/")[-1] for w in c))
def test_every_command_refuses_a_fifo_given_as_a_dump(
        command: list[str], good: Path, tmp_path: Path, env: dict[str, str]) -> None:
    dump = fifo(tmp_path / f"jeprof.{PID}.0.f.heap")
    words = [w.format(fifo=dump, good=good, out=tmp_path) for w in command]
    p = heapscope(*words, env=env)
    assert p.returncode == 3, p.stderr
    assert p.stderr.splitlines() == [f"heapscope: error: {dump}: {NOT_REGULAR}"]


@pytest.mark.parametrize("command", [["leaks", "{dir}"],
                                     ["timeline", "{dir}", "-o", "{out}/t.html"]],
                         ids=lambda c: c[0])
def test_a_fifo_among_a_folders_dumps_is_left_out_with_a_note(
        command: list[str], built: Built, tmp_path: Path, env: dict[str, str]) -> None:
    folder = tmp_path / "dumps"
    built.dump(folder / f"jeprof.{PID}.0.i0.heap", built.prog)
    built.dump(folder / f"jeprof.{PID}.1.i1.heap", built.prog)
    bad = fifo(folder / f"jeprof.{PID}.2.f.heap")
    p = heapscope(*[w.format(dir=folder, out=tmp_path) for w in command], env=env)
    assert p.returncode == 0, p.stderr
    said = p.stdout if command[0] == "leaks" else (tmp_path / "t.html").read_text()
    assert f"dump left out (pid {PID}): {bad}: {NOT_REGULAR}" in said


def test_top_on_a_folder_whose_newest_dump_is_a_fifo(built: Built, tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    folder = tmp_path / "dumps"
    built.dump(folder / f"jeprof.{PID}.0.i0.heap", built.prog)
    bad = fifo(folder / f"jeprof.{PID}.1.f.heap")
    p = heapscope("top", folder, env=env)
    assert p.returncode == 3
    assert p.stderr.splitlines() == [f"heapscope: error: {bad}: {NOT_REGULAR}"]


# ------------------------------------------------------------------- binaries, debug files


def test_a_mapped_binary_that_is_a_fifo_is_not_found(built: Built, tmp_path: Path,
                                                     env: dict[str, str]) -> None:
    prog = fifo(tmp_path / "app" / "prog")
    dump = built.dump(tmp_path / "x.heap", built.prog, str(prog))
    names, err = top_names(dump, env=env)
    assert names and all(n.startswith("prog+0x") for n in names), names
    assert f"{prog} not found" in err


@pytest.mark.parametrize("option", ["--binary", "--sysroot", "--search-path"])
def test_a_binary_option_naming_a_fifo_is_passed_over(
        option: str, built: Built, tmp_path: Path, env: dict[str, str]) -> None:
    mapped = "/nonexistent/heapscope-test/prog"
    dump = built.dump(tmp_path / "x.heap", built.prog, mapped)
    if option == "--binary":
        where = fifo(tmp_path / "given" / "prog")
    elif option == "--sysroot":
        where = tmp_path / "root"
        fifo(where / mapped.lstrip("/"))
    else:
        where = tmp_path / "search"
        fifo(where / "prog")
    names, err = top_names(option, where, dump, env=env)
    assert names and all(n.startswith("prog+0x") for n in names), names
    assert "warning: prog:" in err


@pytest.mark.parametrize("where", ["beside", ".debug", "debug-dir", "debuginfod"])
def test_a_separate_debug_file_that_is_a_fifo_is_passed_over(
        where: str, built: Built, tmp_path: Path, env: dict[str, str]) -> None:
    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(built.stripped, app / "prog")
    dump = built.dump(tmp_path / "x.heap", app / "prog")
    args: list[str | Path] = []
    if where == "beside":  # .gnu_debuglink, next to the binary
        fifo(app / "prog.debug")
    elif where == ".debug":  # .gnu_debuglink, in .debug/ next to the binary
        fifo(app / ".debug" / "prog.debug")
    elif where == "debug-dir":
        bid = built.build_id
        fifo(tmp_path / "dbg" / ".build-id" / bid[:2] / f"{bid[2:]}.debug")
        args = ["--debug-dir", tmp_path / "dbg"]
    else:  # a debuginfod download in heapscope's cache; the server is not there
        fifo(Path(env["HEAPSCOPE_CACHE_DIR"]) / "debuginfod" / built.build_id / "debuginfo")
        env["DEBUGINFOD_URLS"] = "http://127.0.0.1:9"
    names, _ = top_names(*args, dump, env=env)
    assert names and not names & DWARF_NAMES, names  # no debug file: no DWARF names
    # With the real debug file beside the binary, the same command names the code from it.
    if where == "beside":
        (app / "prog.debug").unlink()
    shutil.copy(built.debug, app / "prog.debug")
    names, _ = top_names("--no-cache", *args, dump, env=env)
    assert names >= DWARF_NAMES


def with_debuglink(binary: Path, name: str) -> Path:
    """``binary`` given a .gnu_debuglink to ``name`` (beside it), with FIFOs wherever that
    name is looked for beside it (the folder, its .debug/)."""
    (binary.parent / name).write_bytes(b"x")  # objcopy takes the CRC of a real file
    run("objcopy", f"--add-gnu-debuglink={binary.parent / name}", binary)
    fifo(binary.parent / name)
    fifo(binary.parent / ".debug" / name)
    return binary


@pytest.mark.parametrize("dump_name", ["x.heap", "x.heap.gz"], ids=["ahead", "alone"])
def test_a_binary_with_dwarf_and_a_debuglink_naming_a_fifo(
        dump_name: str, built: Built, tmp_path: Path, env: dict[str, str]) -> None:
    # The binary has DWARF, so heapscope looks for no debug file; llvm-symbolizer, given the
    # binary's path, looked for its .gnu_debuglink file beside it and waited on the FIFO. A
    # plain .heap named on the command line gets its llvm-symbolizer started ahead, a
    # compressed one a process of the lookup's own: both are covered.
    app = tmp_path / "app"
    app.mkdir()
    prog = with_debuglink(Path(shutil.copy(built.prog, app / "prog")), "prog.dbg")
    dump = built.dump(tmp_path / "x.heap", prog)
    if dump_name.endswith(".gz"):
        dump = dump.rename(tmp_path / "x.heap.gz")
        dump.write_bytes(gzip.compress(dump.read_bytes()))
    names, err = top_names(dump, env=env)
    assert names >= DWARF_NAMES, err


def test_a_debuglink_leading_out_of_the_binarys_folder(
        built: Built, tmp_path: Path, env: dict[str, str]) -> None:
    # objcopy writes a base name only; a made-up "../" leads llvm-symbolizer out of whatever
    # folder it finds the binary in (to a FIFO, here), so it is not given such a binary.
    app = tmp_path / "app"
    app.mkdir()
    prog = Path(shutil.copy(built.prog, app / "prog"))
    section = tmp_path / "debuglink"
    section.write_bytes(b"../evil.dbg\0" + bytes(4))  # name, NUL, padding to 4, CRC
    run("objcopy", f"--add-section=.gnu_debuglink={section}", prog)
    fifo(tmp_path / "evil.dbg")  # where "../" leads from the binary's own folder
    env["TMPDIR"] = str(tmp_path / "tmp")  # and from the folders heapscope makes there
    fifo(tmp_path / "tmp" / "evil.dbg")
    names, err = top_names(built.dump(tmp_path / "x.heap", prog), env=env)
    assert names == {"outer_alloc", "main"}, err  # from the symbol table
    assert "names '../evil.dbg', outside the binary's folder; using the symbol table" in err


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead", "new"])
def test_one_symbolizer_run_for_several_binaries_with_fifos_beside_them(
        ahead: bool, built: Built, tmp_path: Path, env: dict[str, str]) -> None:
    # Modules with few addresses share an llvm-symbolizer run (the process started ahead
    # for the program, or a new one); each input line names its file.
    app = tmp_path / "app"
    app.mkdir()
    prog = with_debuglink(Path(shutil.copy(built.prog, app / "prog")), "prog.dbg")
    lib = with_debuglink(build_c("lib.c", app / "libsym.so", "-O1", "-g", "-fPIC", "-shared"),
                         "libsym.dbg")
    dump = built.dump(tmp_path / "x.heap", prog) if ahead else ""
    code = """if True:
        import json, sys
        from heapscope.symbols import ahead, llvm
        prog, lib, dump, a, b = sys.argv[1:]
        if dump:
            ahead.start_for_args([dump])
            assert llvm.ahead_paths() == [prog], llvm.ahead_paths()
        backend = llvm.LlvmSymbolizer()
        got = backend.lookup_many([(prog, [int(a)]), (lib, [int(b)])])
        assert backend.calls == 1 and not llvm.ahead_paths()
        print(json.dumps([[f.function for f in answer[0]] for answer in got]))
    """
    a = functions(prog)["outer_alloc"][0] + 1
    b = functions(lib)["lib_public_a"][0] + 1
    p = bounded([sys.executable, "-c", code, prog, lib, dump, a, b], env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [["outer_alloc"], ["lib_public_a"]]


@pytest.mark.parametrize("dwp", ["fifo", "regular"])
def test_the_dwp_beside_a_split_dwarf_binary(dwp: str, built: Built, tmp_path: Path,
                                             env: dict[str, str]) -> None:
    # llvm-symbolizer reads a split-DWARF binary's <path>.dwp; a FIFO there made it wait.
    # A real .dwp is still read (the .dwo files are gone here).
    tool = shutil.which("llvm-dwp") or shutil.which("dwp")
    if tool is None:
        pytest.skip("neither llvm-dwp nor dwp is installed")
    app = tmp_path / "app"
    app.mkdir()
    prog = build_c("inline.c", app / "prog", "-O1", "-g", "-gsplit-dwarf", "-fPIE", "-pie")
    if dwp == "fifo":
        fifo(app / "prog.dwp")  # the inline frame comes from the .dwo file then
    else:
        run(tool, "-e", prog, "-o", app / "prog.dwp")
        for dwo in app.glob("*.dwo"):
            dwo.unlink()
    names, err = top_names(built.dump(tmp_path / "x.heap", prog), env=env)
    assert names >= DWARF_NAMES, err


@contextlib.contextmanager
def debuginfod(body: bytes | None) -> Iterator[str]:
    """A debuginfod server on this machine answering every request with ``body`` (404 when
    None); its URL."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_remembered_debuginfod_miss_that_is_a_fifo(
        built: Built, tmp_path: Path, env: dict[str, str]) -> None:
    # Every server answers 404: the miss is remembered in the cache by touching a file,
    # which opened a FIFO there to write and waited for a reader.
    app = tmp_path / "app"
    app.mkdir()
    shutil.copy(built.stripped, app / "prog")  # no debug file anywhere
    miss = Path(env["HEAPSCOPE_CACHE_DIR"]) / "debuginfod" / built.build_id / ".miss"
    os.utime(fifo(miss), (0, 0))  # remembered long ago: the servers are asked again
    with debuginfod(None) as url:
        env["DEBUGINFOD_URLS"] = url
        names, _ = top_names(built.dump(tmp_path / "x.heap", app / "prog"), env=env)
    assert names and not names & DWARF_NAMES, names


def test_llvms_own_debuginfod_cache_entry_that_is_a_fifo(
        built: Built, tmp_path: Path, env: dict[str, str]) -> None:
    # llvm-symbolizer (14 and later) opens its own debuginfod cache's entry for the
    # build-id of every file it is given ($DEBUGINFOD_CACHE_PATH, else in the home folder,
    # the invoking user's under sudo). Its name is LLVM's business: one download makes it.
    cache = tmp_path / "llvm-debuginfod"
    with debuginfod(built.debug.read_bytes()) as url:
        bounded(["llvm-symbolizer", f"--obj={built.prog}", "0x1000"],
                {**env, "DEBUGINFOD_URLS": url, "DEBUGINFOD_CACHE_PATH": str(cache)})
    entries = [e for e in cache.glob("llvmcache-*") if e.name[len("llvmcache-"):].isdigit()]
    if not entries:
        pytest.skip("this llvm-symbolizer has no debuginfod client")
    for entry in entries:
        fifo(entry)
    env["DEBUGINFOD_CACHE_PATH"] = str(cache)
    names, err = top_names(built.dump(tmp_path / "x.heap", built.prog), env=env)
    assert names >= DWARF_NAMES, err


# ------------------------------------------------------------------ perf maps, other files


def test_a_perf_map_that_is_a_fifo_is_ignored(built: Built, tmp_path: Path,
                                              env: dict[str, str]) -> None:
    jit = 0x7F5500001000  # outside every mapping: named from a perf map, if any
    dump = built.dump(tmp_path / f"jeprof.{PID}.0.f.heap", built.prog, extra=[jit])
    perf = fifo(tmp_path / f"perf-{PID}.map")
    p = heapscope("top", "--format", "json", "-n", "0", "-v", dump, env=env)
    assert p.returncode == 0, p.stderr
    names = {r["name"] for r in json.loads(p.stdout)["rows"]}
    assert names == DWARF_NAMES | {f"[unknown]+{jit:#x}"}  # the JIT address stays unnamed
    assert f"perf-{PID}.map not found in {perf.parent}" in p.stderr


def test_a_suppressions_file_that_is_a_fifo(good: Path, tmp_path: Path,
                                            env: dict[str, str]) -> None:
    supp = fifo(tmp_path / "lsan.supp")
    p = heapscope("leaks", "--suppressions", supp, good, env=env)
    assert p.returncode == 3
    assert p.stderr.splitlines() == [f"heapscope: error: {supp}: cannot read: not a regular "
                                     "file"]


def test_an_agent_config_that_is_a_fifo(tmp_path: Path, env: dict[str, str]) -> None:
    config = fifo(tmp_path / "agent.toml")
    p = heapscope("agent", "--config", config, env=env)
    assert p.returncode == 3
    assert p.stderr.splitlines() == [f"heapscope: error: {config}: not a regular file"]


def _session(built: Built, folder: Path) -> Path:
    """A minimal session folder: a manifest and two dumps of one process."""
    (folder / "dumps").mkdir(parents=True)
    (folder / "symbolized").mkdir()
    (folder / "manifest.json").write_text(json.dumps({
        "format": "heapscope-session", "version": 1, "command": ["prog"], "pid": PID,
        "start_time": 1.0, "end_time": 2.0,
        "processes": [{"pid": PID, "exe": str(built.prog)}]}))
    built.dump(folder / "dumps" / f"jeprof.{PID}.0.i0.heap", built.prog)
    built.dump(folder / "dumps" / f"jeprof.{PID}.1.f.heap", built.prog)
    return folder


@pytest.mark.parametrize("name", ["rss.csv", "report.json", "jemalloc.log",
                                  "leak-summaries.txt", "manifest.json"])
@pytest.mark.parametrize("command", [["leaks", "{s}"], ["timeline", "{s}", "-o", "{out}"],
                                     ["top", "{s}"]], ids=lambda c: c[0])
def test_session_files_that_are_fifos(name: str, command: list[str], built: Built,
                                      tmp_path: Path, env: dict[str, str]) -> None:
    session = _session(built, tmp_path / "session")
    fifo(session / name)
    out = tmp_path / "t.html"
    p = heapscope(*[w.format(s=session, out=out) for w in command], env=env)
    assert p.returncode == 0, p.stderr
    if command[0] == "timeline" and name == "rss.csv":
        assert "rss.csv is not a regular file: RSS is not shown" in out.read_text()


def test_the_jemalloc_log_of_a_run_that_is_a_fifo(tmp_path: Path, env: dict[str, str]
                                                  ) -> None:
    # Read by `heapscope run` when the program has ended.
    log = fifo(tmp_path / "jemalloc.log")
    code = ("import sys; from heapscope.capture.helper import read_log; "
            "print(read_log(sys.argv[1]))")
    p = bounded([sys.executable, "-c", code, log], env)
    assert (p.returncode, p.stdout, p.stderr) == (0, "[]\n", "")


def test_agent_pidfile_and_dumps_folder_with_fifos(built: Built, tmp_path: Path,
                                                  env: dict[str, str]) -> None:
    dumps = tmp_path / "dumps"
    built.dump(dumps / f"jeprof.{PID}.0.i0.heap", built.prog)
    fifo(dumps / f"jeprof.{PID}.1.i1.heap")
    pidfile = fifo(tmp_path / "app.pid")
    with socket.socket() as s:  # a free port (for the one round, /metrics is not read)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = heapscope("agent", "--rounds", "1", "--every", "1", "--dumps", dumps, "--pidfile",
                  pidfile, "--listen", f"127.0.0.1:{port}", "--state", tmp_path / "state",
                  env=env)
    assert p.returncode == 0, p.stderr


# ---------------------------------------------------------------------------- caches


@pytest.mark.parametrize("command", [
    ["top", "--format", "json", "-n", "0", "{d}"],
    ["leaks", "--format", "json", "{d1}", "{d}"],
    ["export", "--format", "json", "-o", "-", "{d}"],
], ids=lambda c: c[0])
def test_cache_entries_that_are_fifos(command: list[str], built: Built, tmp_path: Path,
                                      env: dict[str, str]) -> None:
    d1 = built.dump(tmp_path / f"jeprof.{PID}.0.i0.heap", built.prog)
    d = built.dump(tmp_path / f"jeprof.{PID}.1.f.heap", built.prog)
    words = [w.format(d=d, d1=d1) for w in command]
    first = heapscope(*words, env=env)
    assert first.returncode == 0, first.stderr
    cache = Path(env["HEAPSCOPE_CACHE_DIR"])
    entries = [p for p in cache.rglob("*") if p.is_file()]
    assert entries
    for entry in entries:
        fifo(entry)
    again = heapscope(*words, env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
