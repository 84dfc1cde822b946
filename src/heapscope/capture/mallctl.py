"""What a mallctl call into a live process is: the operations, their results, the errors.

Shared by the two ways heapscope reaches a process's jemalloc: the control socket of the
helper ``heapscope run`` preloads (:mod:`heapscope.capture.helper`), and gdb with the call
stub for any other process (:mod:`heapscope.capture.gdbctl`); :mod:`heapscope.capture.control`
picks one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from heapscope.errors import HeapscopeError

NOPROF_HINT = (
    "restart it with MALLOC_CONF=prof:true (or prof:true,prof_active:false to switch "
    "sampling on later with 'heapscope attach PID start'; _RJEM_MALLOC_CONF for Rust's "
    "tikv-jemallocator): profiling cannot be switched on in a running process (setting "
    "prof.active fails with ENOENT when opt.prof is false)"
)

class AttachError(HeapscopeError):
    """The target could not be attached to, or its jemalloc cannot do what was asked."""

    exit_code = 4


@dataclass(frozen=True)
class Op:
    """One mallctl: read ``name`` as ``kind``, or write ``value`` to it."""

    name: str
    kind: str  # bool, unsigned, size_t, ssize_t, uint64, str, none
    value: Any = None  # a dict {pid: value} gives each process of call_each its own
    write: bool = False

    def for_pid(self, pid: int) -> dict[str, Any]:
        """The operation as the helper, the stub and the script take it, with this process's
        own value."""
        value = self.value.get(pid) if isinstance(self.value, dict) else self.value
        return {"name": self.name, "type": self.kind, "value": value, "write": self.write}


@dataclass
class CallResult:
    """What one attach returned: each mallctl's rc and value, and how the attach went."""

    values: dict[str, Any]
    rcs: dict[str, int]
    symbol: str
    threads: int
    retries: int
    busy_threads: int  # threads looked at and found inside the allocator
    stopped_s: float  # how long the process was held stopped
    wall_s: float
    raw: dict[str, Any] = field(default_factory=dict)
    mode: str = "stub"  # helper: the control socket; stub: after gdb left; call: under gdb
    caller_tid: int = 0


def result_of(doc: dict[str, Any], results: list[dict[str, Any]], wall: float, mode: str
              ) -> CallResult:
    """A CallResult from a tracer's line about a process and the calls' results."""
    values = {r["name"]: r["value"] for r in results if not r["write"]}
    rcs = {r["name"]: r["rc"] for r in results}
    return CallResult(values, rcs, doc.get("symbol", ""), doc.get("threads", 0),
                      doc.get("retries", 0), doc.get("busy_threads", 0),
                      float(doc.get("stopped_s", 0.0)), wall, doc, mode,
                      doc.get("caller_tid", 0))


def killed_by(rc: int) -> str:
    """The name of the signal a child's negative return code stands for."""
    import signal

    try:
        return signal.Signals(-rc).name
    except ValueError:
        return f"signal {-rc}"


def proc_state(pid: int) -> str | None:
    """The process state letter from /proc/PID/stat (R, S, T, Z …); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            data = f.read()
    except OSError:
        return None
    return data.rsplit(")", 1)[-1].split()[0] if ")" in data else None


def check_pid(pid: int) -> None:
    """Fail in one line when ``pid`` is not a live process."""
    if pid <= 0:
        raise AttachError(f"{pid}: not a process id")
    state = proc_state(pid)
    if state is None:
        raise AttachError(f"no process with pid {pid}")
    if state in ("Z", "X"):
        raise AttachError(f"process {pid} has exited (it is a zombie waiting for its parent)")


def prof_checked(pid: int, r: CallResult) -> CallResult | HeapscopeError:
    """``r``, or the error of a process without heap profiling (its opt.prof and config.prof
    read first, as ``need_prof`` asks)."""
    if r.values.get("opt.prof"):
        return r
    return noprof_error(pid, bool(r.values.get("config.prof")))


def noprof_error(pid: int, config_prof: bool) -> AttachError:
    """A process whose jemalloc cannot profile, or was started without profiling."""
    if not config_prof:
        return AttachError(f"pid {pid}: its jemalloc was built without profiling "
                           "(config.prof is false); use a jemalloc built with "
                           "--enable-prof (Debian's libjemalloc2 has it)")
    return AttachError(f"pid {pid} was started without heap profiling (opt.prof is "
                       f"false): {NOPROF_HINT}")


def with_prof_checks(ops: list[Op], need_prof: bool) -> list[Op]:
    """``ops`` preceded by the reads ``prof_checked`` looks at, when ``need_prof``."""
    return ([Op("opt.prof", "bool"), Op("config.prof", "bool")] if need_prof else []) + ops
