"""What ``heapscope run --every`` says while the program runs: round lines on heapscope's
stderr, with the rounds, processes and dumps the session folder then holds; in a log (a
pipe) at most one every 15 s plus the last, on a terminal one per round; the program's own
stdout untouched. And what ``heapscope leaks`` and ``heapscope timeline`` say while they read
a long series in a log: the count of dumps read, rising to the number the session holds."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e

PY = "/usr/bin/python3"
# A parent and its child, each alive for ~5.5 s: about five rounds of --every 1. Each
# says its line in one write(2): print() makes two (text, then end) when Python runs
# unbuffered (PYTHONUNBUFFERED, set on some CI machines), and the two processes' halves
# can then interleave.
PROGRAM = ("import os, time\n"
           "pid = os.fork()\n"
           "os.write(1, b'child\\n' if pid == 0 else b'parent\\n')\n"
           "keep = []\n"
           "for i in range(55):\n"
           "    keep.append(bytearray(64 * 1024))\n"
           "    time.sleep(0.1)\n"
           "if pid: os.waitpid(pid, 0)\n")
ROUND = re.compile(r"^heapscope: round (\d+) · (\d+) process(?:es)? · (\d+) dumps?\b")


def _cmd(session: Path) -> list[str]:
    return [sys.executable, "-m", "heapscope.cli.main", "run", "-o", str(session),
            "--no-symbolize", "--every", "1", "--", PY, "-c", PROGRAM]


def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"))
    env.pop("HEAPSCOPE_NO_HELPER", None)
    env.pop("HEAPSCOPE_PROGRESS_EVERY", None)  # the default period (15 s) is under test
    return env


def _rounds(text: str) -> list[tuple[int, int, int]]:
    return [(int(m[1]), int(m[2]), int(m[3]))
            for line in text.splitlines() if (m := ROUND.match(line.strip()))]


def _session_truth(session: Path) -> tuple[int, int, set[int]]:
    """(rounds, processes, dumps) of the session: the rounds the longest-lived process went
    through (manifest), the processes that have dumps, and their dumps; plus how many of
    those are final dumps (one that raced the last round's count may be included)."""
    manifest = json.loads((session / "manifest.json").read_text())
    rounds = max(p.get("rounds", 0) for p in manifest["processes"])
    names = [n for n in os.listdir(session / "dumps") if n.endswith(".heap")]
    series = [n for n in names if ".f." not in n]
    pids = {int(n.split(".")[1]) for n in series}
    finals = len(names) - len(series)
    return rounds, len(pids), {len(series) + k for k in range(finals + 1)}


def test_round_lines_in_a_log(libjemalloc: Path, helper_built: str, tmp_path: Path) -> None:
    """stderr a pipe: the first round at once, the last at the end (rate-limited between),
    and what the last line says is what the session holds."""
    session = tmp_path / "s"
    p = subprocess.run(_cmd(session), env=_env(tmp_path), capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.splitlines()) == ["child", "parent"]  # the program's, untouched
    seen = _rounds(p.stderr)
    rounds, processes, dumps = _session_truth(session)
    assert rounds >= 3
    assert seen[0][0] == 1
    # ~5 s of rounds, all within one 15 s period: the first and the last only
    assert len(seen) == 2
    assert seen[-1][0] == rounds
    assert seen[-1][1] == processes == 2
    assert seen[-1][2] in dumps


def test_round_lines_on_a_terminal(libjemalloc: Path, helper_built: str,
                                   tmp_path: Path) -> None:
    """stdout and stderr one terminal (shared with the program): one line per round, in
    order, the last as the session holds it; whole lines, never redrawn."""
    session = tmp_path / "s"
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(_cmd(session), env=_env(tmp_path), stdin=subprocess.DEVNULL,
                                stdout=slave, stderr=slave, close_fds=True)
    finally:
        os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal is gone
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=300) == 0
    text = out.decode("utf-8", "replace").replace("\r\n", "\n")
    # Up to the last round line: what follows is the analysis after the program's exit,
    # whose progress bar a terminal shows when it lasts (a loaded machine) and redraws.
    lines = text.split("\n")
    last = max(i for i, line in enumerate(lines) if ROUND.match(line.strip()))
    rounds_part = "\n".join(lines[:last + 1])
    assert "\r" not in rounds_part and "\x1b[" not in rounds_part, rounds_part
    seen = _rounds(text)
    rounds, processes, dumps = _session_truth(session)
    assert [r for r, _n, _d in seen] == list(range(1, rounds + 1))
    assert seen[-1][1] == processes == 2
    assert seen[-1][2] in dumps
    # The program's own lines reach the terminal whole (each is one write; a line of
    # heapscope's may come just before or after it on a busy machine).
    assert "child\n" in text and "parent\n" in text, text


# --- reading a long series: leaks and timeline count dumps -----------------------------------

STEPS = 48  # manual dumps of the series program, plus its final dump
READING = re.compile(r"^heapscope: reading dumps of pid (\d+), (\d+)/(\d+) dumps\b")


@pytest.fixture(scope="module")
def long_session(tmp_path_factory: pytest.TempPathFactory, gcc: Path,
                 libjemalloc: Path) -> tuple[Path, dict[str, str]]:
    """A session of leakprog/series.c with STEPS manual dumps and its final one."""
    root = tmp_path_factory.mktemp("progress-series").resolve()
    binary = je.build([je.LEAKPROG_DIR / "series.c"], root / "series",
                      ("-O1", "-g", "-fno-omit-frame-pointer"), compiler=gcc,
                      link_flags=["-ldl"])
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(root / "cache"))
    for key in (*je.PROFILING_ENV, "HEAPSCOPE_PROGRESS_EVERY"):
        env.pop(key, None)
    session = root / "session"
    p = subprocess.run([*je.HEAPSCOPE_CMD, "run", "-o", str(session), "--sample", "4k",
                        "--no-symbolize", "--", str(binary), "--step-ms", "1", "cache",
                        str(STEPS)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return session, env


def _counts(stderr: str) -> list[tuple[int, int]]:
    """(dumps read, of how many) of each reading line."""
    return [(int(m[2]), int(m[3])) for line in stderr.splitlines()
            if (m := READING.match(line))]


@pytest.mark.parametrize("command", ["leaks", "timeline"])
def test_reading_lines_count_every_dump(long_session: tuple[Path, dict[str, str]],
                                        tmp_path: Path, command: str) -> None:
    """stderr a pipe, a line at every step ($HEAPSCOPE_PROGRESS_EVERY=0): the count of
    dumps read goes 0, 1, … up to the dumps in the session's folder, never back."""
    session, env = long_session
    total = len([n for n in os.listdir(session / "dumps") if n.endswith(".heap")])
    assert total == STEPS + 1
    argv = (["leaks", str(session)] if command == "leaks"
            else ["timeline", str(session), "-o", str(tmp_path / "t.svg")])
    p = subprocess.run([*je.HEAPSCOPE_CMD, *argv],
                       env=dict(env, HEAPSCOPE_PROGRESS_EVERY="0"), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    seen = _counts(p.stderr)
    assert {of for _done, of in seen} == {total}, p.stderr[-3000:]
    done = [d for d, _of in seen]
    assert done == sorted(done)
    assert sorted(set(done)) == list(range(total + 1))
    assert done[-1] == total

