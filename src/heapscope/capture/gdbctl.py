"""mallctl calls through gdb: the way for processes the call stub cannot serve (another
architecture than x86-64, no room for the stub, mallctl only in symbols gdb finds).

One gdb run in batch mode (``gdbscript.SCRIPT``) visits each process: it attaches, calls
``mallctl`` on a thread outside the allocator, the loader and the unwinder as an inferior
function call (the other threads run meanwhile), restores that thread's stack pointer and
detaches. Every signal the process is sent meanwhile is passed on (SIGINT and SIGTRAP too),
gdb runs in its own session and writes to a file (a heapscope that dies leaves it to finish),
and heapscope never interrupts gdb while a call runs under it: a thread whose call was cut
short by a dead gdb would return into gdb's dummy frame. Unlike the stub's ``PTRACE_SEIZE``,
gdb's attach stops every thread with SIGSTOP and may send SIGCONT when it detaches: this way
is for where the stub cannot go.
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
from typing import Any

from heapscope.capture.codemap import ALLOC_NAME, UNSAFE_NAME
from heapscope.capture.gdbscript import SCRIPT
from heapscope.capture.mallctl import (
    AttachError,
    CallResult,
    Op,
    killed_by,
    noprof_error,
    proc_state,
    prof_checked,
    result_of,
    with_prof_checks,
)
from heapscope.errors import HeapscopeError, ToolError

MARK = "@@HEAPSCOPE@@"
SYMBOLS = ("_rjem_mallctl", "mallctl")
PTRACE_HINT = (
    "ptrace refused: run as the target's user or root; with Yama, "
    "sysctl kernel.yama.ptrace_scope=0 (currently {scope}); in a container, start it with "
    "--cap-add SYS_PTRACE (CAP_SYS_PTRACE) and a seccomp profile that allows ptrace"
)


def gdb_path() -> str:
    """The gdb executable, or a one-line error naming the package."""
    path = shutil.which("gdb")
    if path is None:
        raise ToolError("gdb not found: heapscope attach drives the target through gdb; "
                        "apt-get install gdb (dnf install gdb, apk add gdb)")
    return path


def yama_scope() -> str:
    """The Yama ptrace scope, for error messages."""
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
    """SIGCONT the target if a dead gdb left it stopped (its attach's SIGSTOP still queued);
    True when that was needed."""
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


def call_each(pids: list[int], ops: list[Op], *, need_prof: bool = True,
              timeout: float = 60.0, retries: int = 5, retry_delay: float = 0.05,
              symbols: tuple[str, ...] = SYMBOLS) -> dict[int, CallResult | HeapscopeError]:
    """The calls ``ops`` in each of ``pids``, in one gdb run (gdb's start-up, a fifth of a
    second, is paid once, and a program's symbols are read once for all its processes).

    ``timeout`` bounds each process while gdb holds it; a call that runs longer is left to
    finish under gdb, which then detaches."""
    gdb = gdb_path()
    out: dict[int, CallResult | HeapscopeError] = {}
    todo = []
    for pid in pids:
        if proc_state(pid) == "T":
            out[pid] = AttachError(
                f"pid {pid} is stopped (state T: SIGSTOP or job control); heapscope attaches "
                "only to running processes and left it as it is")
        else:
            todo.append(pid)
    ops_of = {str(pid): [op.for_pid(pid) for op in with_prof_checks(list(ops), need_prof)]
              for pid in todo}
    params = {"pids": todo, "ops_of": ops_of, "retries": retries, "retry_delay": retry_delay,
              "symbols": list(symbols), "call_timeout": max(1, int(timeout)),
              "no_debug_files": True, "alloc_name": ALLOC_NAME.pattern,
              "unsafe_name": UNSAFE_NAME.pattern}
    if todo:
        out.update(_run(gdb, params, todo, timeout))
    for pid in todo:
        got = out[pid]
        if isinstance(got, CallResult) and need_prof:
            out[pid] = prof_checked(pid, got)
    return {pid: out[pid] for pid in pids}


def _run(gdb: str, params: dict[str, Any], pids: list[int], timeout: float
         ) -> dict[int, CallResult | HeapscopeError]:
    docs: dict[int, dict[str, Any]] = {}
    walls: dict[int, float] = {}
    tmp = tempfile.mkdtemp(prefix="heapscope-gdb-")
    try:
        script = os.path.join(tmp, "attach.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(SCRIPT)
        pfile = os.path.join(tmp, "params.json")
        with open(pfile, "w", encoding="utf-8") as f:
            json.dump(params, f)
        outfile = os.path.join(tmp, "out")
        open(outfile, "w").close()
        env = dict(os.environ, HEAPSCOPE_GDB_PARAMS=pfile, HEAPSCOPE_GDB_OUT=outfile,
                   PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        cmd = [gdb, "-nx", "-nh", "-q", "-batch", "-x", script]
        with open(os.path.join(tmp, "stderr"), "w+b") as errf:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=errf, env=env,
                                        start_new_session=True)
            except OSError as e:
                raise ToolError(f"cannot run gdb: {e.strerror or e}") from None
            stuck, calling, left = _follow(proc, outfile, docs, walls, timeout)
            errf.seek(0)
            err = errf.read().decode("utf-8", "replace")
        killed = proc.returncode is not None and proc.returncode != 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    results: dict[int, CallResult | HeapscopeError] = {}
    for pid in pids:
        resumed = ensure_running(pid, False) if killed else False
        doc = docs.get(pid)
        if doc is not None and "error" in doc:
            results[pid] = _error(pid, doc)
        elif doc is not None:
            results[pid] = result_of(doc, doc.get("results", []), walls.get(pid, 0.0), "call")
        elif stuck == pid and calling and left:
            results[pid] = AttachError(
                f"the call gdb makes in pid {pid} has not returned after {timeout:g} s; gdb "
                "stays attached until it returns, then detaches (the process keeps running)")
        elif stuck == pid:
            results[pid] = AttachError(
                f"gdb did not finish within {timeout:g} s on pid {pid}; it was stopped"
                + (" and the target sent SIGCONT" if resumed else "")
                + " (raise --timeout for huge heaps)")
        elif stuck is not None:
            results[pid] = AttachError(f"pid {pid} was not reached: gdb was stopped on pid "
                                       f"{stuck}, which took over {timeout:g} s")
        else:
            results[pid] = _no_result(pid, err, proc.returncode)
    return results


def _follow(proc: subprocess.Popen[bytes], outfile: str, docs: dict[int, dict[str, Any]],
            walls: dict[int, float], timeout: float) -> tuple[int | None, bool, bool]:
    """Read gdb's result lines until it ends; stop it when one process takes longer than
    ``timeout``, unless a call runs under it then. Returns (the pid it was stuck on, whether
    a call was running, whether gdb was left running)."""
    offset = 0
    partial = b""
    last = time.monotonic()
    calling = False
    current = None
    while True:
        done = proc.poll() is not None
        try:
            with open(outfile, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            data = b""
        offset += len(data)
        *lines, partial = (partial + data).split(b"\n")
        for raw in lines:
            text = raw.decode("utf-8", "replace")
            if not text.startswith(MARK):
                continue
            try:
                doc = json.loads(text[len(MARK):])
            except ValueError:
                continue
            if not isinstance(doc, dict) or not isinstance(doc.get("pid"), int):
                continue
            now = time.monotonic()
            if doc.get("phase") == "calling":
                calling, current = True, doc["pid"]
                continue
            if doc.get("phase") == "begin":
                current = doc["pid"]
                continue
            if doc.get("phase") == "end":
                continue
            calling = False
            docs[doc["pid"]] = doc
            walls[doc["pid"]] = now - last
            last = now
        if done:
            return None, False, False
        if time.monotonic() - last > timeout:
            if calling:
                return current, True, True  # never stopped mid-call
            with contextlib.suppress(OSError):
                proc.terminate()  # gdb detaches from what it holds and quits
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return current, False, False
        time.sleep(0.005)


def _no_result(pid: int, err: str, rc: int | None) -> HeapscopeError:
    if proc_state(pid) in (None, "Z", "X"):
        return AttachError(f"process {pid} exited during the attach")
    if "Python scripting is not supported" in err:
        return ToolError("this gdb has no Python support; install a gdb built with "
                         "Python (Debian's gdb package has it)")
    if rc is not None and rc < 0:
        return AttachError(f"gdb was killed by {killed_by(rc)} before it finished with pid {pid}")
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    last = lines[-1] if lines else f"exit status {rc}"
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
                               + PTRACE_HINT.format(scope=yama_scope()))
        return AttachError(f"cannot attach to pid {pid}: {msg}")
    if gone or kind == "exited":
        return AttachError(f"process {pid} exited during the attach")
    if kind == "nomallctl":
        return AttachError(f"pid {pid} has no jemalloc: neither mallctl nor _rjem_mallctl is "
                           "in the process (run it with LD_PRELOAD=libjemalloc.so.2 and "
                           "MALLOC_CONF=prof:true, or link a jemalloc built with profiling)")
    if kind == "noprof":
        return noprof_error(pid, bool(doc.get("config_prof")))
    if kind == "busy":
        return AttachError(f"pid {pid}: {msg or 'no thread could run the call'} over "
                           f"{doc.get('retries', 0)} retries; try again (or raise --retries)")
    return AttachError(f"the mallctl call in pid {pid} failed: {msg or kind}")
