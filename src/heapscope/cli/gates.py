"""``--fail-on-leak`` and ``--fail-on-live``: the exit status a CI job acts on."""

from __future__ import annotations

import argparse
import os
import sys

from heapscope.analysis.leaks import LeakReport
from heapscope.analysis.processes import QUIET_ROLES
from heapscope.terminal import clean
from heapscope.units import human_bytes, parse_size

LEAK_EXIT = 10  # leaks (or memory left live) above the threshold
UNJUDGED_EXIT = 11  # --fail-on-leak, but no process had a series to judge
UNREADABLE_EXIT = 12  # a process wrote dumps and none of them could be read


def add_gate_options(p: argparse.ArgumentParser, what: str) -> None:
    """Add the two thresholds to a subcommand."""
    p.add_argument("--fail-on-leak", nargs="?", const="0", default=None, metavar="BYTES",
                   help=f"exit {LEAK_EXIT} when sites judged leak (over a series of dumps) "
                        f"gained more than BYTES in {what} (default 0); exit {UNJUDGED_EXIT} "
                        "when no process has a series to judge")
    p.add_argument("--fail-on-live", default=None, metavar="BYTES",
                   help=f"exit {LEAK_EXIT} when more than BYTES are still live in each "
                        "process's last dump (runtime start-up, inherited and suppressed "
                        "memory aside): the CI use of jemalloc's leak summary at exit")


def thresholds(args: argparse.Namespace, paths: list[str] | None = None
               ) -> tuple[int | None, int | None]:
    """(--fail-on-leak, --fail-on-live) in bytes; a path that --fail-on-leak's optional
    value swallowed (``--fail-on-leak SESSION``) goes back to ``paths``."""
    leak: int | None = None
    value = args.fail_on_leak
    if value is not None:
        if value == "0":
            leak = 0
        elif paths is not None and os.path.exists(value) and not value.strip().isdigit():
            paths.insert(0, value)
            leak = 0
        else:
            leak = parse_size(value, "--fail-on-leak")
    live = parse_size(args.fail_on_live, "--fail-on-live") if args.fail_on_live else None
    return leak, live


def gate(report: LeakReport, leak: int | None, live: int | None) -> int:
    """The exit status the thresholds ask for (0 when none is crossed), with one line each.
    A process whose dumps could not be read fails whatever the thresholds: nobody looked."""
    status = 0
    for p in report.processes:
        if p.unreadable:
            print(f"heapscope: no dump of pid {p.pid} could be read ({clean(p.unreadable)}): "
                  f"exit {UNREADABLE_EXIT}", file=sys.stderr)
            status = UNREADABLE_EXIT
    if leak is not None:
        held = report.leak_bytes
        judged = [p for p in report.processes if p.judged >= 2]
        unjudged = [p for p in report.processes
                    if p.dumps and p.judged < 2 and p.role not in QUIET_ROLES]
        if held > leak:
            print(f"heapscope: leaks hold {human_bytes(held)} ({int(held)} bytes > {leak}): "
                  f"exit {LEAK_EXIT}", file=sys.stderr)
            status = status or LEAK_EXIT
        elif missing := report.unexamined:
            print(f"heapscope: {len(missing)} process(es) left no dump to examine (pid "
                  f"{', '.join(str(p.pid) for p in missing[:8])}): nothing rules a leak out "
                  f"there: exit {UNREADABLE_EXIT}", file=sys.stderr)
            status = status or UNREADABLE_EXIT
        elif blind := [p for p in report.processes if p.verdict == "undecided"
                       and not p.fail_bytes and p.role not in QUIET_ROLES]:
            print(f"heapscope: pid {blind[0].pid}: {blind[0].why_undecided()}; nothing "
                  f"rules a leak out: exit {UNJUDGED_EXIT}", file=sys.stderr)
            status = status or UNJUDGED_EXIT
        elif not judged:
            print("heapscope: --fail-on-leak needs a series of dumps and every process has "
                  "one: nothing could be judged (take dumps as it runs: run --every SECONDS, "
                  f"or use --fail-on-live BYTES): exit {UNJUDGED_EXIT}", file=sys.stderr)
            status = status or UNJUDGED_EXIT
        elif unjudged:
            pids = ", ".join(str(p.pid) for p in unjudged[:8])
            print(f"heapscope: note: {len(unjudged)} process(es) with a single dump were not "
                  f"judged for leaks (pid {pids})", file=sys.stderr)
    if live is not None and report.left_bytes > live:
        print(f"heapscope: {human_bytes(report.left_bytes)} still live in the last dumps "
              f"({int(report.left_bytes)} bytes > {live}): exit {LEAK_EXIT}", file=sys.stderr)
        status = status or LEAK_EXIT
    return status
