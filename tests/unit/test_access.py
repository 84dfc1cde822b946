"""Who owns a session's dumps, and which files found in a folder are read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from heapscope.capture import session
from heapscope.capture.access import dump_owner, user_from_command
from heapscope.errors import InputError
from heapscope.formats.trust import FolderTrust, Ignored
from heapscope.prepare import expand_inputs

NOBODY = 65534


@pytest.mark.parametrize(("cmd", "user"), [
    (["runuser", "-u", "postgres", "--", "postgres", "-D", "x"], "postgres"),
    (["/sbin/runuser", "--user=www-data", "--", "nginx"], "www-data"),
    (["runuser", "-l", "postgres", "-c", "pg_ctl start"], "postgres"),
    (["sudo", "-u", "app", "./server"], "app"),
    (["sudo", "./server"], None),  # sudo without -u runs as root
    (["setpriv", "--reuid=app", "--regid=app", "--init-groups", "--", "srv"], "app"),
    (["setpriv", "--reuid", "1001", "--", "srv"], "1001"),
    (["su", "-", "app", "-c", "srv"], "app"),
    (["su", "-s", "/bin/sh", "app", "-c", "srv"], "app"),
    (["gosu", "app:app", "srv"], "app"),
    (["su-exec", "app", "srv"], "app"),
    (["chpst", "-u", "app:app", "srv"], "app"),
    (["postgres", "-D", "x"], None),
    (["env", "runuser", "-u", "x", "--", "y"], None),  # only the command itself is read
])
def test_user_from_command(cmd: list[str], user: str | None) -> None:
    assert user_from_command(cmd) == user


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a folder to another user")
def test_session_for_another_user(tmp_path: Path) -> None:
    owner = dump_owner(["runuser", "-u", "nobody", "--", "x"], None)
    assert owner.uid == NOBODY
    path = Path(session.create(str(tmp_path / "s"), ["x"], owner))
    assert stat.S_IMODE(path.stat().st_mode) == 0o710 and path.stat().st_gid == owner.gid
    dumps = (path / "dumps").stat()
    assert (dumps.st_uid, stat.S_IMODE(dumps.st_mode)) == (NOBODY, 0o700)
    assert stat.S_IMODE((path / "symbolized").stat().st_mode) == 0o700


def test_session_for_the_caller_is_private(tmp_path: Path) -> None:
    path = Path(session.create(str(tmp_path / "s"), ["x"]))
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE((path / "dumps").stat().st_mode) == 0o700


def test_existing_folder_checks(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InputError, match="not yours alone"):
        session.create(str(shared), ["x"])
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(InputError, match="symbolic link"):
        session.create(str(tmp_path / "link"), ["x"])
    assert not (tmp_path / "target").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("mine")
    with pytest.raises(InputError, match="not empty"):
        session.create(str(full), ["x"])
    assert (full / "keep").read_text() == "mine"


def test_default_names_skip_taken_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    first = session.create(None, ["prog"])
    second = session.create(None, ["prog"])
    assert first != second and os.path.isdir(first) and os.path.isdir(second)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another owner")
def test_folder_trust(tmp_path: Path) -> None:
    folder = tmp_path / "d"
    folder.mkdir()
    mine = folder / "jeprof.1.0.f.heap"
    mine.write_text("x")
    theirs = folder / "jeprof.2.0.f.heap"
    theirs.write_text("x")
    os.chown(theirs, NOBODY, NOBODY)
    link = folder / "jeprof.3.0.f.heap"
    link.symlink_to(mine)
    folder.chmod(0o755)  # only its owner writes: everything in it is read
    trust = FolderTrust()
    assert [trust.reason(str(p)) for p in (mine, theirs, link)] == [None, None, None]
    folder.chmod(0o1777)  # like /tmp: only trusted owners, no links
    trust = FolderTrust()
    assert trust.reason(str(mine)) is None
    assert "owned by uid 65534" in str(trust.reason(str(theirs)))
    assert "symbolic link" in str(trust.reason(str(link)))
    assert FolderTrust([NOBODY]).reason(str(theirs)) is None
    ignored: list[Ignored] = []
    assert expand_inputs([str(folder)], ignored=ignored) == [str(mine)]
    assert sorted(i.path for i in ignored) == [str(theirs), str(link)]
