"""mallctl calls into live processes, the safest way each process allows:

1. the control socket of the helper ``heapscope run`` preloads (no stop at all);
2. the call stub, pointed at by a moment's ``PTRACE_SEIZE`` of one thread (x86-64);
3. gdb, calling mallctl under the debugger (other architectures, or no room for the stub).
"""

from __future__ import annotations

import os

from heapscope.capture import gdbctl, helper, stubcall
from heapscope.capture.mallctl import (
    CallResult,
    Op,
    check_pid,
    prof_checked,
    with_prof_checks,
)
from heapscope.errors import HeapscopeError


def call(pid: int, ops: list[Op], *, need_prof: bool = True, timeout: float = 60.0,
         retries: int = 5, retry_delay: float = 0.05) -> CallResult:
    """Run ``ops`` in ``pid``; one-line errors for failures."""
    check_pid(pid)
    got = call_each([pid], ops, need_prof=need_prof, timeout=timeout, retries=retries,
                    retry_delay=retry_delay)[pid]
    if isinstance(got, HeapscopeError):
        raise got
    return got


def call_each(pids: list[int], ops: list[Op], *, need_prof: bool = True,
              timeout: float = 60.0, retries: int = 5, retry_delay: float = 0.05
              ) -> dict[int, CallResult | HeapscopeError]:
    """``ops`` in each of ``pids``: each process with a helper through it, the others with
    the stub (one ptracer run), what is left in one gdb run. ``timeout`` bounds each."""
    out: dict[int, CallResult | HeapscopeError] = {}
    rest: list[int] = []
    # HEAPSCOPE_NO_HELPER: neither preload the helper nor talk to one (the stub's way).
    use_helper = not os.environ.get("HEAPSCOPE_NO_HELPER")
    for pid in pids:
        if not use_helper:
            rest.append(pid)
            continue
        listed = [op.for_pid(pid) for op in with_prof_checks(list(ops), need_prof)]
        try:
            r = helper.call(pid, listed, timeout)
        except helper.NoHelper:
            rest.append(pid)
            continue
        except HeapscopeError as e:
            out[pid] = e
            continue
        out[pid] = prof_checked(pid, r) if need_prof else r
    if rest:
        got, rest = stubcall.call_each(rest, ops, need_prof=need_prof, timeout=timeout,
                                       retries=retries, retry_delay=retry_delay)
        out.update(got)
    if rest:
        out.update(gdbctl.call_each(rest, ops, need_prof=need_prof, timeout=timeout,
                                    retries=retries, retry_delay=retry_delay))
    return {pid: out[pid] for pid in pids}
