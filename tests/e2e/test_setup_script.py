"""scripts/setup.sh's own steps, run one at a time (``--only``) without installing anything.

The lock wait is run against fcntl locks on temporary files (``HEAPSCOPE_SETUP_LOCKS``)
taken the way apt takes its own, and the PATH link goes into a temporary folder
(``HEAPSCOPE_SETUP_BIN``): apt's real locks and /usr/local/bin are never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup.sh"
VENV_HEAPSCOPE = ROOT / ".venv" / "bin" / "heapscope"

pytestmark = pytest.mark.skipif(
    shutil.which("perl") is None, reason="set-up's lock probe needs perl"
)


def _step(step: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["bash", str(SETUP), "--only", step],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _holder(path: Path) -> subprocess.Popen[str]:
    """Another process holding an apt-style lock (fcntl F_SETLK write lock) on ``path``."""
    code = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o640)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "print('held', flush=True)\n"
        "sys.stdin.read()\n"  # until the test closes stdin
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_waits_for_a_held_lock_says_for_whom_and_goes_on(tmp_path: Path) -> None:
    free, held = tmp_path / "lock-frontend", tmp_path / "lists-lock"
    free.touch()
    holder = _holder(held)
    try:
        # A lock file that does not exist counts as free, as on a machine without apt lists.
        setup = _step("wait-for-apt", HEAPSCOPE_SETUP_LOCKS=f"{tmp_path / 'absent'}:{free}:{held}")
        time.sleep(2)
        assert setup.poll() is None, "set-up went on while the lock was held"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait()
    _, err = setup.communicate(timeout=120)
    assert setup.returncode == 0, err
    assert f"waiting for another package manager (pid {holder.pid}: {sys.executable} -c " in err
    assert err.count("waiting for another package manager") == 1  # said once, not every second
    assert "the package manager is free, going on" in err


def test_does_not_wait_when_no_lock_is_held(tmp_path: Path) -> None:
    (tmp_path / "lock").touch()
    setup = _step("wait-for-apt", HEAPSCOPE_SETUP_LOCKS=str(tmp_path / "lock"))
    out, err = setup.communicate(timeout=120)
    assert (setup.returncode, out, err) == (0, "", "")


def test_links_heapscope_into_the_bin_folder_again_and_again(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # created by the step
    for _ in range(2):
        setup = _step("link", HEAPSCOPE_SETUP_BIN=str(bin_dir))
        out, err = setup.communicate(timeout=60)
        assert setup.returncode == 0, err
        assert out == (
            f"heapscope setup: heapscope is on PATH as {bin_dir}/heapscope -> {VENV_HEAPSCOPE}\n"
        )
    link = bin_dir / "heapscope"
    assert link.is_symlink() and os.readlink(link) == str(VENV_HEAPSCOPE)
    assert sorted(p.name for p in bin_dir.iterdir()) == ["heapscope"]
    if VENV_HEAPSCOPE.exists():
        version = subprocess.run(
            [str(link), "--version"], capture_output=True, text=True, timeout=60
        )
        assert version.returncode == 0 and version.stdout.startswith("heapscope "), version.stderr


def test_replaces_an_earlier_set_ups_link(tmp_path: Path) -> None:
    (tmp_path / "heapscope").symlink_to("/gone/clone/.venv/bin/heapscope")
    setup = _step("link", HEAPSCOPE_SETUP_BIN=str(tmp_path))
    _, err = setup.communicate(timeout=60)
    assert setup.returncode == 0, err
    assert os.readlink(tmp_path / "heapscope") == str(VENV_HEAPSCOPE)


@pytest.mark.parametrize("kind", ["file", "other link"])
def test_leaves_a_heapscope_that_is_not_its_link_alone(tmp_path: Path, kind: str) -> None:
    theirs = tmp_path / "heapscope"
    if kind == "file":
        theirs.write_text("#!/bin/sh\necho theirs\n")
    else:
        theirs.symlink_to("/opt/heapscope/bin/heapscope")
    setup = _step("link", HEAPSCOPE_SETUP_BIN=str(tmp_path))
    out, err = setup.communicate(timeout=60)
    assert setup.returncode == 0, err
    assert out == ""
    assert err == (
        f"heapscope setup: {theirs} is not set-up's link, left alone: "
        f"run {VENV_HEAPSCOPE} instead\n"
    )
    if kind == "file":
        assert not theirs.is_symlink() and theirs.read_text() == "#!/bin/sh\necho theirs\n"
    else:
        assert os.readlink(theirs) == "/opt/heapscope/bin/heapscope"
