"""heapscope.files: writing outputs without following links or predictable temporary names."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from heapscope import files


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_current_umask_reads_without_changing(monkeypatch: pytest.MonkeyPatch) -> None:
    old = os.umask(0o027)
    try:
        assert files.current_umask() == 0o027
        assert _umask() == 0o027
    finally:
        os.umask(old)


def test_current_umask_without_proc(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open

    def no_proc(path: object, *a: object, **kw: object) -> object:
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(2, "No such file or directory", path)
        return real_open(path, *a, **kw)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", no_proc)
    old = os.umask(0o007)
    try:
        assert files.current_umask() == 0o007
        assert _umask() == 0o007
    finally:
        os.umask(old)


def test_replace_atomically_writes_the_content(tmp_path: Path) -> None:
    out = tmp_path / "out.html"
    files.replace_atomically(str(out), b"<html>one</html>")
    assert out.read_bytes() == b"<html>one</html>"
    files.replace_atomically(str(out), b"two")
    assert out.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["out.html"]  # no temporary file left


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002, 0o000])
def test_replace_atomically_mode_follows_umask(tmp_path: Path, mask: int) -> None:
    old = os.umask(mask)
    try:
        files.replace_atomically(str(tmp_path / "f"), b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f").stat().st_mode) == 0o666 & ~mask


def test_replace_atomically_replaces_a_symlink_not_its_target(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    out = tmp_path / "out.html"
    out.symlink_to(victim)
    files.replace_atomically(str(out), b"new")
    assert not out.is_symlink() and out.is_file()
    assert out.read_bytes() == b"new"
    assert victim.read_text() == "precious\n"
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["out.html", "victim"]


def test_replace_atomically_ignores_a_planted_predictable_temp(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    out = tmp_path / "out.html"
    for planted in (f"out.html.tmp{os.getpid()}", ".out.html.tmp", "out.html.tmp"):
        (tmp_path / planted).symlink_to(victim)
    files.replace_atomically(str(out), b"new")
    assert out.read_bytes() == b"new"
    assert victim.read_text() == "precious\n"


def test_replace_atomically_temp_name_is_hidden_and_unpredictable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        seen.append(os.path.basename(src))
        real_replace(src, dst)

    monkeypatch.setattr(files.os, "replace", spy)
    for _ in range(2):
        files.replace_atomically(str(tmp_path / "out.svg"), b"x")
    assert all(n.startswith(".out.svg.") and n.endswith(".tmp") for n in seen)
    assert seen[0] != seen[1]


def test_replace_atomically_removes_the_temp_on_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "out.html"
    out.write_bytes(b"old")

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "replace", boom)
    with pytest.raises(OSError, match="No space left"):
        files.replace_atomically(str(out), b"new")
    assert out.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["out.html"]


def test_replace_atomically_onto_a_folder_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "keep").write_text("k")
    with pytest.raises(OSError):
        files.replace_atomically(str(tmp_path / "d"), b"x")
    assert sorted(os.listdir(tmp_path)) == ["d"]
    assert os.listdir(tmp_path / "d") == ["keep"]


def test_replace_atomically_relative_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    files.replace_atomically("plain.txt", b"here")
    assert (tmp_path / "plain.txt").read_bytes() == b"here"
    assert os.listdir(tmp_path) == ["plain.txt"]


def test_replace_atomically_long_name(tmp_path: Path) -> None:
    name = "n" * 250
    files.replace_atomically(str(tmp_path / name), b"x")
    assert os.listdir(tmp_path) == [name]


def test_create_atomically_never_replaces(tmp_path: Path) -> None:
    out = tmp_path / "g.svg"
    files.create_atomically(str(out), b"first")
    assert out.read_bytes() == b"first"
    with pytest.raises(FileExistsError):
        files.create_atomically(str(out), b"second")
    assert out.read_bytes() == b"first"
    link = tmp_path / "link.svg"
    link.symlink_to(tmp_path / "dangling")
    with pytest.raises(FileExistsError):
        files.create_atomically(str(link), b"x")
    assert not (tmp_path / "dangling").exists()
    assert sorted(os.listdir(tmp_path)) == ["g.svg", "link.svg"]
