"""The DWARF backend: batch ``llvm-symbolizer`` processes.

Starting a process costs ~40-55 ms, so all of a module's addresses go through one process on
stdin (20,000 addresses of a 31 MB binary take about 2 s), and modules with few addresses
share one (:meth:`LlvmSymbolizer.lookup_many`). Names are requested raw
(``--no-demangle --functions=linkage``) and demangled by :mod:`heapscope.symbols.demangle`,
because LLVM 14 leaves Rust legacy names and some C++ names mangled.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import shutil
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO, NamedTuple, Protocol

from heapscope.errors import ToolError
from heapscope.files import open_regular
from heapscope.units import plural

ENV_VAR = "HEAPSCOPE_SYMBOLIZER"
INSTALL_HINT = (
    "install it with `apt-get install llvm` (or `dnf install llvm`, `brew install llvm`), "
    f"or point {ENV_VAR} at an llvm-symbolizer binary"
)
_UNKNOWN = ("", "??")


class RawFrame(NamedTuple):
    """One frame as the backend reports it: raw (mangled) function name, file and line.

    ``line`` 0 and ``file`` "" mean the backend found no line information. A NamedTuple (not
    a dataclass) because tens of thousands are built and hashed on every run.
    """

    function: str
    file: str = ""
    line: int = 0


class BackendError(Exception):
    """The backend could not read the object file at all (so fall back to the symbol table)."""


class Backend(Protocol):
    """Something that resolves ELF virtual addresses of one file to inline chains."""

    def lookup(self, path: str, vaddrs: Sequence[int]) -> list[list[RawFrame]]:
        """Per address, its frames innermost first (empty when nothing is known)."""
        ...


def find_symbolizer() -> str:
    """The llvm-symbolizer to run: ``$HEAPSCOPE_SYMBOLIZER``, else the first one on PATH."""
    env = os.environ.get(ENV_VAR)
    if env:
        found = shutil.which(env)
        if found is None:
            raise ToolError(f"{ENV_VAR}={env}: no such executable; {INSTALL_HINT}")
        return found
    # Debian/Ubuntu install versioned names (llvm-symbolizer-15) when several LLVMs coexist.
    for name in ["llvm-symbolizer", *(f"llvm-symbolizer-{v}" for v in range(20, 10, -1))]:
        found = shutil.which(name)
        if found is not None:
            return found
    raise ToolError(f"llvm-symbolizer not found; {INSTALL_HINT}")


# How every llvm-symbolizer run is asked: JSON answers, inline chains, raw names.
FLAGS = ("--output-style=JSON", "--inlines", "--no-demangle", "--functions=linkage")


class _Objects:
    """The names one llvm-symbolizer process reads object files by: a link per file in a
    private folder of its own.

    LLVM also opens files it finds from the one it is given: beside it, the file its
    ``.gnu_debuglink`` names and ``<path>.dwp``; in its debuginfod cache, the entry for
    its build-id. Another user may have made a FIFO at such a name (beside a file in /tmp
    that a dump maps; in their home, where the cache is under sudo), and LLVM's open of it
    waits forever. Beside a link in this folder it finds only what is put there (the
    ``.dwp`` when that is a regular file); a debuglink that leads out of the folder is
    refused (:func:`_check_debuglink`); the debuginfod cache is this folder too
    (:meth:`env`). A file known before the process starts is linked to the descriptor the
    process inherits (``/proc/self/fd/N``): the very file opened here as a regular file,
    whatever is put at its path meanwhile. One named later, to a process started ahead, is
    linked to its path, checked to be a regular file just before.
    """

    __slots__ = ("files", "folder", "links", "names")

    def __init__(self) -> None:
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="heapscope-objects-")
        self.names: dict[str, str] = {}  # a file's path -> the name LLVM reads it by
        self.links: list[str] = []  # everything made in the folder
        self.files: list[BinaryIO] = []  # open until the process has inherited them

    def name(self, path: str, inherit: bool = True) -> str:
        """The name to give LLVM for ``path`` (quotable on an input line when the folder's
        path is); OSError (:class:`heapscope.files.NotRegularFile` for a FIFO) when it is
        not a regular ELF file LLVM may be given. ``inherit``: the process is yet to be
        started with :attr:`fds`."""
        got = self.names.get(path)
        if got is None:
            got = os.path.join(self.folder, str(len(self.names)))
            self._link(path, got, inherit, check=True)
            with contextlib.suppress(OSError):  # none, or not a regular file: LLVM sees none
                self._link(path + ".dwp", got + ".dwp", inherit, check=False)
            self.names[path] = got
        return got

    def _link(self, path: str, link: str, inherit: bool, check: bool) -> None:
        f = open_regular(path)
        try:
            if check:
                _check_debuglink(f, path)
            # fd 0-2 of the process are its own pipes, whatever this side's numbers are.
            if inherit and f.fileno() > 2 and os.path.isdir("/proc/self/fd"):
                os.symlink(f"/proc/self/fd/{f.fileno()}", link)
                self.files.append(f)
            else:
                os.symlink(os.path.abspath(path), link)
                f.close()
        except BaseException:
            f.close()
            raise
        self.links.append(link)

    @property
    def fds(self) -> tuple[int, ...]:
        """The descriptors the process must inherit (``pass_fds``)."""
        return tuple(f.fileno() for f in self.files)

    def env(self) -> dict[str, str]:
        """The process's environment. LLVM's debuginfod client looks into its cache (in the
        user's home, even under sudo) for every file: that cache is this folder instead,
        which holds none. It asks no server either: heapscope asks them itself, within its
        own timeout, and the debug file found is what LLVM is given."""
        env = dict(os.environ)
        env.pop("DEBUGINFOD_URLS", None)
        env["DEBUGINFOD_CACHE_PATH"] = self.folder
        return env

    def started(self) -> None:
        """Close this side's descriptors: the process has its own."""
        for f in self.files:
            f.close()
        self.files.clear()

    def remove(self) -> None:
        """Remove the folder (the process has ended)."""
        self.started()
        with contextlib.suppress(OSError):
            for link in self.links:
                os.unlink(link)
            os.rmdir(self.folder)
        self.links.clear()


def _check_debuglink(f: BinaryIO, path: str) -> None:
    """OSError unless ``f`` is an ELF file whose .gnu_debuglink names nothing outside the
    folder it is linked in: LLVM appends the name to that folder as it is, and ``..`` in it
    would lead anywhere (to a FIFO, say)."""
    from heapscope.symbols.elfread import SHF_COMPRESSED, ElfError, ElfHeaders

    try:
        elf = ElfHeaders(f, path)
        if elf.sections_truncated:  # a debuglink could be among the sections not read
            raise OSError("corrupt ELF file (truncated section header table)")
        for sec in elf.sections:
            # LLVM takes any section called so, leading dots and underscores aside, and
            # reads its bytes as they are.
            if sec.name.lstrip("._") != "gnu_debuglink" or not sec.has_data:
                continue
            if sec.sh_flags & SHF_COMPRESSED:
                raise OSError(f"its {sec.name} section is compressed")
            name = elf.data(sec).split(b"\0", 1)[0]
            if b".." in name.split(b"/"):
                raise OSError(f"its {sec.name} names {name.decode('utf-8', 'replace')!r}, "
                              "outside the binary's folder")
    except ElfError as exc:  # "PATH: what is wrong"
        raise OSError(str(exc).removeprefix(f"{path}: ")) from exc


class Ahead:
    """An llvm-symbolizer process started before its addresses are known, for one file.

    It was sent one address of the file (the priming line), so LLVM has loaded itself and
    read the file's DWARF index by the time the real lookup comes; :meth:`finish` sends the
    lookup's lines and returns the answers after the priming one. Input lines name the file
    (``"name" 0xADDR``, the name :meth:`name` gives), so the process is started without
    ``--obj``.
    """

    __slots__ = ("answers", "executable", "objects", "path", "proc")

    def __init__(self, executable: str, path: str, vaddr: int) -> None:
        import subprocess
        import tempfile

        self.executable = executable
        self.path = path
        self.objects = _Objects()
        try:
            primed = self.objects.name(path)
            # Answers go to a file for the reason given in _run.
            self.answers = tempfile.TemporaryFile()  # noqa: SIM115 (closed by finish/stop)
        except OSError:
            self.objects.remove()
            raise
        try:
            self.proc = subprocess.Popen(
                [executable, *FLAGS], stdin=subprocess.PIPE, stdout=self.answers,
                stderr=subprocess.PIPE, text=True, errors="surrogateescape",
                pass_fds=self.objects.fds, env=self.objects.env())
        except OSError:
            self.answers.close()
            self.objects.remove()
            raise
        self.objects.started()
        stdin = self.proc.stdin
        assert stdin is not None  # stdin=PIPE
        try:
            stdin.write(f'"{primed}" {vaddr:#x}\n')
            stdin.flush()
        except OSError:
            self.stop()
            raise

    def name(self, path: str) -> str:
        """The name of ``path`` on this process's input lines; OSError when it is not a
        regular file."""
        return self.objects.name(path, inherit=False)

    def finish(self, lines: str) -> tuple[int, str, str] | None:
        """Send ``lines`` (each naming a file by :meth:`name`), wait for the process; its
        exit status, the answers after the priming one, and stderr. None when the process
        cannot take them (it went away): the caller then starts one of its own."""
        try:
            _, stderr = self.proc.communicate(lines)
        except OSError:
            self.stop()
            return None
        finally:
            self.objects.remove()
        with self.answers:
            self.answers.seek(0)
            stdout = _decoded(self.answers.read())
        head, newline, rest = stdout.partition("\n")
        if not newline or not head.strip():
            return None  # no priming answer: the process died before it answered
        return self.proc.returncode, rest, stderr

    def stop(self) -> None:
        """End a process nobody needs."""
        self.proc.kill()
        self.proc.communicate()
        self.answers.close()
        self.objects.remove()


# Processes started ahead (:mod:`heapscope.symbols.ahead`), by the file each was primed for.
_ahead: dict[str, Ahead] = {}


def start_ahead(executable: str, path: str, vaddr: int) -> None:
    """Start llvm-symbolizer for ``path`` now, primed with ``vaddr``; the first lookup of
    ``path`` with the same executable takes it. ``path`` must be quotable on an input line
    (no double quote, no line end)."""
    if path not in _ahead:
        _ahead[path] = Ahead(executable, path, vaddr)


def ahead_paths() -> list[str]:
    """The files that have a process started ahead and not taken yet."""
    return list(_ahead)


def _take_ahead(executable: str, paths: Sequence[str]) -> Ahead | None:
    """The process started ahead for one of ``paths`` with ``executable``, now taken."""
    for path in paths:
        ahead = _ahead.get(path)
        # pop, not del: two threads may race for it; only one gets it
        if (ahead is not None and ahead.executable == executable
                and _ahead.pop(path, None) is ahead):
            return ahead
    return None


def discard_ahead() -> None:
    """Stop every process started ahead that no lookup took."""
    while _ahead:
        _, ahead = _ahead.popitem()
        ahead.stop()


class LlvmSymbolizer:
    """:class:`Backend` running ``llvm-symbolizer --output-style=JSON`` once per lookup call."""

    def __init__(self, executable: str | None = None) -> None:
        self._executable = executable
        self.calls = 0  # processes started, for tests and timing reports

    @property
    def executable(self) -> str:
        """The llvm-symbolizer binary, found on first use (so a profile without DWARF never
        needs one installed)."""
        if self._executable is None:
            self._executable = find_symbolizer()
        return self._executable

    def lookup(self, path: str, vaddrs: Sequence[int]) -> list[list[RawFrame]]:
        """Resolve ``vaddrs`` (ELF virtual addresses) of the object ``path`` in one process."""
        if not vaddrs:
            return []
        returncode, stdout, stderr = self._run_lookup([(path, vaddrs)], alone=True)
        if returncode != 0:
            detail = stderr.strip().splitlines()[-1:] or [f"exit status {returncode}"]
            raise BackendError(f"llvm-symbolizer failed on {path}: {detail[0]}")
        # One answer per "\n"-ended line: LLVM writes U+2028 and U+0085 in paths unescaped,
        # which str.splitlines would take for line ends too.
        lines = [ln for ln in stdout.split("\n") if ln.strip()]
        if len(lines) != len(vaddrs):
            raise BackendError(
                f"llvm-symbolizer gave {plural(len(lines), 'answer')} for "
                f"{plural(len(vaddrs), 'address')} of {path}"
            )
        # Our input lines are always valid, so an error is about the object file.
        got = _answers(path, lines)
        if isinstance(got, BackendError):
            raise got
        return got


    def lookup_many(self, requests: Sequence[tuple[str, Sequence[int]]]
                    ) -> list[list[list[RawFrame]] | BackendError]:
        """Resolve the addresses of several objects in one process (each input line names its
        object): one start-up instead of one per object. Per object, its answers or why it
        could not be read. Objects whose path cannot be written on such a line (a double
        quote or a line end in it), objects LLVM must not be given (:class:`_Refused`) and
        runs that fail as a whole go one by one."""
        quotable = [not any(c in path for c in '"\n\r') for path, _ in requests]
        todo = [(k, path, vaddrs) for k, ((path, vaddrs), ok)
                in enumerate(zip(requests, quotable, strict=True)) if ok and vaddrs]
        answers: dict[int, list[list[RawFrame]] | BackendError] = {}
        while len(todo) > 1:
            try:
                returncode, stdout, _stderr = self._run_lookup(
                    [(path, vaddrs) for _, path, vaddrs in todo], alone=False)
            except _Refused as exc:
                # That file goes alone below (and is refused there); the others still share.
                todo = [t for t in todo if t[1] != exc.path]
                continue
            lines = [ln for ln in stdout.split("\n") if ln.strip()]
            if returncode == 0 and len(lines) == sum(len(v) for *_, v in todo):
                at = 0
                for k, path, vaddrs in todo:
                    answers[k] = _answers(path, lines[at:at + len(vaddrs)])
                    at += len(vaddrs)
            break
        out: list[list[list[RawFrame]] | BackendError] = []
        for k, (path, vaddrs) in enumerate(requests):
            got = answers.get(k)
            if got is None:  # alone: not quotable, no addresses, or the shared run failed
                try:
                    got = self.lookup(path, vaddrs)
                except BackendError as exc:
                    got = exc
            out.append(got)
        return out


    def _run_lookup(self, requests: Sequence[tuple[str, Sequence[int]]], alone: bool
                    ) -> tuple[int, str, str]:
        """One llvm-symbolizer run for the vaddrs of each file of ``requests``: the process
        started ahead for one of the files when there is one, else a new process (given the
        one file with ``--obj`` when ``alone``); its exit status, stdout and stderr.
        :class:`_Refused` for a file LLVM must not be given (:class:`_Objects`)."""
        ran = None
        ahead = _take_ahead(self.executable, [path for path, _ in requests])
        if ahead is not None:
            try:
                lines = _lines(requests, ahead.name)
            except OSError:
                ahead.stop()  # a file LLVM must not be given: the new run below says which
            else:
                ran = ahead.finish(lines)
        if ran is None:
            try:
                objects = _Objects()
            except OSError as exc:
                raise ToolError(f"cannot run {self.executable}: no private folder for its "
                                f"input files ({exc})") from exc
            try:
                names = {}
                for path, _ in requests:
                    try:
                        names[path] = objects.name(path)
                    except OSError as exc:
                        raise _Refused(path, exc.strerror or str(exc)) from exc
                if alone:
                    ((path, vaddrs),) = requests
                    cmd = [self.executable, f"--obj={names[path]}", *FLAGS]
                    stdin = "".join(f"{v:#x}\n" for v in vaddrs)
                else:
                    cmd = [self.executable, *FLAGS]
                    stdin = _lines(requests, names.__getitem__)
                try:
                    ran = _run(cmd, stdin, objects.fds, objects.env())
                except OSError as exc:
                    raise ToolError(f"cannot run {self.executable}: {exc}; "
                                    f"{INSTALL_HINT}") from exc
            finally:
                objects.remove()
        self.calls += 1
        return ran


class _Refused(BackendError):
    """A file llvm-symbolizer is not given: not a regular file (any more), or an ELF file
    that would lead it to open others outside its folder."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"llvm-symbolizer cannot read {path}: {why}")
        self.path = path


def _lines(requests: Sequence[tuple[str, Sequence[int]]], name: Callable[[str], str]) -> str:
    """Input lines asking for the vaddrs of each file of ``requests``, a file being called
    ``name(path)`` on them."""
    out = []
    for path, vaddrs in requests:
        called = name(path)
        out += [f'"{called}" {v:#x}\n' for v in vaddrs]
    return "".join(out)


def _answers(path: str, lines: list[str]) -> list[list[RawFrame]] | BackendError:
    """One object's frames from its answer lines, or the error that its file cannot be read
    (LLVM says so on the first address and answers "no symbol" after that)."""
    out: list[list[RawFrame]] = []
    for ln in lines:
        frames, failed = _parse_answer(ln)
        if failed:
            return BackendError(f"llvm-symbolizer cannot read {path}: {_first_error(ln)}")
        out.append(frames)
    return out


def _run(cmd: list[str], stdin: str, fds: tuple[int, ...] = (),
         env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``cmd`` with ``stdin`` (and the descriptors ``fds``, in ``env``); its exit status,
    stdout and stderr (text, as ``text=True`` with surrogateescape would give them)."""
    # The answers go to a temporary file, not a pipe: llvm-symbolizer flushes after every
    # answer, and 8,000 small pipe writes, each waking the reader, took 0.30 s where the
    # same run writing a file takes 0.17 s.
    # Imported here: a run whose frames are all cached starts no process.
    import subprocess
    import tempfile

    try:
        answers = tempfile.TemporaryFile()  # noqa: SIM115 (closed by the `with` below)
    except OSError:
        # No writable temporary folder: a pipe works too, only slower.
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True,
                              errors="surrogateescape", check=False, pass_fds=fds, env=env)
        return proc.returncode, proc.stdout, proc.stderr
    with answers:
        proc = subprocess.run(cmd, input=stdin, stdout=answers, stderr=subprocess.PIPE,
                              text=True, errors="surrogateescape", check=False, pass_fds=fds,
                              env=env)
        answers.seek(0)
        stdout = _decoded(answers.read())
    return proc.returncode, stdout, proc.stderr


def _decoded(data: bytes) -> str:
    """Answers decoded exactly as subprocess decodes a text pipe: the locale's encoding,
    universal newlines."""
    return io.TextIOWrapper(io.BytesIO(data), errors="surrogateescape").read()


# The answer lines of LLVM 14+ without escapes, matched whole. json.loads of 8,000 answers
# cost 0.1 s and building frames from the dicts as much again; for a line this pattern
# matches, the three fields read by the regular expressions are exactly what json.loads
# would give (plain strings: no backslash, no control character; canonical unsigned
# integers), so the answer is the same. Any other line (an error, escapes, another LLVM's
# layout) takes the json.loads path.
_JCHARS = r'[^"\\\x00-\x1f]*'  # the inside of a JSON string without escapes
_JUINT = r"(?:0|[1-9][0-9]*)"  # a JSON number that is a canonical unsigned integer


def _symbol_pattern(capture: bool) -> str:
    """One element of an answer's "Symbol" list, FileName, FunctionName and Line captured
    when ``capture``."""
    g = "(" if capture else "(?:"
    return (r'\{"Column":' + _JUINT + r',"Discriminator":' + _JUINT
            + r',"FileName":"' + g + _JCHARS + r')","FunctionName":"' + g + _JCHARS
            + r')","Line":' + g + _JUINT + r'),"StartAddress":"' + _JCHARS
            + r'","StartFileName":"' + _JCHARS + r'","StartLine":' + _JUINT + r"\}")


_ANSWER_HEAD = r'\{"Address":"' + _JCHARS + r'","ModuleName":"' + _JCHARS + r'","Symbol":\['


@functools.cache
def _patterns() -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """The answer patterns: the most common answer, one frame (no inlining), matched and
    read in one pass; any plain answer; and one element of "Symbol" with its fields.
    Compiled on first use: a run whose frames are all cached reads no answer."""
    one_frame = re.compile(_ANSWER_HEAD + _symbol_pattern(True) + r"\]\}")
    plain = re.compile(_ANSWER_HEAD + r"(?:" + _symbol_pattern(False) + r"(?:,"
                       + _symbol_pattern(False) + r")*)?\]\}")
    # In a line the plain pattern matches, strings hold no quote, so '{"Column":' starts
    # only the elements of "Symbol": findall yields their fields in order.
    return one_frame, plain, re.compile(_symbol_pattern(True))


def _parse_answer(line: str) -> tuple[list[RawFrame], bool]:
    """Frames from one JSON answer line, and whether the answer was an error."""
    frames: list[RawFrame] = []
    one_frame, plain, fields = _patterns()
    one = one_frame.fullmatch(line)
    if one is not None:
        file, name, line_no = one.groups()
        if file in _UNKNOWN and name in _UNKNOWN:
            return [], False  # llvm knows nothing about the address
        return [RawFrame("" if name in _UNKNOWN else name, "" if file in _UNKNOWN else file,
                         int(line_no))], False
    if plain.fullmatch(line):
        frames = [
            RawFrame("" if name in _UNKNOWN else name, "" if file in _UNKNOWN else file,
                     int(line_no))
            for file, name, line_no in fields.findall(line)
        ]
        if all(not f.function and not f.file for f in frames):
            frames = []
        return frames, False
    import json  # here: only answers the patterns do not match need it

    try:
        obj: Any = json.loads(line)
    except ValueError:
        return [], True
    if not isinstance(obj, dict) or "Error" in obj:
        return [], True
    for sym in obj.get("Symbol") or ():
        if not isinstance(sym, dict):
            continue
        name = sym.get("FunctionName")
        file = sym.get("FileName")
        line_no = sym.get("Line")
        frames.append(
            RawFrame(
                function="" if not isinstance(name, str) or name in _UNKNOWN else name,
                file="" if not isinstance(file, str) or file in _UNKNOWN else file,
                line=line_no if isinstance(line_no, int) and line_no > 0 else 0,
            )
        )
    # An address llvm knows nothing about comes back as one frame with no name and no file.
    if all(not f.function and not f.file for f in frames):
        frames = []
    return frames, False


def _first_error(line: str) -> str:
    import json

    try:
        obj: Any = json.loads(line)
        return str(obj["Error"]["Message"])
    except (ValueError, KeyError, TypeError):
        return "unreadable answer"
