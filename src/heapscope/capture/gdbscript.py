"""The program gdb's embedded Python runs inside the debugger for ``heapscope attach``.

It is text, not code of this package: gdb executes it with its own ``gdb`` module, reading
its parameters (pids, mallctl operations, timeouts, retries) from the JSON file named by
``$HEAPSCOPE_GDB_PARAMS``, and prints one marker line per process with its results, one
process after the other (one gdb start-up for all of them). For each, it attaches, checks
that no thread is inside the allocator (else detaches and retries; a thread asleep in a
condition-variable wait the allocator started, like jemalloc's background thread between
purges, holds no lock and does not count), calls ``mallctl`` on a safe thread with
scheduler-locking off, and always detaches.
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
PIDS = [int(x) for x in P["pids"]]
PID = PIDS[0]

ALLOC_NAME = re.compile(
    r"^(_rjem_)?(je_|malloc|free|cfree|calloc|realloc|reallocarray|mallocx|rallocx|xallocx|"
    r"sdallocx|dallocx|nallocx|posix_memalign|aligned_alloc|memalign|valloc|pvalloc|mallctl|"
    r"malloc_|__libc_malloc|__libc_free|__libc_calloc|__libc_realloc|__libc_memalign|_int_malloc|"
    r"_int_free|_int_realloc|tcache_|arena_|prof_|extent_|extents_|emap_|edata_|ecache_|pac_|pa_|"
    r"sec_|hpa_|hpdata_|large_|bin_|base_|ckh_|tsd_|ctl_|witness_|background_thread|"
    r"imalloc|ifree|isfree|iralloc|ialloc|idalloc|ipalloc|sz_|eset_|rtree_|psset_|"
    r"__rust_alloc|__rust_dealloc|__rust_realloc|__rdl_|__rg_)"
)
# The kernel wait inside a condition-variable wait, and the condition-variable wait itself.
FUTEX_WAIT = re.compile(r"^(__futex_abstimed_wait_common(64)?|__GI___futex_abstimed_wait"
                        r"(_cancelable)?(64)?|__futex_abstimed_wait_cancelable(64)?|futex_wait"
                        r"|__futex_wait|syscall)$")
COND_WAIT = re.compile(r"^(__pthread_cond_wait_common|_{0,3}pthread_cond_(timed|clock)?wait"
                       r"(64)?(@@?GLIBC_[0-9.]+)?)$")
LIBC = re.compile(r"^(libc|libpthread)[.-]")
FUTEX_SYSCALL = {"x86_64": 202, "aarch64": 98, "i686": 240, "i386": 240, "ppc64le": 221,
                 "s390x": 238, "riscv64": 98}
# A thread stopped here must not run our call: it may hold the loader or unwinder locks a
# sampled allocation inside mallctl would take.
UNSAFE_CALLER = re.compile(r"^(_dl_|__GI__dl_|dl_iterate_phdr|__dl_iterate_phdr|_Unwind_|"
                           r"__libc_fork|_Fork|fork|__run_fork_handlers|__libc_dlopen|dlopen|"
                           r"dlclose)")


def emit(**kw):
    sys.stdout.write(MARK + json.dumps(dict(kw, pid=PID)) + "\n")
    sys.stdout.flush()


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
             "handle all nostop noprint pass"):
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


def frames_of(thread, depth=16):
    # (name, shared object, is signal frame) of the newest frames of thread.
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
            out.append((name, so, f.type() == gdb.SIGTRAMP_FRAME))
            f = f.older()
        except gdb.error:
            break
    return out


def in_allocator(frames):
    for name, so, _sig in frames:
        base = os.path.basename(so)
        if "jemalloc" in base or ALLOC_NAME.match(name):
            return name or base or "?"
    return None


def in_futex(tid):
    """True when the thread is blocked in the futex system call (what a condition wait and
    a mutex wait both end in), as the kernel reports it while the thread is stopped."""
    nr = FUTEX_SYSCALL.get(os.uname().machine)
    try:
        with open(f"/proc/{PID}/task/{tid}/syscall") as f:
            first = f.read().split()[:1]
    except OSError:
        return False
    return nr is not None and first == [str(nr)]


def parked(frames, tid):
    """True for a thread asleep in pthread_cond_wait/timedwait called by the allocator (as
    jemalloc's background thread sleeps between purges). Blocked in the futex call there,
    it is either waiting on the condition (pthread_cond_wait has released the allocator's
    mutex) or waiting to take that mutex back from another thread: either way it holds no
    lock a mallctl call could need. Only the C library's own frames may stand between the
    wait and the allocator; anything else inside the allocator is busy."""
    if not frames or not in_futex(tid):
        return False
    cond = False
    for name, so, sig in frames:
        if sig:
            return False
        base = os.path.basename(so)
        if COND_WAIT.match(name):
            cond = True
        elif FUTEX_WAIT.match(name) or (not name and LIBC.match(base)):
            continue
        elif cond:
            return "jemalloc" in base or bool(ALLOC_NAME.match(name))
        else:
            return False
    return False


def unsafe_caller(frames):
    """True when the thread must not run our call. A signal frame is no reason by itself
    (PostgreSQL before 16 forks its workers from a signal handler, so every one of them runs
    above one for life): the handler's frames and the code it interrupted pass the same
    checks as any other frames, and the interrupted code must be in sight."""
    for i, (name, _so, sig) in enumerate(frames):
        if UNSAFE_CALLER.match(name):
            return True
        if sig and not any(n or so for n, so, _s in frames[i + 1:i + 3]):
            return True
    return False


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


class Caller:
    """mallctl calls on one thread, with arguments in a scratch area below its stack."""

    SCRATCH = 16384

    def __init__(self, inferior, addr):
        self.inf = inferior
        self.addr = addr
        self.sp = int(gdb.parse_and_eval("(unsigned long)$sp"))
        self.base = (self.sp - self.SCRATCH) & ~0xF
        run(f"set $sp = {self.base}")
        self.moved = True

    def restore(self):
        if self.moved:
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


# Symbols of the libraries whose frames the safety checks name (the allocator, the C
# library's waits and fork, the dynamic loader, the unwinder). Loading every library's
# symbols would keep the target stopped for as long as that takes (200 ms for CPython).
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


# gdb stops the target on a SIGINT and does not pass it on (its default, kept: gdb's own
# interruption of a call that overran its time is a SIGINT too). One that someone else sent
# while we were attached (pg_ctl stop -m fast, a Ctrl-C) would be lost: it is noted here and
# sent again once we have detached. The caller creates INTERRUPT_MARK before interrupting
# gdb, so its own interruption is never sent on.
INTERRUPT_MARK = os.path.join(os.path.dirname(os.environ["HEAPSCOPE_GDB_PARAMS"]),
                              "interrupting")
_sigint_seen = False


def _on_stop(event):
    global _sigint_seen
    if (isinstance(event, gdb.SignalEvent) and event.stop_signal == "SIGINT"
            and not os.path.exists(INTERRUPT_MARK)):
        _sigint_seen = True


gdb.events.stop.connect(_on_stop)


def detach():
    global _sigint_seen
    try:
        run("detach")
    except gdb.error:
        pass
    if _sigint_seen:
        _sigint_seen = False
        try:
            os.kill(PID, 2)  # SIGINT, handed back to the target it was meant for
        except OSError:
            pass


def main():
    global _all_solibs
    _all_solibs = False
    load_exe()
    retries = 0
    busy_seen = []
    max_retries = int(P["retries"])
    t_attach = None
    for attempt in range(max_retries + 1):
        t0 = time.monotonic()
        err = attach()
        if err is not None:
            emit(error="attach", message=err, retries=retries)
            return
        t_attach = time.monotonic()
        inf = gdb.selected_inferior()
        threads = sorted(inf.threads(), key=lambda t: t.num)
        busy = {}
        safe = []
        asleep = 0
        for t in threads:
            fr = frames_of(t)
            where = in_allocator(fr)
            if where and parked(fr, t.ptid[1]):
                asleep += 1
            elif where:
                busy[t.ptid[1]] = where
            elif not unsafe_caller(fr) and fr:
                safe.append(t)
        if busy:
            busy_seen.append(len(busy))
        if (busy and attempt < max_retries) or not safe:
            if not safe and attempt >= max_retries:
                detach()
                emit(error="busy", message="every thread is inside the allocator or the "
                     "dynamic loader", retries=retries, busy=busy)
                return
            detach()
            retries += 1
            time.sleep(P["retry_delay"] * (0.5 + random.random()))
            continue
        break
    name, addr = find_mallctl()
    if not addr:
        # A jemalloc linked into some other library (or a renamed one): look everywhere.
        load_all_solibs()
        name, addr = find_mallctl()
    if not addr:
        detach()
        emit(error="nomallctl", message="no mallctl symbol", threads=len(threads))
        return
    # Prefer the main thread, else the first thread outside the allocator.
    caller_thread = safe[0]
    caller_tid = caller_thread.ptid[1]
    caller_thread.switch()
    quiet("frame 0")
    results = []
    caller = None
    error = None
    try:
        caller = Caller(inf, addr)
        if P.get("need_prof"):
            rc, prof = caller.call("opt.prof", "bool")
            if rc != 0 or not prof:
                rc2, cprof = caller.call("config.prof", "bool")
                error = {"error": "noprof", "config_prof": bool(cprof) if rc2 == 0 else False,
                         "rc": rc}
        if error is None:
            for op in P["ops"]:
                value = op.get("value")
                if isinstance(value, dict):  # one value per process (a dump path each)
                    value = value.get(str(PID))
                rc, val = caller.call(op["name"], op["type"], value,
                                      op.get("write", False))
                results.append({"name": op["name"], "rc": rc, "value": val,
                                "write": op.get("write", False)})
    except gdb.error as e:
        msg = str(e)
        kind = "exited" if "exited" in msg or "No such process" in msg else "call"
        error = {"error": kind, "message": msg.splitlines()[0] if msg else kind}
    except (KeyboardInterrupt, ValueError) as e:
        error = {"error": "interrupted" if isinstance(e, KeyboardInterrupt) else "call",
                 "message": str(e) or "interrupted"}
    finally:
        if caller is not None:
            try:
                caller.restore()
            except gdb.error:
                pass
        stopped = time.monotonic() - t0
        detach()
    info = {"symbol": name, "threads": len(threads), "busy_threads": len(busy),
            "parked_threads": asleep,
            "busy_where": sorted(set(busy.values()))[:5], "retries": retries,
            "busy_seen": busy_seen, "caller_tid": caller_tid,
            "stopped_s": round(stopped, 4)}
    if error is not None:
        error.setdefault("message", error["error"])
        emit(**error, **info)
    else:
        emit(ok=True, results=results, **info)


# One process after the other; an interrupt (the caller's timeout) ends the run.
for PID in PIDS:
    try:
        main()
    except KeyboardInterrupt:
        detach()
        emit(error="interrupted", message="interrupted")
        break
'''
