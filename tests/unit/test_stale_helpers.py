"""Helper folders left by killed runs are removed by the next run, and only those: not
another run's (young, or mapped by a live process), not one holding dumps, not another
user's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heapscope.capture.helper import LIBRARY_NAME, STALE_AFTER, remove_stale


def _folder(base: Path, name: str, *, age: float, dumps: bool = False) -> Path:
    d = base / f"heapscope-ctl-{name}"
    d.mkdir()
    (d / LIBRARY_NAME).write_bytes(b"\x7fELF helper copy")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(d / "1234.sock"))
    s.close()
    (d / "dumps-1000").mkdir()
    if dumps:
        (d / "dumps-1000" / "jeprof.77.0.f.heap").write_text("heap_v2/524288\n")
    then = time.time() - age
    os.utime(d, (then, then))
    return d


def test_only_stale_empty_unmapped_folders_of_ours_go(tmp_path: Path) -> None:
    old = STALE_AFTER + 60
    stale = _folder(tmp_path, "stale", age=old)
    young = _folder(tmp_path, "young", age=5)
    with_dumps = _folder(tmp_path, "dumps", age=old, dumps=True)
    mapped = _folder(tmp_path, "mapped", age=old)
    other = tmp_path / "unrelated"
    other.mkdir()
    # A live process with the helper of "mapped" in its memory map, as a program has.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import mmap, sys, time\n"
         f"f = open({str(mapped / LIBRARY_NAME)!r}, 'rb')\n"
         "m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)\n"
         "print('ready', flush=True)\ntime.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
        now = time.time()
        for d in (stale, young, with_dumps, mapped):  # the holder touched none of them
            os.utime(d, (now - (5 if d is young else old),) * 2)
        removed = remove_stale(str(tmp_path))
    finally:
        holder.kill()
        holder.wait()
    assert removed == [str(stale)]
    assert not stale.exists()
    assert young.exists() and with_dumps.exists() and mapped.exists() and other.exists()
    assert (with_dumps / "dumps-1000" / "jeprof.77.0.f.heap").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder another user owns")
def test_another_users_folder_is_left_alone(tmp_path: Path) -> None:
    theirs = _folder(tmp_path, "theirs", age=STALE_AFTER + 60)
    os.chown(theirs, 65534, 65534)
    then = time.time() - STALE_AFTER - 60
    os.utime(theirs, (then, then))
    assert remove_stale(str(tmp_path)) == []
    assert theirs.exists()
