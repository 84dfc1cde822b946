"""The helper ``heapscope run`` preloads: every dump of a program it started is taken through
the helper's socket (no stop at all), a forked child gets its own, the helper survives a
program that closes every descriptor, never takes a signal meant for the program, and
answers as the call stub does (the stub is its reference)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

PY = "/usr/bin/python3"


def _run(args: list[str], tmp_path: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"))
    env.pop("HEAPSCOPE_NO_HELPER", None)
    return subprocess.Popen([sys.executable, "-m", "heapscope.cli.main", "run", *args],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, bufsize=1)


def _status(pid: int, tmp_path: Path, **env_extra: str) -> dict[str, Any]:
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"), **env_extra)
    p = subprocess.run([sys.executable, "-m", "heapscope.cli.main", "attach", str(pid),
                        "status", "--format", "json"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc: dict[str, Any] = json.loads(p.stdout)
    return doc


def _manifest(session: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((session / "manifest.json").read_text())
    return doc


def test_every_round_through_the_helper(storm_bin: Path, libjemalloc: Path,
                                        helper_built: str, tmp_path: Path) -> None:
    """run --every on a program whose threads allocate all the time: every round's dump
    comes through the helper; attach finds the helper too, and what it answers is what the
    call stub answers for the same process."""
    session = tmp_path / "s"
    hs = _run(["-o", str(session), "--every", "0.3", "--", str(storm_bin), "2"], tmp_path)
    assert hs.stdout is not None and hs.stdin is not None
    pid = int(hs.stdout.readline().split()[1])
    try:
        time.sleep(1.5)
        via_helper = _status(pid, tmp_path)
        via_stub = _status(pid, tmp_path, HEAPSCOPE_NO_HELPER="1")
        assert via_helper["attach"]["mode"] == "helper" and via_stub["attach"]["mode"] == "stub"
        for key in ("version", "symbol", "config_prof", "opt_prof", "prof_active",
                    "lg_sample", "prof_prefix", "lg_prof_interval"):
            assert via_helper[key] == via_stub[key], key
        assert via_helper["prof_prefix"] == str(session / "dumps" / "jeprof")
        assert 0 < via_helper["stats"]["allocated"] <= via_helper["stats"]["resident"]
        time.sleep(1.0)
    finally:
        hs.stdin.write("q\n")
        hs.stdin.flush()
        _out, err = hs.communicate(timeout=300)
    assert hs.returncode == 0, err
    (proc,) = [p for p in _manifest(session)["processes"] if p["pid"] == pid]
    assert proc["rounds"] >= 5 and proc["missed_rounds"] == 0 and proc["via"] == "helper"
    dumps = list((session / "dumps").glob(f"jeprof.{pid}.*.heap"))
    assert len(dumps) >= proc["rounds"]  # the rounds' dumps and the final one
    assert not list(Path("/tmp").glob(f"heapscope-ctl-*/{pid}.sock"))  # cleaned up


def test_forked_child_gets_its_own_helper(libjemalloc: Path, helper_built: str,
                                          tmp_path: Path) -> None:
    """A program that forks: the child answers on its own socket (the helper starts again
    after fork), and both are dumped through their helpers every round."""
    code = ("import os, sys, time\n"
            "pid = os.fork()\n"
            "os.write(1, b'%s %d\\n' % (b'parent' if pid else b'child', os.getpid()))\n"
            "keep = [bytearray(4096) for _ in range(1000)]\n"
            "time.sleep(2.5)\n"
            "if pid: os.waitpid(pid, 0)\n")
    session = tmp_path / "s"
    hs = _run(["-o", str(session), "--every", "0.3", "--", PY, "-c", code], tmp_path)
    assert hs.stdout is not None
    pids: dict[str, int] = {}
    seen = []
    while len(pids) < 2 and len(seen) < 10:
        # Two processes share the pipe: find their lines, whatever else comes between
        # (each line is one write(2), whole even when Python runs unbuffered).
        seen.append(hs.stdout.readline())
        pids.update((m[1], int(m[2])) for m in re.finditer(r"\b(child|parent) (\d+)", seen[-1]))
    assert set(pids) == {"child", "parent"}, seen
    time.sleep(0.8)
    child = _status(pids["child"], tmp_path)
    assert child["attach"]["mode"] == "helper" and child["opt_prof"]
    hs.communicate(timeout=300)
    assert hs.returncode == 0
    procs = {p["pid"]: p for p in _manifest(session)["processes"]}
    for pid in pids.values():
        assert procs[pid].get("via") == "helper", procs[pid]
        assert procs[pid]["rounds"] >= 3 and procs[pid]["missed_rounds"] == 0


def test_helper_survives_a_program_that_closes_every_descriptor(
        libjemalloc: Path, helper_built: str, tmp_path: Path) -> None:
    """Daemons close every descriptor they did not open: the helper's socket goes with
    them, and the helper makes a new one (without touching the program's descriptors)."""
    code = ("import os, sys, time\n"
            "os.closerange(3, 65536)\n"
            "r, w = os.pipe()\n"  # the program's own descriptors, at the low numbers
            "print(os.getpid(), r, w, flush=True)\n"
            "time.sleep(6)\n"
            "os.write(w, b'x'); assert os.read(r, 1) == b'x'\n")
    deadline = time.monotonic() + 5
    hs = _run(["-o", str(tmp_path / "s"), "--", PY, "-c", code], tmp_path)
    assert hs.stdout is not None
    pid = int(hs.stdout.readline().split()[0])
    modes = []
    while time.monotonic() < deadline and "helper" not in modes:  # it notices in a second
        modes.append(_status(pid, tmp_path)["attach"]["mode"])
    assert modes[-1] == "helper", modes  # until then the call stub served
    _out, err = hs.communicate(timeout=300)
    assert hs.returncode == 0, err  # its pipe still worked: nothing of it was touched


def test_signals_never_land_on_the_helper_thread(libjemalloc: Path, helper_built: str,
                                                 tmp_path: Path) -> None:
    """A program that blocks SIGTERM in its own threads and takes it with sigwait: the
    kernel never hands it to the helper's thread (which blocks every signal), where its
    default action would end the program."""
    code = ("import os, signal, sys\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
            "print(os.getpid(), flush=True)\n"
            "assert signal.sigwait({signal.SIGTERM}) == signal.SIGTERM\n"
            "print('took it', flush=True)\n")
    hs = _run(["-o", str(tmp_path / "s"), "--", PY, "-c", code], tmp_path)
    assert hs.stdout is not None
    pid = int(hs.stdout.readline())
    time.sleep(0.5)
    os.kill(pid, signal.SIGTERM)
    out, err = hs.communicate(timeout=300)
    assert "took it" in out and hs.returncode == 0, err
