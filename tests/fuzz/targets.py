"""The readers the fuzz campaign feeds, and what each may answer to bad input.

(The writers it feeds, a fuzzed dump read and then written out, are in writers.py.)

A target takes the input's bytes and a scratch file path. It must return, or raise one of
the exceptions it lists in ``allowed`` (a one-line :class:`InputError` for every reader a
user gives files to; ``ValueError`` for the profile.proto decoder, which only tests use).
Anything else is a crash; running past the campaign's time limit is a hang.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from heapscope.analysis.ownership import facts_from_manifest
from heapscope.analysis.suppress import read_file as read_suppressions
from heapscope.capture.session import read_manifest, recorded_modules
from heapscope.errors import InputError
from heapscope.formats import scan, symbolized
from heapscope.formats.jemalloc import ParseCache
from heapscope.formats.load import load
from heapscope.formats.pprof import decode_profile
from heapscope.formats.scan import Scanner
from heapscope.formats.scancache import ScanCache
from heapscope.model import Profile
from heapscope.render.pprof import encode_profile
from heapscope.symbols.perfmap import PerfMap

DATA = Path(__file__).resolve().parent.parent / "data" / "dumps"
CORPUS = Path(__file__).resolve().parent / "corpus"  # real jemalloc 5.3 dumps


@dataclass(frozen=True)
class Target:
    """One reader under test."""

    name: str
    run: Callable[[bytes, str], object]
    allowed: tuple[type[BaseException], ...]
    seeds: Callable[[], list[bytes]]


def _write(data: bytes, path: str) -> str:
    with open(path, "wb") as f:
        f.write(data)
    return path


def _one_line(e: BaseException) -> None:
    if "\n" in str(e):
        raise AssertionError(f"error message spans lines: {str(e)[:200]!r}")


def _dump(data: bytes, scratch: str) -> object:
    path = _write(data, scratch + ".heap")
    for kwargs in ({"threads": True}, {"cache": ParseCache()}):
        try:
            load(path, **kwargs)  # type: ignore[arg-type]
        except InputError as e:
            _one_line(e)
            raise
    return None


def _scan(data: bytes, scratch: str) -> object:
    """The series scanner, with its compiled loop and without: both must read the same."""
    path = _write(data, scratch + ".heap")
    compiled = _scanned(path)
    saved = scan.core
    scan.core = None
    try:
        python = _scanned(path)
    finally:
        scan.core = saved
    def same(x: object) -> object:
        return str(x) if isinstance(x, InputError) else x

    if same(compiled) != same(python):
        raise AssertionError(f"compiled scan {compiled!r:.300} != Python {python!r:.300}")
    if isinstance(compiled, InputError):
        _one_line(compiled)
        raise compiled
    return compiled


def _scanned(path: str) -> object:
    """What a fresh Scanner reads: the counts per stack and the facts around them."""
    scanner = Scanner(None)
    try:
        d, _ = scanner.read(path)
    except InputError as e:
        return e
    return ([scanner.table.stacks[i] for i in d.ids.tolist()], d.counts.tolist(),
            d.nbytes.tolist(), d.period, d.sampling, d.unsampled, d.mappings, d.kind, d.time)


def _json_profile(data: bytes, scratch: str) -> object:
    try:
        return symbolized.parse(data.decode("utf-8", "replace"), scratch)
    except InputError as e:
        _one_line(e)
        raise


def _pprof(data: bytes, scratch: str) -> object:
    return decode_profile(data)


def _perf_map(data: bytes, scratch: str) -> object:
    pm = PerfMap.read(_write(data, scratch + ".map"))
    for a in (0, 0x1000, 0x7FFFFFFF, 0xFFFFFFFFFFFFFFFF):
        pm.lookup(a)
    return pm


def _suppressions(data: bytes, scratch: str) -> object:
    try:
        return read_suppressions(_write(data, scratch + ".supp"))
    except InputError as e:
        _one_line(e)
        raise


def _manifest(data: bytes, scratch: str) -> object:
    folder = scratch + ".session"
    os.makedirs(folder, exist_ok=True)
    _write(data, os.path.join(folder, "manifest.json"))
    m = read_manifest(folder)
    return facts_from_manifest(m), recorded_modules(m)


def _scan_cache(data: bytes, scratch: str) -> object:
    """The scan cache's reader (what ``leaks`` keeps of a series between runs): whatever the
    file holds, each dump it yields is whole (ids, counts and bytes of one length, every id
    in its table), or the file is ignored. It never raises."""
    paths = _cache_paths(scratch)
    memory = ScanCache(scratch + ".cache", 77, paths)
    assert memory.file is not None
    os.makedirs(os.path.dirname(memory.file), exist_ok=True)
    _write(data, memory.file)
    memory = ScanCache(scratch + ".cache", 77, paths)
    stacks = len(memory.table.stacks)
    for d in memory.entries.values():
        if not d.ids.size == d.counts.size == d.nbytes.size:
            raise AssertionError(f"a dump of {d.ids.size} ids, {d.counts.size} counts and "
                                 f"{d.nbytes.size} byte values")
        if d.ids.size and not 0 <= int(d.ids.min()) <= int(d.ids.max()) < stacks:
            raise AssertionError("a stack id outside the table")
    return len(memory.entries)


def _cache_paths(scratch: str) -> list[str]:
    """Two dump files (their contents do not matter to the cache) beside ``scratch``."""
    folder = scratch + ".dumps"
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, f"jeprof.77.{k}.m{k}.heap") for k in range(2)]
    for k, p in enumerate(paths):
        if not os.path.exists(p):
            _write(f"dump {k}\n".encode(), p)
    return paths


def _scan_cache_seeds() -> list[bytes]:
    """Cache files as ScanCache writes them, of the first two test dumps."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="heapscope-fuzz-seed-") as tmp:
        scratch = os.path.join(tmp, "s")
        paths = _cache_paths(scratch)
        memory = ScanCache(scratch + ".cache", 77, paths)
        scanner = Scanner(memory)
        for path, dump in zip(paths, _dump_files()[:2], strict=True):
            counts, _ = scanner.read(str(dump))
            memory.put(path, counts)
        memory.save()
        assert memory.file is not None
        return [Path(memory.file).read_bytes()]


def _dump_files() -> list[Path]:
    return sorted(DATA.glob("*.heap")) + sorted(CORPUS.glob("*.heap"))


def _dump_seeds() -> list[bytes]:
    return [p.read_bytes() for p in _dump_files()]


def _profiles() -> list[Profile]:
    return [load(str(p)) for p in _dump_files()]


def _json_seeds() -> list[bytes]:
    return [json.dumps(symbolized.encode(p)).encode() for p in _profiles()]


def _pprof_seeds() -> list[bytes]:
    return [encode_profile([p]) for p in _profiles()]


def _text_seeds(*texts: str) -> Callable[[], list[bytes]]:
    return lambda: [t.encode() for t in texts]


PERF_MAP = ("7f0001000000 40 LInflater;::init\n0x7f0001000040 0x80 java.lang.String::hashCode\n"
            "7f0001000100 20 Interpreter\n")
SUPPRESSIONS = "# comment\nleak:^libfoo\nleak:my_cache_fill*\nleak:/usr/lib/.*\\.so$\n"
MANIFEST = json.dumps({
    "format": "heapscope-session", "version": 1, "pid": 100, "command": ["./a", "b"],
    "processes": [{"pid": 100, "ppid": 1, "exe": "/srv/a", "cmdline": ["./a", "b"]},
                  {"pid": 101, "ppid": 100, "exe": "/srv/a", "cmdline": ["a: worker"]}],
    "modules": {"/srv/a": {"build_id": "ab" * 20, "size": 1000, "mtime_ns": 1},
                "/lib/libc.so.6": "cd" * 20},
})

READERS = (
    Target("heap_v2+legacy", _dump, (InputError,), _dump_seeds),
    Target("scan", _scan, (InputError,), _dump_seeds),
    Target("symbolized-json", _json_profile, (InputError,), _json_seeds),
    Target("pprof", _pprof, (ValueError,), _pprof_seeds),
    Target("perf-map", _perf_map, (), _text_seeds(PERF_MAP)),
    Target("suppressions", _suppressions, (InputError,), _text_seeds(SUPPRESSIONS)),
    Target("manifest", _manifest, (), _text_seeds(MANIFEST)),
    Target("scan-cache", _scan_cache, (), _scan_cache_seeds),
)
