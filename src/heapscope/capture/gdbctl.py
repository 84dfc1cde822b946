"""Call ``mallctl`` inside a running process through gdb, one bounded gdb process per step.

gdb runs in batch mode with a Python script (``gdbscript.SCRIPT``) that attaches, looks at every
thread's newest frames, detaches and retries a little later while a thread is inside the
allocator, calls ``mallctl`` on a thread outside it with ``scheduler-locking off`` (the other
threads run during the call, so they release whatever lock they hold), restores the thread's
registers and detaches. Safety nets around it: every gdb run is bounded by a timeout (SIGINT
first, which makes gdb unwind the call and detach, then SIGKILL, after which the kernel
detaches); a target found stopped afterwards gets SIGCONT.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from heapscope.capture.gdbscript import SCRIPT
from heapscope.errors import HeapscopeError, ToolError

MARK = "@@HEAPSCOPE@@"
SYMBOLS = ("_rjem_mallctl", "mallctl")

NOPROF_HINT = (
    "restart it with MALLOC_CONF=prof:true (or prof:true,prof_active:false to switch "
    "sampling on later with 'heapscope attach PID start'; _RJEM_MALLOC_CONF for Rust's "
    "tikv-jemallocator): profiling cannot be switched on in a running process (setting "
    "prof.active fails with ENOENT when opt.prof is false)"
)
PTRACE_HINT = (
    "ptrace refused: run as the target's user or root; with Yama, "
    "sysctl kernel.yama.ptrace_scope=0 (currently {scope}); in a container, start it with "
    "--cap-add SYS_PTRACE (CAP_SYS_PTRACE) and a seccomp profile that allows ptrace"
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

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.kind, "value": self.value, "write": self.write}


@dataclass
class CallResult:
    """What one attach returned: each mallctl's rc and value, and how the attach went."""

    values: dict[str, Any]
    rcs: dict[str, int]
    symbol: str
    threads: int
    retries: int
    busy_threads: int
    stopped_s: float
    wall_s: float
    raw: dict[str, Any] = field(default_factory=dict)
    parked_threads: int = 0  # asleep in a condition wait the allocator started (harmless)


def gdb_path() -> str:
    """The gdb executable, or a one-line error naming the package."""
    path = shutil.which("gdb")
    if path is None:
        raise ToolError("gdb not found: heapscope attach drives the target through gdb; "
                        "apt-get install gdb (dnf install gdb, apk add gdb)")
    return path


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


def _yama_scope() -> str:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "no Yama here"


def _thread_states(pid: int) -> dict[int, str]:
    out: dict[int, str] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="utf-8",
                      errors="replace") as f:
                out[int(tid)] = f.read().rsplit(")", 1)[-1].split()[0]
        except (OSError, IndexError, ValueError):
            continue
    return out


def ensure_running(pid: int, was_stopped: bool) -> bool:
    """SIGCONT the target if a dead tracer left it stopped; True when that was needed."""
    if was_stopped:
        return False
    for _ in range(3):
        states = _thread_states(pid)
        if not states or not any(s in ("T", "t") for s in states.values()):
            return False
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGCONT)
    except OSError:
        return False
    return True


def _stop_gdb(proc: subprocess.Popen[str], grace: float, mark: str) -> None:
    """SIGINT (gdb unwinds the inferior call and detaches), then SIGKILL.

    ``mark`` is created first: it tells the script that the SIGINT the target is about to
    stop with is gdb's own interruption, not one sent to the target by someone else (which
    the script hands back to the target after detaching)."""
    with contextlib.suppress(OSError):
        open(mark, "w").close()
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def call(pid: int, ops: list[Op], *, need_prof: bool = True, timeout: float = 60.0,
         retries: int = 5, retry_delay: float = 0.05, symbols: tuple[str, ...] = SYMBOLS
         ) -> CallResult:
    """Attach to ``pid``, run ``ops`` through mallctl, detach; one-line errors for failures."""
    check_pid(pid)
    got = call_each([pid], ops, need_prof=need_prof, timeout=timeout, retries=retries,
                    retry_delay=retry_delay, symbols=symbols)[pid]
    if isinstance(got, HeapscopeError):
        raise got
    return got


def call_each(pids: list[int], ops: list[Op], *, need_prof: bool = True,
              timeout: float = 60.0, retries: int = 5, retry_delay: float = 0.05,
              symbols: tuple[str, ...] = SYMBOLS) -> dict[int, CallResult | HeapscopeError]:
    """``call`` on each of ``pids`` in turn, in one gdb run (gdb's start-up, a fifth of a
    second, is paid once, and a program's symbols are read once for all its processes).

    ``timeout`` bounds each process: the run is stopped when one takes longer, and the
    processes after it get an error saying they were not reached.
    """
    gdb = gdb_path()
    was_stopped = {pid: proc_state(pid) == "T" for pid in pids}
    params = {"pids": pids, "ops": [op.as_dict() for op in ops], "need_prof": need_prof,
              "retries": retries, "retry_delay": retry_delay, "symbols": list(symbols),
              "call_timeout": max(1, int(timeout)), "no_debug_files": True}
    docs: dict[int, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="heapscope-gdb-") as tmp:
        script = os.path.join(tmp, "attach.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(SCRIPT)
        pfile = os.path.join(tmp, "params.json")
        with open(pfile, "w", encoding="utf-8") as f:
            json.dump(params, f)
        env = dict(os.environ, HEAPSCOPE_GDB_PARAMS=pfile, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        cmd = [gdb, "-nx", "-nh", "-q", "-batch", "-x", script]
        with open(os.path.join(tmp, "stderr"), "w+", encoding="utf-8",
                  errors="replace") as errf:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=errf, text=True, env=env,
                                        start_new_session=True)
            except OSError as e:
                raise ToolError(f"cannot run gdb: {e.strerror or e}") from None
            try:
                out, timed_out, walls = _collect(proc, pids, docs, timeout,
                                                 os.path.join(tmp, "interrupting"))
            except BaseException:
                _stop_gdb(proc, grace=10.0, mark=os.path.join(tmp, "interrupting"))
                for pid in pids:
                    ensure_running(pid, was_stopped[pid])
                raise
            errf.seek(0)
            err = errf.read()
    results: dict[int, CallResult | HeapscopeError] = {}
    for pid in pids:
        resumed = ensure_running(pid, was_stopped[pid])
        doc = docs.get(pid)
        if timed_out == pid and (doc is None or doc.get("error") == "interrupted"):
            results[pid] = AttachError(
                f"gdb did not finish within {timeout:g} s on pid {pid}; it was stopped"
                + (" and the target sent SIGCONT" if resumed else "")
                + " (raise --timeout for huge heaps)")
        elif doc is None and timed_out is not None:
            results[pid] = AttachError(f"pid {pid} was not reached: gdb was stopped on pid "
                                       f"{timed_out}, which took over {timeout:g} s")
        elif doc is None:
            results[pid] = _no_result(pid, out, err, proc.returncode)
        elif "error" in doc:
            results[pid] = _error(pid, doc)
        else:
            results[pid] = _result(doc, walls.get(pid, 0.0))
    return results


def _collect(proc: subprocess.Popen[str], pids: list[int], docs: dict[int, dict[str, Any]],
             timeout: float, mark: str) -> tuple[str, int | None, dict[int, float]]:
    """Read gdb's output, a result line per process, into ``docs``; stop gdb when one
    process takes longer than ``timeout``. Returns (the other output, the pid gdb was
    stopped on or None, each process's wall time)."""
    import queue
    import threading

    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True, name="heapscope-gdb-out").start()
    other: list[str] = []
    walls: dict[int, float] = {}
    last = time.monotonic()

    def take(line: str) -> None:
        nonlocal last
        doc = _parse(line)
        if doc is None or not isinstance(doc.get("pid"), int):
            other.append(line)
            return
        now = time.monotonic()
        docs[doc["pid"]] = doc
        walls[doc["pid"]] = now - last
        last = now

    while True:
        try:
            line = lines.get(timeout=max(0.0, last + timeout - time.monotonic()))
        except queue.Empty:
            _stop_gdb(proc, grace=10.0, mark=mark)
            stuck = next((pid for pid in pids if pid not in docs), None)
            # The interrupted process's line, if gdb wrote one while unwinding.
            try:
                while (rest := lines.get(timeout=5.0)) is not None:
                    take(rest)
            except queue.Empty:
                pass
            return "".join(other), stuck, walls
        if line is None:
            proc.wait()
            return "".join(other), None, walls
        take(line)


def _result(doc: dict[str, Any], wall: float) -> CallResult:
    values = {r["name"]: r["value"] for r in doc["results"] if not r["write"]}
    rcs = {r["name"]: r["rc"] for r in doc["results"]}
    return CallResult(values, rcs, doc.get("symbol", ""), doc.get("threads", 0),
                      doc.get("retries", 0), doc.get("busy_threads", 0),
                      float(doc.get("stopped_s", 0.0)), wall, doc,
                      doc.get("parked_threads", 0))


def _parse(out: str) -> dict[str, Any] | None:
    for line in reversed(out.splitlines()):
        if line.startswith(MARK):
            try:
                doc = json.loads(line[len(MARK):])
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def _no_result(pid: int, out: str, err: str, rc: int | None) -> HeapscopeError:
    if proc_state(pid) in (None, "Z", "X"):
        return AttachError(f"process {pid} exited during the attach")
    lines = [ln.strip() for ln in (err + "\n" + out).splitlines()
             if ln.strip() and not ln.startswith(MARK)]
    last = lines[-1] if lines else f"exit status {rc}"
    if "Python scripting is not supported" in err:
        return ToolError("this gdb has no Python support; install a gdb built with "
                         "Python (Debian's gdb package has it)")
    return ToolError(f"gdb failed on pid {pid}: {last}")


def _error(pid: int, doc: dict[str, Any]) -> HeapscopeError:
    kind = doc.get("error")
    msg = str(doc.get("message", "")).strip().splitlines()[0] if doc.get("message") else ""
    gone = proc_state(pid) in (None, "Z", "X")
    if kind == "attach":
        if "No such process" in msg or gone:
            return AttachError(f"process {pid} exited during the attach" if gone and
                               "No such process" not in msg else f"no process with pid {pid}")
        if "Operation not permitted" in msg or "EPERM" in msg:
            return AttachError(f"cannot attach to pid {pid}: "
                               + PTRACE_HINT.format(scope=_yama_scope()))
        return AttachError(f"cannot attach to pid {pid}: {msg}")
    if gone or kind == "exited":
        return AttachError(f"process {pid} exited during the attach")
    if kind == "nomallctl":
        return AttachError(f"pid {pid} has no jemalloc: neither mallctl nor _rjem_mallctl is "
                           "in the process (run it with LD_PRELOAD=libjemalloc.so.2 and "
                           "MALLOC_CONF=prof:true, or link a jemalloc built with profiling)")
    if kind == "noprof":
        if not doc.get("config_prof"):
            return AttachError(f"pid {pid}: its jemalloc was built without profiling "
                               "(config.prof is false); use a jemalloc built with "
                               "--enable-prof (Debian's libjemalloc2 has it)")
        return AttachError(f"pid {pid} was started without heap profiling (opt.prof is "
                           f"false): {NOPROF_HINT}")
    if kind == "busy":
        return AttachError(f"pid {pid}: every thread stayed inside the allocator or the "
                           f"dynamic loader over {doc.get('retries', 0)} retries; try again "
                           "(or raise --retries)")
    return AttachError(f"the mallctl call in pid {pid} failed: {msg or kind}")
