"""The program gdb's embedded Python runs inside the debugger where the call stub cannot be
used (see ``gdbctl``).

It is text, not code of this package: gdb executes it with its own ``gdb`` module, reading
its parameters (pids, mallctl operations) from the JSON file named by
``$HEAPSCOPE_GDB_PARAMS``, and appends marker lines to the file named by
``$HEAPSCOPE_GDB_OUT`` (a file, not a pipe: gdb must be able to finish and detach if
heapscope dies). For each process it attaches, picks a thread outside the allocator, the
dynamic loader and the unwinder, calls ``mallctl`` on it with scheduler-locking off,
restores that thread's stack pointer, and always detaches.
"""

from __future__ import annotations

SCRIPT = r'''
import json
import os
import random
import re
import sys
import time

import gdb

MARK = "@@HEAPSCOPE@@"
P = json.load(open(os.environ["HEAPSCOPE_GDB_PARAMS"]))
OUT = open(os.environ["HEAPSCOPE_GDB_OUT"], "a")
PIDS = [int(x) for x in P["pids"]]
PID = PIDS[0]

# The allocator's functions, and where a thread must not run our call (the loader, the
# unwinder, fork): heapscope.capture.codemap's patterns, handed over in the parameters.
ALLOC_NAME = re.compile(P["alloc_name"])
UNSAFE_CALLER = re.compile(P["unsafe_name"])
FUTEX = {"x86_64": 202, "aarch64": 98, "i686": 240, "i386": 240, "ppc64le": 221,
         "s390x": 238, "riscv64": 98}.get(os.uname().machine)


def emit(**kw):
    OUT.write(MARK + json.dumps(dict(kw, pid=PID)) + "\n")
    OUT.flush()


def run(cmd):
    return gdb.execute(cmd, to_string=True)


def quiet(cmd):
    try:
        run(cmd)
    except gdb.error:
        pass


for _cmd in ("set confirm off", "set pagination off", "set height 0", "set width 0",
             "set verbose off", "set debuginfod enabled off",
             "set auto-load gdb-scripts off", "set auto-load python-scripts off",
             "set auto-load libthread-db on", "set non-stop off",
             "set scheduler-locking off", "set schedule-multiple off",
             "set unwindonsignal on", "set unwind-on-terminating-exception on",
             # gdb 14+: a bounded inferior call that unwinds itself on timeout.
             f"set direct-call-timeout {int(P['call_timeout'])}", "set unwind-on-timeout on",
             "set print thread-events off", "set print inferior-events off",
             "set breakpoint pending off", "set step-mode off",
             # The injected call is written in C; a Rust, C++ or Go frame must not change
             # how gdb parses it.
             "set language c",
             # Every signal someone sends the process while gdb holds it is the process's:
             # passed on, never a reason to stop. gdb keeps SIGINT and SIGTRAP as
             # stop/nopass even after `handle all`, so they are named too (heapscope never
             # interrupts gdb with SIGINT).
             "handle all nostop noprint pass",
             "handle SIGINT nostop noprint pass",
             "handle SIGTRAP nostop noprint pass"):
    quiet(_cmd)
if P.get("no_debug_files"):
    quiet("set debug-file-directory /nonexistent-heapscope")
# Read the program's own symbols before the target is stopped, and only the libraries'
# that matter once it is (see SOLIBS).
quiet("set auto-solib-add off")
_exe = None


def load_exe():
    """Read the program's symbols unless the previous process ran the same file (the
    processes of one server usually do: the file is read once per gdb run)."""
    global _exe
    try:
        st = os.stat(f"/proc/{PID}/exe")
        key = (st.st_dev, st.st_ino)
    except OSError:
        key = None
    if key is None or key != _exe:
        quiet(f"file /proc/{PID}/exe")
        _exe = key


def frames_of(thread, depth=48):
    """(name, shared object, the interrupted stack pointer for a signal frame or None) of
    the thread's newest frames."""
    thread.switch()
    out = []
    try:
        f = gdb.newest_frame()
    except gdb.error:
        return out
    while f is not None and len(out) < depth:
        try:
            pc = f.pc()
            name = f.name() or ""
            so = gdb.solib_name(pc) or ""
            older = f.older()
            sig_sp = None
            if f.type() == gdb.SIGTRAMP_FRAME:
                sig_sp = int(older.read_register("sp")) if older is not None else 0
            out.append((name, so, sig_sp))
            f = older
        except gdb.error:
            break
    return out


def in_allocator(frames):
    for name, so, _sig in frames:
        base = os.path.basename(so)
        if "jemalloc" in base or ALLOC_NAME.match(name):
            return name or base or "?"
    return None


def unsafe_caller(frames):
    """True when the thread must not run our calls. A signal frame is no reason by itself
    (PostgreSQL before 16 forks its workers from a signal handler, so every one of them runs
    above one for life): the handler's frames and the code it interrupted pass the same
    checks as any other frames, and the interrupted code must be in sight."""
    for i, (name, _so, sig) in enumerate(frames):
        if UNSAFE_CALLER.match(name):
            return True
        if sig is not None and not any(n or so for n, so, _s in frames[i + 1:i + 3]):
            return True
    return False


def syscall_of(tid):
    """The system call the stopped thread is in (-1: none; None: unknown)."""
    try:
        with open(f"/proc/{PID}/task/{tid}/syscall") as f:
            first = f.read().split()[:1]
        return int(first[0]) if first and first[0] != "running" else None
    except (OSError, ValueError):
        return None


def find_mallctl():
    for name in P["symbols"]:
        try:
            text = run(f"info address {name}")
        except gdb.error:
            continue
        m = re.search(r"\bat (?:address )?(0x[0-9a-fA-F]+)", text)
        if m:
            return name, int(m.group(1), 16)
        try:
            v = gdb.parse_and_eval(f"(unsigned long)&{name}")
            return name, int(v)
        except gdb.error:
            continue
    return None, 0


def reg(name):
    return int(gdb.parse_and_eval(f"(unsigned long)${name}"))


# ---- mallctl called through gdb -------------------------------------------------------

class Caller:
    """mallctl calls on one thread, with arguments in a scratch area below its stack."""

    SCRATCH = 16384

    def __init__(self, inferior, addr, thread):
        self.inf = inferior
        self.addr = addr
        self.thread = thread
        thread.switch()
        self.sp = reg("sp")
        self.base = (self.sp - self.SCRATCH) & ~0xF
        run(f"set $sp = {self.base}")
        self.moved = True

    def restore(self):
        if self.moved:
            # After a stop in another thread gdb may have selected that thread: the stack
            # pointer is the calling thread's.
            self.thread.switch()
            run(f"set $sp = {self.sp}")
            self.moved = False

    def put(self, off, data):
        self.inf.write_memory(self.base + off, data)
        return self.base + off

    def cstring(self, addr, limit=4096):
        out = bytearray()
        while len(out) < limit:
            try:
                chunk = bytes(self.inf.read_memory(addr + len(out), 64))
            except gdb.MemoryError:
                chunk = bytes(self.inf.read_memory(addr + len(out), 1))
            end = chunk.find(b"\0")
            if end >= 0:
                out += chunk[:end]
                break
            out += chunk
        return out.decode("utf-8", "replace")

    def call(self, name, kind, value=None, write=False):
        """mallctl(name, old, &oldlen, new, newlen): returns (rc, value read)."""
        size = {"bool": 1, "unsigned": 4, "size_t": 8, "ssize_t": 8, "uint64": 8,
                "str": 8, "none": 0}[kind]
        name_p = self.put(0, name.encode() + b"\0")
        old_p = self.base + 512
        len_p = self.base + 576
        new_p = self.base + 640
        self.put(512, b"\0" * 64)
        newlen = 0
        if write:
            if kind == "str":
                s = value.encode() + b"\0"
                if len(s) > self.SCRATCH - 2048 - 256:
                    raise ValueError("file name too long")
                str_p = self.put(1024, s)
                self.put(640, str_p.to_bytes(8, "little"))
                newlen = 8
            elif kind == "bool":
                self.put(640, bytes([1 if value else 0]))
                newlen = 1
            elif kind != "none" and value is not None:
                self.put(640, int(value).to_bytes(size, "little"))
                newlen = size
            args = f"0, 0, {new_p if newlen else 0}, {newlen}"
        else:
            self.put(576, size.to_bytes(8, "little"))
            args = f"{old_p}, {len_p}, 0, 0"
        self.thread.switch()
        rc = int(gdb.parse_and_eval(
            f"((int (*)(const char *, void *, unsigned long *, void *, unsigned long))"
            f"{self.addr})({name_p}, {args})"))
        if rc != 0 or write:
            return rc, None
        raw = bytes(self.inf.read_memory(old_p, size))
        if kind == "bool":
            return rc, raw[0] != 0
        if kind == "str":
            ptr = int.from_bytes(raw, "little")
            return rc, self.cstring(ptr) if ptr else None
        return rc, int.from_bytes(raw, "little", signed=kind == "ssize_t")


def call_through_gdb(inf, thread, addr, ops):
    results = []
    caller = None
    error = None
    emit(phase="calling")
    try:
        caller = Caller(inf, addr, thread)
        for op in ops:
            rc, val = caller.call(op["name"], op["type"], op.get("value"), op.get("write"))
            results.append({"name": op["name"], "rc": rc, "value": val,
                            "write": bool(op.get("write"))})
    except gdb.error as e:
        msg = str(e)
        kind = "exited" if "exited" in msg or "No such process" in msg else "call"
        error = {"error": kind, "message": msg.splitlines()[0] if msg else kind}
    except (KeyboardInterrupt, ValueError) as e:
        error = {"error": "call", "message": str(e) or "interrupted"}
    finally:
        if caller is not None:
            try:
                caller.restore()
            except gdb.error:
                pass
    return results, error


# ---- one process ----------------------------------------------------------------------

SOLIBS = ("jemalloc", "libc[.-]", "ld-linux", "ld-musl", "libgcc_s", "libunwind", "libpthread")
_all_solibs = False


def attach():
    try:
        run(f"attach {PID}")
    except gdb.error as e:
        return str(e)
    for pattern in SOLIBS:
        quiet(f"sharedlibrary {pattern}")
    return None


def load_all_solibs():
    global _all_solibs
    if not _all_solibs:
        quiet("sharedlibrary")
        _all_solibs = True


def detach():
    try:
        run("detach")
    except gdb.error:
        pass


def candidates(threads):
    """Threads in the order they are tried: asleep in a system call other than a futex
    wait first (an idle thread: the calls delay nothing it was doing), then the others;
    the main thread first among equals."""
    def rank(t):
        nr = syscall_of(t.ptid[1])
        idle = 0 if nr is not None and nr >= 0 and nr != FUTEX else 1
        return (idle, t.ptid[1] != PID, t.ptid[1])
    return sorted(threads, key=rank)


def choose(threads):
    """The thread to run the calls, and what the others were doing."""
    busy = {}
    skipped = []
    for t in candidates(threads):
        fr = frames_of(t)
        if not fr:
            continue
        where = in_allocator(fr)
        if where:
            busy[t.ptid[1]] = where
            continue
        if unsafe_caller(fr):
            skipped.append("in the loader or unwinder")
            continue
        return t, busy, skipped
    return None, busy, skipped


def main():
    global _all_solibs
    _all_solibs = False
    emit(phase="begin")
    load_exe()
    retries = 0
    busy_seen = []
    max_retries = int(P["retries"])
    for attempt in range(max_retries + 1):
        t0 = time.monotonic()
        err = attach()
        if err is not None:
            emit(error="attach", message=err, retries=retries)
            return
        inf = gdb.selected_inferior()
        threads = sorted(inf.threads(), key=lambda t: t.num)
        thread, busy, skipped = choose(threads)
        if busy:
            busy_seen.append(len(busy))
        if thread is None:
            detach()
            if attempt >= max_retries:
                emit(error="busy", message="no thread can run the call: " + (
                     "every thread is inside the allocator" if busy and not skipped
                     else "; ".join(sorted(set(skipped + ["inside the allocator"] *
                                               bool(busy))))),
                     retries=retries, busy=busy, threads=len(threads))
                return
            retries += 1
            time.sleep(P["retry_delay"] * (0.5 + random.random()))
            continue
        break
    name, addr = find_mallctl()
    if not addr:
        # A jemalloc linked into some other library (or a renamed one): look everywhere.
        load_all_solibs()
        name, addr = find_mallctl()
    info = {"symbol": name, "threads": len(threads), "busy_threads": len(busy),
            "busy_where": sorted(set(busy.values()))[:5], "retries": retries,
            "busy_seen": busy_seen, "caller_tid": thread.ptid[1]}
    if not addr:
        detach()
        emit(error="nomallctl", message="no mallctl symbol", **info)
        return
    error = None
    results = []
    try:
        results, error = call_through_gdb(inf, thread, addr, P["ops_of"][str(PID)])
    finally:
        stopped = time.monotonic() - t0
        detach()
    info["stopped_s"] = round(stopped, 4)
    if error is not None:
        error.setdefault("message", error["error"])
        emit(**error, **info)
    else:
        emit(ok=True, results=results, **info)


for PID in PIDS:
    try:
        main()
    except KeyboardInterrupt:
        detach()
        emit(error="interrupted", message="interrupted")
        break
    except Exception as e:  # never leave without detaching
        detach()
        emit(error="call", message=f"{type(e).__name__}: {e}")
emit(phase="end")
'''
