"""The caches heapscope reads are its user's own: files and folders others could write are
never read, and under ``sudo -E`` root's caches do not land in the invoking user's home."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from heapscope import files
from heapscope.symbols.options import default_cache_dir


def test_only_files_this_user_alone_could_write_are_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(files, "IGNORED", [])  # the list the CLI's note is made from
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    mine = folder / "entry.marshal"
    mine.write_bytes(b"ok")
    mine.chmod(0o600)
    f = files.open_private(str(mine))
    assert f is not None and f.read() == b"ok"
    f.close()
    mine.chmod(0o666)  # others may write it
    assert files.open_private(str(mine)) is None
    mine.chmod(0o600)
    folder.chmod(0o777)  # a folder others may write: anything in it could be planted
    assert files.open_private(str(mine)) is None
    folder.chmod(0o700)
    os.mkfifo(folder / "fifo.marshal")
    assert files.open_private(str(folder / "fifo.marshal")) is None  # and never waited on
    assert files.open_private(str(folder / "missing.marshal")) is None
    assert any("others may write it" in why for why in files.IGNORED)


def test_sudo_keeps_roots_caches_in_roots_home(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the home must belong to another user")
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)  # the invoking user's, as sudo -E leaves HOME
    monkeypatch.delenv("HEAPSCOPE_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))
    root_home = pwd.getpwuid(0).pw_dir
    assert default_cache_dir() == os.path.join(root_home, ".cache", "heapscope")
    os.chown(home, 0, 0)  # root's own HOME: used as it is
    assert default_cache_dir() == os.path.join(str(home), ".cache", "heapscope")
