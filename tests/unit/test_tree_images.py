"""Which image a process of the tree is recorded with when polling and the kernel's exec
events disagree (heapscope.capture.procs.TreeWatcher): the one read last."""

from __future__ import annotations

from heapscope.capture.procevents import ProcEvents
from heapscope.capture.procs import ProcInfo, TreeWatcher

ROOT, CHILD = 1000, 1001
SHELL = ("/usr/bin/dash", ["sh", "-c", "python3 -c 'print(42)'"])
PYTHON = ("/usr/bin/python3.11", ["python3", "-c", "print(42)"])


def _merged(polled_at: float, exec_at: float) -> ProcInfo:
    events = ProcEvents()  # not started: its maps filled as its reader thread would
    events.parent[CHILD] = ROOT
    events.image[CHILD] = (*PYTHON, exec_at)
    watcher = TreeWatcher(ROOT, events=events)
    watcher.procs[CHILD] = ProcInfo(CHILD, ROOT, *SHELL, read_at=polled_at)
    watcher.end()  # never begun: only the events are merged
    return watcher.procs[CHILD]


def test_an_exec_after_the_last_poll_names_the_process() -> None:
    # Polled between sh's fork and its exec, gone before the next poll: the exec event is
    # newer (a CI run reported such a python3 as the shell, a helper).
    info = _merged(polled_at=10.0, exec_at=10.5)
    assert (info.exe, info.cmdline) == PYTHON


def test_a_poll_after_the_exec_keeps_what_it_read() -> None:
    # A server that retitles itself after its exec ("nginx: master process"): the poll's
    # later read is the newer one.
    info = _merged(polled_at=11.0, exec_at=10.5)
    assert (info.exe, info.cmdline) == SHELL
