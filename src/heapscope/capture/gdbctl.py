"""Call ``mallctl`` inside a running process through gdb, without calling it under gdb.

One gdb run in batch mode (``gdbscript.SCRIPT``) visits each process: it attaches, picks a
thread outside the allocator, the loader and the unwinder, writes the call stub
(``stub_x86_64.S``) and the calls into the process, points the thread at the stub and
detaches. The calls then run as ordinary code of the process, and this module reads their
results back through ``/proc/PID/mem``. Nothing here can hurt the target:

- a signal sent to the process while gdb holds it is passed on (none is a reason to stop, and
  there is no call under gdb for it to interrupt);
- gdb's output goes to a file and gdb runs in its own session, so a heapscope that dies (or
  a Ctrl-C in heapscope's terminal) leaves gdb to finish and detach;
- a gdb killed at any moment leaves the thread either untouched or pointed at a stub that
  needs nothing more from outside; a target left in a stop by a dead gdb gets SIGCONT;
- heapscope stops waiting for a call that does not return (a lock held by a thread that
  waits on I/O), says why, and leaves it to finish by itself.

Where the stub cannot be used (another architecture, no room in the process) the calls are
made through gdb, as an inferior function call, and gdb is then never interrupted mid-call.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from heapscope.capture import stub
from heapscope.capture.gdbscript import SCRIPT
from heapscope.capture.mallctl import (
    AttachError,
    CallResult,
    Op,
    noprof_error,
    proc_state,
    prof_checked,
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

# How long a dead gdb's last process may take to enter the stub it was pointed at.
_ENTRY_GRACE = 2.0


def gdb_path() -> str:
    """The gdb executable, or a one-line error naming the package."""
    path = shutil.which("gdb")
    if path is None:
        raise ToolError("gdb not found: heapscope attach drives the target through gdb; "
                        "apt-get install gdb (dnf install gdb, apk add gdb)")
    return path


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


def _stop_gdb(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM (gdb detaches from what it holds and quits), then SIGKILL. Only used while
    no call runs under gdb: stopping gdb is then harmless to the target."""
    if proc.poll() is not None:
        return
    try:
        proc.terminate()
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class _Pending:
    """One process's progress through the gdb run and its stub call."""

    pid: int
    ops: list[dict[str, Any]]
    room: stub.Room | None
    seq: int
    began: float = 0.0
    doc: dict[str, Any] | None = None  # gdb's line for it
    pointed: float = 0.0  # when gdb said it points the thread at the stub
    result: CallResult | HeapscopeError | None = None


def call_each(pids: list[int], ops: list[Op], *, need_prof: bool = True,
              timeout: float = 60.0, retries: int = 5, retry_delay: float = 0.05,
              symbols: tuple[str, ...] = SYMBOLS) -> dict[int, CallResult | HeapscopeError]:
    """The calls ``ops`` in each of ``pids``, in one gdb run (gdb's start-up, a fifth of a second,
    is paid once, and a program's symbols are read once for all its processes).

    ``timeout`` bounds each process: how long it may be held, and how long its calls may
    take once they run.
    """
    gdb = gdb_path()
    was_stopped = {pid: proc_state(pid) == "T" for pid in pids}
    why_not = stub.unsupported()
    pending: dict[int, _Pending] = {}
    plans: dict[str, Any] = {}
    ops_of: dict[str, Any] = {}
    for pid in pids:
        listed = [op.for_pid(pid) for op in with_prof_checks(list(ops), need_prof)]
        room = stub.find_room(pid) if why_not is None else why_not
        p = _Pending(pid, listed, room if isinstance(room, stub.Room) else None,
                     random.getrandbits(62) + 1)
        pending[pid] = p
        ops_of[str(pid)] = listed
        if p.room is not None:
            try:
                block = stub.build_block(listed, p.seq, pid)
            except ValueError as e:
                p.result = AttachError(f"pid {pid}: {e}")
                continue
            plans[str(pid)] = {"room": p.room.as_dict(), "block": block.as_dict(),
                               "seq": p.seq}
    for pid in pids:
        if was_stopped[pid] and pending[pid].result is None:
            # gdb would leave it stopped (as it should) and the calls would wait for a
            # SIGCONT nobody may send: a stopped process is left as it is.
            pending[pid].result = AttachError(
                f"pid {pid} is stopped (state T: SIGSTOP or job control); heapscope attaches "
                "only to running processes and left it as it is")
    todo = [pid for pid in pids if pending[pid].result is None]
    params = {"pids": todo, "ops_of": ops_of, "plans": plans, "retries": retries,
              "retry_delay": retry_delay, "symbols": list(symbols),
              "call_timeout": max(1, int(timeout)), "no_debug_files": True,
              "stub": {"blob": stub.BLOB.hex(), "results_magic": stub.RESULTS_MAGIC.decode(),
                       "slot_resume": stub.SLOT_RESUME, "entry": stub.ENTRY,
                       "red_zone": stub.RED_ZONE, "data": stub.DATA,
                       "stack_needed": stub.STACK_NEEDED}}
    if todo:
        _run_gdb(gdb, params, [pending[pid] for pid in todo], timeout, was_stopped)
    out: dict[int, CallResult | HeapscopeError] = {}
    for pid in pids:
        got = pending[pid].result
        if isinstance(got, CallResult) and need_prof:
            got = prof_checked(pid, got)
        out[pid] = got if got is not None else AttachError(f"pid {pid} was not reached")
    return out


def _run_gdb(gdb: str, params: dict[str, Any], order: list[_Pending], timeout: float,
             was_stopped: dict[int, bool]) -> None:
    """Run the gdb script over ``order`` and follow each process to its result."""
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
                # Its own session: a Ctrl-C or SIGHUP meant for heapscope never reaches gdb,
                # and gdb goes on to detach if heapscope dies.
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=errf, env=env,
                                        start_new_session=True)
            except OSError as e:
                raise ToolError(f"cannot run gdb: {e.strerror or e}") from None
            follow = _Follow(proc, outfile, order, timeout)
            try:
                follow.run()
                if proc.poll() is None and follow.may_stop_gdb():
                    # It has detached from everything and is about to end.
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5)
            finally:
                if follow.may_stop_gdb():
                    _stop_gdb(proc)
                elif proc.poll() is None:
                    follow.leave_gdb()
            errf.seek(0)
            err = errf.read().decode("utf-8", "replace")
        abnormal = proc.returncode is not None and proc.returncode != 0
        for p in order:
            resumed = ensure_running(p.pid, was_stopped[p.pid]) if abnormal else False
            if p.result is None:
                p.result = _no_result(p.pid, err, proc.returncode, follow, resumed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Follow:
    """Reads gdb's result lines as they come and polls each started stub call."""

    def __init__(self, proc: subprocess.Popen[bytes], outfile: str, order: list[_Pending],
                 timeout: float) -> None:
        self.proc = proc
        self.outfile = outfile
        self.order = order
        self.by_pid = {p.pid: p for p in order}
        self.timeout = timeout
        self.offset = 0
        self.partial = b""
        self.last_line = time.monotonic()
        self.calling_under_gdb: int | None = None  # a pid whose call runs under gdb now
        self.gdb_stuck_on: int | None = None
        self.left_behind: list[str] = []
        for p in order:
            p.began = self.last_line

    def lines(self) -> list[dict[str, Any]]:
        try:
            with open(self.outfile, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.partial + data
        *whole, self.partial = data.split(b"\n")
        docs = []
        for line in whole:
            text = line.decode("utf-8", "replace")
            if text.startswith(MARK):
                try:
                    doc = json.loads(text[len(MARK):])
                except ValueError:
                    continue
                if isinstance(doc, dict) and isinstance(doc.get("pid"), int):
                    docs.append(doc)
        return docs

    def take(self, doc: dict[str, Any]) -> None:
        p = self.by_pid.get(doc["pid"])
        now = time.monotonic()
        self.last_line = now
        if p is None:
            return
        phase = doc.get("phase")
        if phase == "calling":
            self.calling_under_gdb = p.pid
            return
        if phase == "pointing":
            p.pointed = now
            return
        if phase == "end":
            return
        self.calling_under_gdb = None
        p.doc = doc
        nxt = self._next(p)
        if nxt is not None:
            nxt.began = now
        if "error" in doc:
            p.result = _error(p.pid, doc)
        elif doc.get("ok"):
            p.result = _result(doc, doc["results"], now - p.began)
        # started: the stub runs now; poll() reads its results

    def _next(self, p: _Pending) -> _Pending | None:
        i = self.order.index(p)
        return self.order[i + 1] if i + 1 < len(self.order) else None

    def poll(self) -> None:
        """Read the results of every stub that runs; give up on those past the timeout."""
        now = time.monotonic()
        gdb_gone = self.proc.poll() is not None
        for p in self.order:
            if p.result is not None or p.room is None:
                continue
            started = p.doc is not None and p.doc.get("started")
            if not started and not (gdb_gone and p.pointed):
                continue
            try:
                head = stub.read_memory(p.pid, p.room.results, stub.RESULTS_NEEDED)
            except OSError:
                p.result = AttachError(f"process {p.pid} exited during the attach") \
                    if proc_state(p.pid) in (None, "Z", "X") else AttachError(
                    f"pid {p.pid}: its memory cannot be read to collect the results")
                continue
            state = stub.parse_state(head)
            since = p.pointed or p.began
            if state.done == p.seq:
                p.result = _result(p.doc or {"pid": p.pid}, stub.decode(p.ops, head, p.pid),
                                   now - p.began)
            elif not started and state.started != p.seq and now - since > _ENTRY_GRACE:
                p.result = AttachError(f"gdb ended before pointing pid {p.pid} at the call; "
                                       "nothing was changed in the process")
            elif now - since > self.timeout:
                p.result = AttachError(_stuck(p, self.timeout))

    def run(self) -> None:
        delay = 0.0005
        while True:
            gdb_done = self.proc.poll() is not None
            for doc in self.lines():  # read after the poll: gdb's last lines are in
                self.take(doc)
            self.poll()
            open_calls = [p for p in self.order if p.result is None]
            if not open_calls or (gdb_done and not any(
                    (p.doc is not None and p.doc.get("started")) or p.pointed
                    for p in open_calls)):
                return
            if (not gdb_done and self.gdb_stuck_on is None
                    and time.monotonic() - self.last_line > self.timeout):
                stuck = next((p for p in self.order if p.doc is None), None)
                self.gdb_stuck_on = stuck.pid if stuck is not None else 0
                if self.calling_under_gdb is not None:
                    return  # never stop gdb mid-call: leave it to finish
                _stop_gdb(self.proc)
                continue
            time.sleep(delay)
            delay = min(0.02, delay * 1.5)

    def may_stop_gdb(self) -> bool:
        """False while a call runs under gdb (the fallback): stopping gdb then would leave the
        thread to return into gdb's dummy frame."""
        return self.calling_under_gdb is None

    def leave_gdb(self) -> None:
        self.left_behind.append(f"gdb (pid {self.proc.pid}) stays attached until the call "
                                "returns, then detaches")


def _stuck(p: _Pending, timeout: float) -> str:
    tid = (p.doc or {}).get("caller_tid", 0)
    if proc_state(p.pid) == "T":
        return (f"pid {p.pid} was stopped (SIGSTOP or job control) before its calls ran; they "
                "run when it is continued, and heapscope did not wait for that")
    where = ""
    try:
        with open(f"/proc/{p.pid}/task/{tid}/wchan", encoding="utf-8") as f:
            wchan = f.read().strip()
        where = f", waiting in the kernel in {wchan}" if wchan and wchan != "0" else ""
    except OSError:
        pass
    return (f"the call in pid {p.pid} has not returned after {timeout:g} s (thread {tid}"
            f"{where}: a lock it needs is held, e.g. by another thread writing a dump); it "
            "finishes by itself and the process keeps running (raise --timeout for huge heaps)")


def _result(doc: dict[str, Any], results: list[dict[str, Any]], wall: float) -> CallResult:
    values = {r["name"]: r["value"] for r in results if not r["write"]}
    rcs = {r["name"]: r["rc"] for r in results}
    return CallResult(values, rcs, doc.get("symbol", ""), doc.get("threads", 0),
                      doc.get("retries", 0), doc.get("busy_threads", 0),
                      float(doc.get("stopped_s", 0.0)), wall, doc, doc.get("mode", "stub"),
                      doc.get("caller_tid", 0))


def _no_result(pid: int, err: str, rc: int | None, follow: _Follow,
               resumed: bool) -> HeapscopeError:
    if proc_state(pid) in (None, "Z", "X"):
        return AttachError(f"process {pid} exited during the attach")
    if follow.gdb_stuck_on == pid:
        if follow.left_behind:
            return AttachError(f"the call gdb makes in pid {pid} has not returned after "
                               f"{follow.timeout:g} s; {follow.left_behind[0]} (the process "
                               "keeps running)")
        return AttachError(f"gdb did not finish within {follow.timeout:g} s on pid {pid}; it "
                           "was stopped" + (" and the target sent SIGCONT" if resumed else "")
                           + " (raise --timeout for huge heaps)")
    if follow.gdb_stuck_on is not None:
        return AttachError(f"pid {pid} was not reached: gdb was stopped on pid "
                           f"{follow.gdb_stuck_on}, which took over {follow.timeout:g} s")
    lines = [ln.strip() for ln in err.splitlines() if ln.strip()]
    if "Python scripting is not supported" in err:
        return ToolError("this gdb has no Python support; install a gdb built with "
                         "Python (Debian's gdb package has it)")
    if rc is not None and rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        return AttachError(f"gdb was killed by {name} before it finished with pid {pid}; the "
                           "process was not changed" + (" (it was left stopped and was sent "
                                                        "SIGCONT)" if resumed else ""))
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
                               + PTRACE_HINT.format(scope=_yama_scope()))
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
    if kind == "inflight":
        return AttachError(f"pid {pid}: {msg}; try again once it has returned")
    if kind == "room":
        return AttachError(f"pid {pid}: {msg}, so heapscope does not write there")
    return AttachError(f"the mallctl call in pid {pid} failed: {msg or kind}")
