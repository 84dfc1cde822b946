"""The agent's targets: found by pid and by pattern, known by pid and start time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from heapscope.agent.targets import Selection, cmdline, find, start_time


def test_pattern_and_pid_find_live_processes() -> None:
    code = "import time; time.sleep(30)  # heapscope-target-probe"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):  # until the child has exec'd (its command line is set)
            if "heapscope-target-probe" in " ".join(cmdline(child.pid)):
                break
            time.sleep(0.01)
        by_pattern = find(Selection(patterns=[re.compile("heapscope-target-probe")]))
        assert [t.pid for t in by_pattern.values()] == [child.pid]
        (t,) = by_pattern.values()
        assert t.start == start_time(child.pid) and t.service.startswith("python")
        assert t.key == f"{t.service}-{child.pid}-{t.start}"
        assert list(find(Selection(pids=[child.pid]))) == [t.key]
    finally:
        child.kill()
        child.wait()
    assert find(Selection(pids=[child.pid])) == {}  # gone: dropped
    assert find(Selection(patterns=[re.compile("heapscope-target-probe")])) == {}


def test_pid_files_are_read_every_round(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    pidfile = tmp_path / "svc.pid"
    try:
        assert find(Selection(pidfiles=[str(pidfile)])) == {}  # not written yet
        pidfile.write_text(f"{child.pid}\n")
        assert [t.pid for t in find(Selection(pidfiles=[str(pidfile)])).values()] == [child.pid]
        pidfile.write_text("not a pid\n")
        assert find(Selection(pidfiles=[str(pidfile)])) == {}
        pidfile.unlink()
        os.mkfifo(pidfile)  # never read blocking
        assert find(Selection(pidfiles=[str(pidfile)])) == {}
    finally:
        child.kill()
        child.wait()


def test_heapscopes_own_tracer_is_never_a_target(tmp_path: Path) -> None:
    """A pattern that names the target's path also matches heapscope's ptracer, whose
    command line carries the target's pid only in a file: the ptracer is never taken."""
    marker = tmp_path / "heapscope-target-probe-2.json"
    marker.write_text("{}")
    code = "import time; time.sleep(30)"
    # The ptracer's command line (python -I -S .../heapscope/capture/ptracer.py PARAMS OUT),
    # with a script of that name that only sleeps.
    tracer = tmp_path / "heapscope" / "capture" / "ptracer.py"
    tracer.parent.mkdir(parents=True)
    tracer.write_text(code)
    fake = subprocess.Popen([sys.executable, "-I", "-S", str(tracer), str(marker), "out"])
    real = subprocess.Popen([sys.executable, "-c", code, str(marker)])
    try:
        for _ in range(200):
            if str(marker) in " ".join(cmdline(real.pid)) and \
                    str(marker) in " ".join(cmdline(fake.pid)):
                break
            time.sleep(0.01)
        found = find(Selection(patterns=[re.compile("heapscope-target-probe-2")]))
        assert [t.pid for t in found.values()] == [real.pid]
    finally:
        for p in (fake, real):
            p.kill()
            p.wait()
