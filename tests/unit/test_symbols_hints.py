"""Debug-info hints: for a module with no debug info that holds a real share of a dump, one
line saying how to get names on this system (-dbgsym package, debuginfod, --debug-dir)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from heapscope.cli import common
from heapscope.model import Profile, Sample
from heapscope.symbols import Diagnostic, SymbolOptions, symbolize
from heapscope.symbols import hints as hints_module
from heapscope.symbols.hints import Missing, cached_owners, debug_hints, dpkg_owners, os_release
from heapscope.symbols.options import NO_DEBUG_INFO

from .test_symbols_support import LIB_BASE, build_c, functions, mappings_for, need, profile, run

# A distro library that ships stripped, with its debug info in a -dbgsym package.
LIBZ = "/usr/lib/x86_64-linux-gnu/libz.so.1"


@pytest.fixture(autouse=True)
def fresh_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a new command: no module hinted about yet, no cache folder for dpkg's
    answers."""
    monkeypatch.setattr(common, "_hinted", set())
    monkeypatch.setattr(common, "_hint_cache", None)


def opts(tmp: Path) -> SymbolOptions:
    """Options isolated from the host: no cache, no debuginfod, an empty system debug dir."""
    return SymbolOptions(cache_dir=None, debuginfod_urls=(),
                         system_debug_dir=str(tmp / "no-system-debug"))


def build_id_of(path: Path | str) -> str:
    """The GNU build-id as readelf prints it."""
    found = re.search(r"Build ID: ([0-9a-f]+)", run("readelf", "-n", path))
    return found.group(1) if found else ""


def stripped_lib(tmp: Path, *flags: str) -> tuple[Path, int]:
    """A stripped shared library and the runtime address of an instruction in its exported
    function (the library loaded at LIB_BASE)."""
    full = build_c("lib.c", tmp / "libsymtest.so.full", "-O1", "-fPIC", "-shared", *flags)
    lib = tmp / "libsymtest.so"
    run("strip", "--strip-all", "-o", lib, full)
    start, _ = functions(full)["lib_public_a"]
    return lib, LIB_BASE + start + 4


def no_owner(paths: Sequence[str]) -> dict[str, str]:
    """No package owns any file (a file built by the test)."""
    return {}


def hint_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "hint:" in line]


def test_stripped_library_with_build_id_gets_debuginfod_and_debug_dir_hint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need("gcc", "strip", "readelf")
    lib, address = stripped_lib(tmp_path, "-Wl,--build-id=sha1")
    prof = profile([[address]], mappings_for(lib, LIB_BASE))

    result = symbolize(prof, opts(tmp_path))

    (note,) = [d for d in result.diagnostics if d.path]
    assert (note.module, note.path) == ("libsymtest.so", str(lib))
    assert note.build_id == build_id_of(lib) != ""
    assert note.share == 1.0  # the only stack passes through it
    common.print_debug_hints(result.diagnostics, owners=no_owner)
    (line,) = hint_lines(capsys.readouterr().err)
    assert line.startswith("heapscope: hint: libsymtest.so: no debug info")
    assert "DEBUGINFOD_URLS" in line
    assert "--debug-dir DIR" in line
    assert "-dbgsym" not in line  # no package owns a file the test built


def test_no_debuginfod_hint_without_a_build_id(tmp_path: Path) -> None:
    need("gcc", "strip", "readelf")
    lib, address = stripped_lib(tmp_path, "-Wl,--build-id=none")
    assert build_id_of(lib) == ""
    result = symbolize(profile([[address]], mappings_for(lib, LIB_BASE)), opts(tmp_path))

    (note,) = [d for d in result.diagnostics if d.path]
    hints = debug_hints([Missing(note.module, note.path, note.build_id)], owners=no_owner,
                        release={"ID": "debian", "VERSION_CODENAME": "bookworm"})
    assert "DEBUGINFOD_URLS" not in hints[str(lib)]
    assert "--debug-dir DIR" in hints[str(lib)]


def test_hint_once_per_command_and_only_for_a_real_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need("gcc", "strip")
    lib, address = stripped_lib(tmp_path)
    maps = mappings_for(lib, LIB_BASE)
    # One stack of 64 bytes through the library among 200: 0.5% of the bytes, under 1%.
    small = profile([[address]] + [[0x10 + i] for i in range(199)], maps)
    big = profile([[address]], maps)

    common.print_debug_hints(symbolize(small, opts(tmp_path)).diagnostics, owners=no_owner)
    assert hint_lines(capsys.readouterr().err) == []
    diags = symbolize(big, opts(tmp_path)).diagnostics
    common.print_debug_hints(diags, owners=no_owner)
    common.print_debug_hints(diags, owners=no_owner)  # a second dump of the same command
    assert len(hint_lines(capsys.readouterr().err)) == 1


def test_debian_library_hint_names_its_dbgsym_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if os_release().get("ID") != "debian" or shutil.which("dpkg-query") is None:
        pytest.skip("needs Debian's dpkg")
    if not Path(LIBZ).exists():
        pytest.skip(f"{LIBZ} is not installed")
    real = str(Path(LIBZ).resolve())
    owned = subprocess.run(["dpkg-query", "-S", real.removeprefix("/usr")],
                           capture_output=True, text=True, check=False)
    if not owned.stdout.startswith("zlib1g:"):
        pytest.skip("zlib1g does not own libz here")
    if build_id_of(real) and Path("/usr/lib/debug/.build-id", build_id_of(real)[:2]).joinpath(
            build_id_of(real)[2:] + ".debug").exists():
        pytest.skip("zlib's debug info is installed here")
    # An address in libz's code, in a dump of a process that mapped it as the kernel does.
    maps = mappings_for(real, LIB_BASE)
    code = next(m for m in maps if "x" in m.perms)
    prof = Profile(samples=(Sample((code.start + 0x40,), (1.0, 4096.0, 1.0, 4096.0)),),
                   mappings=tuple(maps))

    result = symbolize(prof, opts(tmp_path))
    common.print_debug_hints(result.diagnostics)

    (line,) = hint_lines(capsys.readouterr().err)
    assert "libz.so.1.2.13" in line
    assert "install zlib1g-dbgsym" in line
    assert "deb http://deb.debian.org/debian-debug bookworm-debug main" in line
    assert "DEBUGINFOD_URLS=https://debuginfod.debian.net" in line


class Asker:
    """A stand-in for dpkg: fixed owners, and every list of files it was asked about."""

    def __init__(self, owners: dict[str, str], fail: bool = False) -> None:
        self.owners = owners
        self.fail = fail
        self.asked: list[list[str]] = []

    def __call__(self, paths: Sequence[str]) -> dict[str, str] | None:
        self.asked.append(list(paths))
        if self.fail:
            return None
        return {p: self.owners[p] for p in paths if p in self.owners}


def owner_files(tmp: Path) -> tuple[str, str, str, str]:
    """A cache folder, dpkg's status file, a file a package owns and one none owns."""
    status = tmp / "status"
    status.write_text("Package: zlib1g\n")
    owned, unowned = tmp / "libowned.so", tmp / "libmine.so"
    owned.write_bytes(b"\x7fELF owned")
    unowned.write_bytes(b"\x7fELF mine")
    return str(tmp / "cache"), str(status), str(owned), str(unowned)


def test_cached_owners_asks_dpkg_once_per_file(tmp_path: Path) -> None:
    cache, status, owned, unowned = owner_files(tmp_path)
    dpkg = Asker({owned: "zlib1g"})

    first = cached_owners(cache, dpkg, status)([owned, unowned])
    # A later command (a new function, the same folder): the answers, no question.
    again = cached_owners(cache, dpkg, status)([owned, unowned])

    assert first == again == {owned: "zlib1g"}
    assert dpkg.asked == [[owned, unowned]]
    # One more file: only it is asked about.
    other = tmp_path / "libother.so"
    other.write_bytes(b"\x7fELF other")
    assert cached_owners(cache, dpkg, status)([owned, str(other)]) == {owned: "zlib1g"}
    assert dpkg.asked == [[owned, unowned], [str(other)]]


def test_cached_owner_is_asked_again_when_the_file_or_dpkg_changes(tmp_path: Path) -> None:
    cache, status, owned, unowned = owner_files(tmp_path)
    dpkg = Asker({owned: "zlib1g"})
    cached_owners(cache, dpkg, status)([owned, unowned])

    Path(unowned).write_bytes(b"\x7fELF mine, rebuilt")  # a new size
    assert cached_owners(cache, dpkg, status)([owned, unowned]) == {owned: "zlib1g"}
    assert dpkg.asked[1:] == [[unowned]]

    Path(status).write_text("Package: zlib1g\nPackage: zlib1g-dbgsym\n")  # an install
    dpkg.owners[unowned] = "mine"
    assert cached_owners(cache, dpkg, status)([owned, unowned]) == {owned: "zlib1g",
                                                                     unowned: "mine"}
    assert dpkg.asked[2:] == [[owned, unowned]]


def test_cached_owners_keeps_no_failed_answer_and_no_cache_asks_always(tmp_path: Path) -> None:
    cache, status, owned, _ = owner_files(tmp_path)
    broken = Asker({}, fail=True)
    assert cached_owners(cache, broken, status)([owned]) == {}
    dpkg = Asker({owned: "zlib1g"})
    assert cached_owners(cache, dpkg, status)([owned]) == {owned: "zlib1g"}
    assert dpkg.asked == [[owned]]  # the failure left nothing behind

    uncached = Asker({owned: "zlib1g"})
    for _ in range(2):
        assert cached_owners(None, uncached, status)([owned]) == {owned: "zlib1g"}
    assert uncached.asked == [[owned], [owned]]


def test_cached_owners_ignores_a_file_others_could_have_written(tmp_path: Path) -> None:
    cache, status, owned, _ = owner_files(tmp_path)
    dpkg = Asker({owned: "zlib1g"})
    cached_owners(cache, dpkg, status)([owned])
    stored = Path(cache, *hints_module.OWNERS_FILE)
    text = stored.read_text()
    assert '"zlib1g"' in text
    # Planted by someone who could write it: a wrong package name in every later hint.
    stored.write_text(text.replace('"zlib1g"', '"evil"'))
    stored.chmod(0o666)

    assert cached_owners(cache, dpkg, status)([owned]) == {owned: "zlib1g"}
    assert len(dpkg.asked) == 2


def test_hint_text_is_the_same_from_the_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cache, status, owned, _ = owner_files(tmp_path)
    missing = [Missing("libowned.so", owned, "ab12")]
    release = {"ID": "debian", "VERSION_CODENAME": "bookworm"}
    direct = debug_hints(missing, owners=Asker({owned: "zlib1g"}), release=release)
    dpkg = Asker({owned: "zlib1g"})
    cold = debug_hints(missing, owners=cached_owners(cache, dpkg, status), release=release)
    warm = debug_hints(missing, owners=cached_owners(cache, dpkg, status), release=release)
    assert direct == cold == warm == {owned: (
        "hint: libowned.so: no debug info; to get names, install zlib1g-dbgsym (from "
        "'deb http://deb.debian.org/debian-debug bookworm-debug main'), or set "
        "DEBUGINFOD_URLS=https://debuginfod.debian.net, or pass --debug-dir DIR with its "
        "debug file")}
    assert len(dpkg.asked) == 1


def test_real_dpkg_answer_is_kept_in_the_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if shutil.which("dpkg-query") is None or not Path(hints_module.DPKG_STATUS).exists():
        pytest.skip("needs dpkg")
    if not Path(LIBZ).exists():
        pytest.skip(f"{LIBZ} is not installed")
    expected = dpkg_owners([LIBZ])
    assert expected.get(LIBZ, "").startswith("zlib1g")
    cache = str(tmp_path / "cache")
    assert cached_owners(cache)([LIBZ]) == expected
    # dpkg gone: the answer comes from the cache folder alone.
    monkeypatch.setattr(hints_module.shutil, "which", lambda name: None)
    assert dpkg_owners([LIBZ]) == {}
    assert cached_owners(cache)([LIBZ]) == expected


def on_bookworm(monkeypatch: pytest.MonkeyPatch, cache: str, status: str, owned: str
                ) -> Asker:
    """A Debian 12 system where dpkg says ``owned`` is zlib1g's, the command's cache folder
    ``cache``; returns the fake dpkg-query, which records what it was asked."""
    dpkg = Asker({owned: "zlib1g"})
    monkeypatch.setattr(hints_module, "_dpkg_query", dpkg)
    monkeypatch.setattr(hints_module, "DPKG_STATUS", status)
    monkeypatch.setattr(hints_module, "os_release",
                        lambda: {"ID": "debian", "VERSION_CODENAME": "bookworm"})
    monkeypatch.setattr(common, "_hint_cache", cache)
    return dpkg


def test_print_debug_hints_uses_the_commands_cache_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cache, status, owned, _ = owner_files(tmp_path)
    dpkg = on_bookworm(monkeypatch, cache, status, owned)
    diags = [Diagnostic("libowned.so", "info", NO_DEBUG_INFO, path=owned, share=0.5)]
    for _ in range(2):
        monkeypatch.setattr(common, "_hinted", set())  # two commands
        common.print_debug_hints(diags)
    lines = hint_lines(capsys.readouterr().err)
    assert lines == ["heapscope: hint: libowned.so: no debug info; to get names, install "
                     "zlib1g-dbgsym (from 'deb http://deb.debian.org/debian-debug "
                     "bookworm-debug main'), or pass --debug-dir DIR with its debug file"] * 2
    assert dpkg.asked == [[owned]]


def test_hints_asked_for_ahead_are_the_ones_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # start_debug_hints asks dpkg while the dump is folded; print_debug_hints then prints
    # that answer: one question, the same line as when asked then.
    cache, status, owned, unowned = owner_files(tmp_path)
    dpkg = on_bookworm(monkeypatch, cache, status, owned)
    monkeypatch.setattr(common, "_early", None)
    owned_note = Diagnostic("libowned.so", "info", NO_DEBUG_INFO, path=owned, share=0.5)
    # Below HINT_SHARE: never hinted about, so never asked about either.
    small = Diagnostic("libmine.so", "info", NO_DEBUG_INFO, path=unowned, share=0.001)
    common.start_debug_hints((owned_note, small))
    common.print_debug_hints([owned_note, small])
    line = ("heapscope: hint: libowned.so: no debug info; to get names, install zlib1g-dbgsym "
            "(from 'deb http://deb.debian.org/debian-debug bookworm-debug main'), or pass "
            "--debug-dir DIR with its debug file")
    assert hint_lines(capsys.readouterr().err) == [line]
    assert dpkg.asked == [[owned]]
    assert common._early is None  # used once
    # Asked ahead for other modules than those printed: that answer is not used.
    monkeypatch.setattr(common, "_hinted", set())
    monkeypatch.setattr(common, "_hint_cache", None)
    other = small._replace(share=0.5)
    common.start_debug_hints((other,))
    common.print_debug_hints([owned_note])
    assert hint_lines(capsys.readouterr().err) == [line]
    assert sorted(dpkg.asked[1:]) == sorted([[owned], [unowned]])
