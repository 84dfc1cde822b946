"""mallctl calls in processes heapscope did not start, through the call stub (x86-64).

For each process: room for the stub (:mod:`heapscope.capture.stub`), where its code must
not be and where mallctl is (:mod:`heapscope.capture.codemap`), the data block. One
``ptracer`` process then visits them all, holding one thread of each for a moment; this
module reads its lines as they come and each call's results through ``/proc/PID/mem`` as
the call finishes. Nothing here can hurt a target:

- no signal is ever sent, so none is lost or doubled (``PTRACE_SEIZE``/``INTERRUPT``);
- the ptracer runs in its own session and writes to a file, so a heapscope that dies (or a
  Ctrl-C in its terminal) leaves it to finish; a ptracer that dies leaves every thread as it
  was, or pointed at a stub that needs nothing more;
- heapscope stops waiting for a call that does not return (a lock held by a thread that waits
  on I/O), says why, and leaves it to finish by itself.

A process where the stub cannot be used (no room, no mallctl found in its symbol tables) is
returned in ``rest`` for gdb.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from heapscope.capture import stub
from heapscope.capture.codemap import code_map
from heapscope.capture.mallctl import (
    AttachError,
    CallResult,
    Op,
    killed_by,
    noprof_error,
    proc_state,
    result_of,
    with_prof_checks,
)
from heapscope.errors import HeapscopeError

MARK = "@@HEAPSCOPE@@"
# How long a dead ptracer's last process may take to enter the stub it was pointed at.
_ENTRY_GRACE = 2.0
PTRACER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ptracer.py")


@dataclass
class _Pending:
    """One process's progress through the ptracer's run and its stub call."""

    pid: int
    ops: list[dict[str, Any]]
    room: stub.Room
    seq: int
    began: float = 0.0
    doc: dict[str, Any] | None = None  # the ptracer's line for it
    pointed: float = 0.0  # when the ptracer said it points the thread at the stub
    result: CallResult | HeapscopeError | None = None


def call_each(pids: list[int], ops: list[Op], *, need_prof: bool, timeout: float,
              retries: int, retry_delay: float
              ) -> tuple[dict[int, CallResult | HeapscopeError], list[int]]:
    """The calls ``ops`` in each of ``pids``: (results, the pids the stub cannot serve)."""
    if stub.unsupported() is not None or os.environ.get("HEAPSCOPE_NO_STUB"):
        return {}, list(pids)  # HEAPSCOPE_NO_STUB=1: gdb's way, as on other architectures
    out: dict[int, CallResult | HeapscopeError] = {}
    rest: list[int] = []
    pending: list[_Pending] = []
    plans: dict[str, Any] = {}
    for pid in pids:
        state = proc_state(pid)
        if state in (None, "Z", "X"):
            out[pid] = AttachError(f"no process with pid {pid}" if state is None else
                                   f"process {pid} has exited (it is a zombie waiting for its "
                                   "parent)")
            continue
        if state == "T":
            out[pid] = AttachError(
                f"pid {pid} is stopped (state T: SIGSTOP or job control); heapscope attaches "
                "only to running processes and left it as it is")
            continue
        maps = stub.read_maps(pid)
        room = stub.find_room(pid, maps)
        codes = code_map(pid, maps) if isinstance(room, stub.Room) else None
        if not isinstance(room, stub.Room) or codes is None or not codes.mallctl:
            rest.append(pid)
            continue
        listed = [op.for_pid(pid) for op in with_prof_checks(list(ops), need_prof)]
        # When the call was made (CLOCK_MONOTONIC ns): a later call has a larger number, so a
        # header says whether the call pointed at last is newer than the one that started.
        seq = time.monotonic_ns() + len(pending)
        try:
            block = stub.build_block(listed, seq, pid)
        except ValueError as e:
            out[pid] = AttachError(f"pid {pid}: {e}")
            continue
        pending.append(_Pending(pid, listed, room, seq))
        plans[str(pid)] = {"room": room.as_dict(), "block": block.as_dict(), "seq": seq,
                           "mallctl": codes.mallctl, "symbol": codes.symbol,
                           "unsafe": codes.unsafe, "restorers": codes.restorers,
                           "stack_needed": stub.STACK_NEEDED,
                           # Tests kill the ptracer while it holds a thread at this phase.
                           "pause_at": os.environ.get("HEAPSCOPE_TEST_PTRACER_PAUSE", ""),
                           "pause_s": os.environ.get("HEAPSCOPE_TEST_PTRACER_PAUSE_S", "")}
    if pending:
        params = {"plans": plans, "retries": retries, "retry_delay": retry_delay,
                  "timeout": timeout,
                  "stub": {"blob": stub.BLOB.hex(), "results_magic": stub.RESULTS_MAGIC.decode(),
                           "entry": stub.ENTRY, "red_zone": stub.RED_ZONE, "data": stub.DATA,
                           "block_tid": stub.BLOCK_TID,
                           "results_pointed": stub.RESULTS_POINTED}}
        _run(params, pending, timeout)
        for p in pending:
            got = p.result if p.result is not None else AttachError(
                f"pid {p.pid} was not reached")
            if isinstance(got, CallResult) and need_prof and not got.values.get("opt.prof"):
                got = noprof_error(p.pid, bool(got.values.get("config.prof")))
            out[p.pid] = got
    return out, rest


def _run(params: dict[str, Any], order: list[_Pending], timeout: float) -> None:
    tmp = tempfile.mkdtemp(prefix="heapscope-ptrace-")
    try:
        pfile = os.path.join(tmp, "params.json")
        with open(pfile, "w", encoding="utf-8") as f:
            json.dump(params, f)
        outfile = os.path.join(tmp, "out")
        open(outfile, "w").close()
        with open(os.path.join(tmp, "stderr"), "w+b") as errf:
            # Its own session: a Ctrl-C or SIGHUP meant for heapscope never reaches it, and it
            # goes on if heapscope dies. -I -S: no site packages, nothing from the environment.
            proc = subprocess.Popen([sys.executable, "-I", "-S", PTRACER, pfile, outfile],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=errf, start_new_session=True)
            follow = _Follow(proc, outfile, order, timeout)
            try:
                follow.run()
            finally:
                if proc.poll() is None:
                    # Stopping it is harmless at any moment (the kernel lets the threads go).
                    proc.kill()
                proc.wait()
            errf.seek(0)
            err = errf.read().decode("utf-8", "replace").strip()
        for p in order:
            if p.result is None:
                p.result = _no_result(p.pid, err, proc.returncode)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Follow:
    """Reads the ptracer's lines as they come and polls each started stub call."""

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
        now = time.monotonic()
        self.last_line = now
        p = self.by_pid.get(doc["pid"])
        if p is None:
            return
        if doc.get("phase") == "pointing":
            p.pointed = now
            return
        p.doc = doc
        i = self.order.index(p)
        if i + 1 < len(self.order):
            self.order[i + 1].began = now
        if "error" in doc:
            p.result = _error(p.pid, doc)

    def poll(self, tracer_gone: bool) -> None:
        """Read the results of every stub that runs; give up on those past the timeout."""
        now = time.monotonic()
        for p in self.order:
            started = p.doc is not None and bool(p.doc.get("started"))
            if p.result is not None or not (started or (tracer_gone and p.pointed)):
                continue
            try:
                raw = stub.read_memory(p.pid, p.room.results, stub.RESULTS_NEEDED)
            except OSError:
                p.result = AttachError(f"process {p.pid} exited during the attach") \
                    if proc_state(p.pid) in (None, "Z", "X") else AttachError(
                    f"pid {p.pid}: its memory cannot be read to collect the results")
                continue
            state = stub.parse_state(raw)
            since = p.pointed or p.began
            if state.done == p.seq:
                p.result = result_of(p.doc or {"pid": p.pid},
                                     stub.decode(p.ops, raw, p.pid), now - p.began, "stub")
            elif not started and state.started != p.seq and now - since > _ENTRY_GRACE:
                p.result = AttachError(f"the attach to pid {p.pid} ended before its calls "
                                       "began; nothing was changed in the process")
            elif now - since > self.timeout:
                p.result = AttachError(_stuck(p, self.timeout))

    def run(self) -> None:
        delay = 0.0005
        while True:
            gone = self.proc.poll() is not None
            for doc in self.lines():  # read after the poll: its last lines are in
                self.take(doc)
            self.poll(gone)
            open_calls = [p for p in self.order if p.result is None]
            if not open_calls or (gone and not any(
                    (p.doc is not None and p.doc.get("started")) or p.pointed
                    for p in open_calls)):
                return
            if not gone and time.monotonic() - self.last_line > self.timeout + 10:
                return  # the ptracer itself is stuck: stopped by the caller (harmless)
            time.sleep(delay)
            delay = min(0.02, delay * 1.5)


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
    paths = [op["value"] for op in p.ops if op["name"] == "prof.dump" and op.get("value")]
    later = f" (the dump then appears at {paths[0]})" if paths else ""
    return (f"the call in pid {p.pid} has not returned after {timeout:g} s (thread {tid}"
            f"{where}: a lock it needs is held, e.g. by another thread writing a dump); it "
            f"finishes by itself{later} and the process keeps running (raise --timeout for "
            "huge heaps)")


def _no_result(pid: int, err: str, rc: int | None) -> HeapscopeError:
    if proc_state(pid) in (None, "Z", "X"):
        return AttachError(f"process {pid} exited during the attach")
    if rc is not None and rc < 0:
        return AttachError(f"heapscope's ptrace helper was killed by {killed_by(rc)} before it "
                           f"finished with pid {pid}; its threads were left as they were")
    last = err.splitlines()[-1] if err else f"exit status {rc}"
    return AttachError(f"the attach to pid {pid} failed: {last}")


def _error(pid: int, doc: dict[str, Any]) -> HeapscopeError:
    from heapscope.capture.gdbctl import PTRACE_HINT, yama_scope

    kind = doc.get("error")
    msg = str(doc.get("message", "")).strip().splitlines()[0] if doc.get("message") else ""
    if kind == "exited" or proc_state(pid) in (None, "Z", "X"):
        return AttachError(f"process {pid} exited during the attach")
    if kind == "attach":
        return AttachError(f"cannot attach to pid {pid}: " + (
            PTRACE_HINT.format(scope=yama_scope()) if "not permitted" in msg else msg))
    if kind == "busy":
        return AttachError(f"pid {pid}: {msg} over {doc.get('retries', 0)} retries; try "
                           "again (or raise --retries)")
    if kind == "inflight":
        return AttachError(f"pid {pid}: {msg}; try again once it has returned")
    if kind == "room":
        return AttachError(f"pid {pid}: {msg}, so heapscope does not write there")
    if kind in ("traced", "stopped"):
        return AttachError(msg)
    return AttachError(f"the mallctl call in pid {pid} failed: {msg or kind}")
