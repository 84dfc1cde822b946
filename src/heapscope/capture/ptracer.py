"""Stop one thread of a process without sending it a signal, check it, point it at the call
stub, and let it go: the moment heapscope holds a process it profiles (x86-64 Linux).

Run as a process of its own (``python -I -S ptracer.py PARAMS OUT``, standard library only),
so that it can be the tracer of heapscope's own children (``run --every``) without heapscope's
other waits taking its events, and so that a heapscope that dies leaves it to finish.

For each process it takes the main thread with ``PTRACE_SEIZE`` (never stopped, never sent a
signal: a second heapscope, or a debugger, cannot take it at the same time, so two callers
never race) and tries the threads in turn (idle ones first): ``PTRACE_SEIZE`` and
``PTRACE_INTERRUPT`` stop one thread, no other; its frames (walked by ``unwind``) are
checked against the code it must not be in (the allocator, the loader, the unwinder, fork),
an alternate signal stack and the room the stub needs; the stub, the data block and the
results header are written through ``/proc/PID/mem``; one ``PTRACE_SETREGS`` changes the
instruction pointer and nothing else; ``PTRACE_DETACH`` lets the thread run the stub. A
signal that reaches a held thread is delivered at once with ``PTRACE_CONT``; a group stop
(SIGSTOP) is left in place with ``PTRACE_LISTEN``. No signal is ever generated, so none can
be lost or doubled; if this process dies at any moment, the kernel lets the threads go,
untouched or pointed at a stub that needs nothing more.

Each process's outcome is one line ``@@HEAPSCOPE@@{json}`` appended to OUT.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import errno
import json
import os
import signal
import struct
import sys
import time
from typing import Any

MARK = "@@HEAPSCOPE@@"
PTRACE_CONT, PTRACE_GETREGS, PTRACE_SETREGS, PTRACE_DETACH = 7, 12, 13, 17
PTRACE_SEIZE, PTRACE_INTERRUPT, PTRACE_LISTEN = 0x4206, 0x4207, 0x4208
PTRACE_EVENT_STOP = 128
WALL = 0x40000000
NREGS = 27
ORIG_RAX, RIP, RSP = 15, 16, 19
# DWARF register number -> index in user_regs_struct, for the registers frames are found by.
DWARF_REGS = {3: 5, 6: 4, 7: RSP, 12: 3, 13: 2, 14: 1, 15: 0, 16: RIP}
STOP_SIGNALS = {signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU}
FUTEX = 202
SCAN = 32 * 1024  # bytes of stack above the stack pointer looked at for return addresses
# System calls a thread waits in when it is idle, and that no allocator, loader, unwinder or
# fork code makes (x86-64 numbers): poll, select, pselect6, ppoll, epoll_wait, epoll_pwait,
# epoll_pwait2, nanosleep, clock_nanosleep, pause, rt_sigsuspend, rt_sigtimedwait, accept,
# accept4, recvfrom, recvmsg, recvmmsg, wait4, waitid, io_getevents, io_uring_enter, msgrcv,
# semop, semtimedop. A thread blocked in one of them is not inside that code (a signal
# handler it runs in is looked at through its signal frame): where its stack cannot be
# walked, only allocator words count, which spares it the stale ones earlier calls left.
IDLE_SYSCALLS = frozenset({7, 23, 270, 271, 232, 281, 441, 35, 230, 34, 130, 128, 43, 288,
                           45, 47, 299, 61, 247, 208, 426, 70, 65, 220})

try:  # imported as part of heapscope (tests), or run as a script beside it
    from heapscope.capture import unwind
except ImportError:
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "heapscope_unwind", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         "unwind.py"))
    assert _spec is not None and _spec.loader is not None
    unwind = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(unwind)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


class Gone(Exception):
    """The thread or process went away."""


# Threads left seized but never stopped (in uninterruptible sleep when asked): detached the
# moment they stop, whatever process is being looked at then.
ABANDONED: set[int] = set()


def ptrace(request: int, tid: int, addr: int = 0, data: int | ctypes.Array[Any] = 0) -> None:
    arg = ctypes.cast(data, ctypes.c_void_p) if isinstance(data, ctypes.Array) \
        else ctypes.c_void_p(data)
    ctypes.set_errno(0)
    if _libc.ptrace(request, tid, ctypes.c_void_p(addr), arg) == -1:
        e = ctypes.get_errno()
        if e == errno.ESRCH:
            raise Gone(tid)
        raise OSError(e, os.strerror(e))


class Process:
    """The threads of one process this tracer holds, and their events."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.held: set[int] = set()  # seized
        self.stopped: set[int] = set()  # in a stop PTRACE_INTERRUPT asked for
        self.listening: set[int] = set()  # in a group stop, left there
        self.group_stopped = False
        self.mem = -1

    def seize(self, tid: int) -> None:
        ptrace(PTRACE_SEIZE, tid)
        self.held.add(tid)

    def wait_stop(self, tid: int, timeout: float) -> str:
        """Wait until ``tid`` reports the stop PTRACE_INTERRUPT asked for ("stopped"), a group
        stop ("group"), or ends ("gone"); "late" when it has not stopped by ``timeout`` (a
        thread in uninterruptible sleep). Events of the other held threads are answered
        meanwhile: their signals delivered, their group stops left in place."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                who, status = os.waitpid(-1, WALL | os.WNOHANG)
            except ChildProcessError:
                return "gone"
            if who == 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "late"
                # A tracee's stop sends this process SIGCHLD (blocked in main): woken at once,
                # not at the next tick of a polling loop, so a thread is held no longer than
                # the work on it takes.
                signal.sigtimedwait([signal.SIGCHLD], min(left, 0.05))
                continue
            got = self._event(who, status)
            if who == tid and got is not None:
                return got

    def _event(self, tid: int, status: int) -> str | None:
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            self.held.discard(tid)
            self.listening.discard(tid)
            ABANDONED.discard(tid)
            return "gone"
        if not os.WIFSTOPPED(status):
            return None
        sig = os.WSTOPSIG(status)
        event = status >> 16
        if tid in ABANDONED:
            with contextlib.suppress(OSError):
                ptrace(PTRACE_DETACH, tid, 0, 0 if event == PTRACE_EVENT_STOP else sig)
            ABANDONED.discard(tid)
            return None
        try:
            if event == PTRACE_EVENT_STOP:
                if sig in STOP_SIGNALS:  # a group stop: someone stopped the process
                    self.group_stopped = True
                    ptrace(PTRACE_LISTEN, tid)
                    self.listening.add(tid)
                    return "group"
                self.listening.discard(tid)
                self.stopped.add(tid)
                return "stopped"
            # A signal for a held thread: delivered now, exactly as it came.
            ptrace(PTRACE_CONT, tid, 0, sig)
        except Gone:
            self.held.discard(tid)
        return None

    def release(self, tid: int) -> None:
        """Let ``tid`` go as it is. A thread that runs must be stopped to be detached; one in
        a group stop stays in it."""
        if tid not in self.held:
            return
        try:
            if tid not in self.listening and tid not in self.stopped:
                ptrace(PTRACE_INTERRUPT, tid)
                state = self.wait_stop(tid, 2.0)
                if state == "gone":
                    return
                if state == "late":
                    ABANDONED.add(tid)
                    self.held.discard(tid)
                    return
            ptrace(PTRACE_DETACH, tid)
        except Gone:
            pass
        except OSError:
            pass  # left to the kernel: it detaches everything when this process ends
        self.held.discard(tid)
        self.stopped.discard(tid)
        self.listening.discard(tid)

    def regs(self, tid: int) -> list[int]:
        buf = (ctypes.c_ulonglong * NREGS)()
        ptrace(PTRACE_GETREGS, tid, 0, buf)
        return list(buf)

    def set_pc(self, tid: int, pc: int) -> None:
        """Change the instruction pointer alone, in one write of the register set."""
        buf = (ctypes.c_ulonglong * NREGS)()
        ptrace(PTRACE_GETREGS, tid, 0, buf)
        buf[RIP] = pc
        ptrace(PTRACE_SETREGS, tid, 0, buf)

    def read(self, addr: int, size: int) -> bytes:
        return os.pread(self.mem, size, addr)

    def write(self, addr: int, data: bytes) -> None:
        done = os.pwrite(self.mem, data, addr)
        if done != len(data):
            raise OSError(errno.EIO, f"wrote {done} of {len(data)} bytes at {addr:#x}")


Maps = list[tuple[int, int, str, str, int]]


def read_maps(pid: int) -> Maps:
    """(start, end, perms, path, file offset) of each mapping."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[1], parts[5].strip() if len(parts) > 5 else "",
                        int(parts[2], 16)))
    return out


def mapping_of(maps: Maps, addr: int) -> tuple[int, int, str, str, int] | None:
    for m in maps:
        if m[0] <= addr < m[1]:
            return m
    return None


def syscall_of(pid: int, tid: int) -> int | None:
    """The system call a thread sleeps in (-1: none; None: running or unknown)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/syscall") as f:
            first = f.read().split()[:1]
        return int(first[0]) if first and first[0] != "running" else None
    except (OSError, ValueError):
        return None


def threads(pid: int) -> list[int]:
    """The threads in the order they are tried: asleep in a system call other than a futex
    wait first (idle: the calls delay nothing it was doing), the main thread first among
    equals."""
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []

    def rank(tid: int) -> tuple[int, bool, int]:
        nr = syscall_of(pid, tid)
        return (0 if nr is not None and nr >= 0 and nr != FUTEX else 1, tid != pid, tid)
    return sorted(tids, key=rank)


class Checker:
    """Whether a stopped thread may run the calls."""

    def __init__(self, plan: dict[str, Any]) -> None:
        ranges = sorted((int(lo), int(hi), str(what)) for lo, hi, what in plan["unsafe"])
        self.starts = [r[0] for r in ranges]
        self.ranges = ranges
        self.restorers = {int(r) for r in plan["restorers"]}
        self.highest = max((r[1] for r in ranges), default=0)
        self.stack_needed = int(plan["stack_needed"])

    def where(self, addr: int) -> str | None:
        i = bisect.bisect_right(self.starts, addr) - 1
        # Ranges may nest (a function inside a whole object): look back a little.
        for j in range(i, max(-1, i - 8), -1):
            lo, hi, what = self.ranges[j]
            if lo <= addr < hi:
                return what
        return None

    def problem(self, proc: Process, regs: list[int], maps: Maps,
                objects: Any = None) -> str | None:
        """Why this stopped thread must not run the calls, or None.

        Its instruction pointer must be outside the unsafe code, it must have room below its
        stack pointer, and none of its frames may be in that code or be a signal handler on
        an alternate stack: the frames are walked with the call frame information of the
        code (``objects``, an :class:`unwind.Objects`). Where the walk cannot go on (or
        without ``objects``), every word of the rest of the top of the stack that points
        into unsafe code counts as a return address (a stale one too: the safe side), but
        for a thread blocked in an idle system call only the allocator counts: nothing of
        the loader or the unwinder waits in such calls, and its stale words are many."""
        pc, sp = regs[RIP], regs[RSP]
        what = self.where(pc)
        if what is not None:
            return _inside(what)
        m = mapping_of(maps, sp)
        if m is None or not m[2].startswith("rw"):
            return "its stack pointer is not in writable memory"
        if m[3] != "[stack]" and sp - m[0] < self.stack_needed:
            return "too little stack below its stack pointer"
        scan_from = sp
        if objects is not None:
            start = {dwarf: regs[i] for dwarf, i in DWARF_REGS.items()}
            frames, end, scan_from = unwind.walk(objects, unwind.Memory(proc.read), start,
                                                 self.restorers)
            for fr in frames:
                if fr.signal is not None:
                    interrupted, ss_sp, ss_size = fr.signal
                    if (ss_size and ss_sp <= sp < ss_sp + ss_size) or \
                            mapping_of(maps, interrupted) != m:
                        return "it runs on an alternate signal stack"
                    continue
                what = self.where(fr.pc)
                if what is not None:
                    return _inside(what)
            if end == "done":
                return None
        return self._scan(proc, regs, maps, m, scan_from)

    def _scan(self, proc: Process, regs: list[int], maps: Maps,
              m: tuple[int, int, str, str, int], base: int) -> str | None:
        """The conservative look at the stack from ``base`` (see :meth:`problem`)."""
        sp = regs[RSP]
        idle = regs[ORIG_RAX] in IDLE_SYSCALLS
        top = min(m[1], base + SCAN)
        if top <= base:
            return None
        try:
            raw = proc.read(base, top - base)
        except OSError:
            return "its stack cannot be read"
        words = struct.unpack(f"<{len(raw) // 8}Q", raw[:len(raw) // 8 * 8])
        low = self.starts[0] if self.starts else 1 << 64
        high = self.highest
        marks = self.restorers
        # Most words are data: only those inside the unsafe ranges' span, or a trampoline,
        # are looked at one by one (the thread is held meanwhile).
        hits = [i for i, w in enumerate(words) if low <= w < high or w in marks]
        skip_to = 0
        for i in hits:
            if i < skip_to:
                continue
            word = words[i]
            if word in self.restorers:
                # A signal frame: not return addresses but the interrupted thread's registers
                # and floating-point state. Where it was interrupted counts; the rest is
                # skipped.
                if self._on_alternate_stack(words, i, sp, m, maps):
                    return "it runs on an alternate signal stack"
                what = self.where(words[i + 22]) if i + 22 < len(words) else None
                if what is not None:
                    return _inside(what)
                skip_to = self._after_frame(raw, words, i, base)
                continue
            what = self.where(word)
            if what is not None and (what == "allocator" or not idle):
                return _inside(what)
        return None

    @staticmethod
    def _after_frame(raw: bytes, words: tuple[int, ...], i: int, sp: int) -> int:
        """The word after the signal frame at word ``i`` and its floating-point state."""
        end = i + 55  # return address, ucontext, siginfo
        fp = words[i + 29]  # sigcontext.fpstate
        off = fp - sp
        if off >= 0 and off + 472 <= len(raw):
            magic, size = struct.unpack_from("<II", raw, off + 464)
            if magic == 0x46505853:  # FP_XSTATE_MAGIC1: an XSAVE area of `size` bytes
                end = max(end, (off + size + 7) // 8)
            else:
                end = max(end, (off + 512) // 8)
        return end

    @staticmethod
    def _on_alternate_stack(words: tuple[int, ...], i: int, sp: int,
                            m: tuple[int, int, str, str, int], maps: Maps) -> bool:
        """A signal frame at word ``i`` (its return address into rt_sigreturn): the handler
        runs on an alternate stack when the thread's stack pointer lies in the one the frame
        records, or the interrupted stack pointer is in another mapping."""
        # rt_sigframe: return address, ucontext (flags, link, stack_t {sp, flags, size},
        # sigcontext {r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, ...}).
        if i + 22 >= len(words):
            return True  # a frame cut off by the end of the scan: assume the worst
        ss_sp, ss_size = words[i + 3], words[i + 5]
        interrupted_sp = words[i + 21]
        if ss_size and ss_sp <= sp < ss_sp + ss_size:
            return True
        return mapping_of(maps, interrupted_sp) != m


def _inside(what: str) -> str:
    return "inside the loader, the unwinder or fork" if what == "loader, unwinder or fork" \
        else f"inside the {what}"


def busy(head: bytes, pid: int, alive: set[int], now_ns: int) -> str | None:
    """Why another call must not start now, from the results header, or None. A call is out
    while it runs (started, not done, in a thread of this process that still lives) and from
    the moment a thread was pointed at the stub until it starts: its sequence number (the
    time it was made) is newer than the one that started last (given 10 s: a process stopped
    right after the pointing must not block every later call). A forked child's copy of the
    header names its parent, so it blocks nothing."""
    started, done, rpid, rtid, pointed, pointed_at = struct.unpack_from("<QQQQQQ", head, 8)
    if started != done and rpid == pid and rtid in alive:
        return f"an earlier call is still running in thread {rtid}"
    if pointed > started and 0 <= now_ns - pointed_at < 10**10:
        return "another call is just starting"
    return None


def point(proc: Process, tid: int, regs: list[int], plan: dict[str, Any],
          stub: dict[str, Any]) -> dict[str, Any] | None:
    """Write the stub, the calls and the results header; change the thread's instruction
    pointer. None when done; else an error (and the thread unchanged)."""
    room = plan["room"]
    blob = bytes.fromhex(stub["blob"])
    code_at, res_at = int(room["code"]), int(room["results"])
    now = proc.read(code_at, len(blob))
    if now != blob and now != bytes.fromhex(room["pristine"]):
        return {"error": "room", "message": "the code area is in use"}
    head = proc.read(res_at, 64)
    magic = stub["results_magic"].encode()
    if head[:8] == magic:
        try:
            alive = {int(t) for t in os.listdir(f"/proc/{proc.pid}/task")}
        except OSError:
            alive = set()
        why = busy(head, proc.pid, alive, time.monotonic_ns())
        if why is not None:
            return {"error": "inflight", "message": why}
    elif head != bytes(64):
        return {"error": "room", "message": "the results area is in use"}
    pc, sp = regs[RIP], regs[RSP]
    base = sp - int(stub["red_zone"]) - int(stub["data"])
    block = plan["block"]
    data = bytearray.fromhex(block["data"])
    for off in block["relocs"]:
        struct.pack_into("<Q", data, off, struct.unpack_from("<Q", data, off)[0] + base)
    for off in block["functions"]:
        struct.pack_into("<Q", data, off, int(plan["mallctl"]))
    struct.pack_into("<QQQQ", data, int(stub["block_tid"]), tid, pc, pc - 2, res_at)
    if now != blob:
        proc.write(code_at, blob)  # once: the stub never changes after
    if head[:8] != magic:
        proc.write(res_at, magic)
    proc.write(base, bytes(data))
    emit(proc.pid, phase="pointing", seq=plan["seq"], tid=tid)
    _pause(plan, "written")
    # The one change that makes the thread run the stub.
    proc.set_pc(tid, code_at + int(stub["entry"]))
    # Said before the main thread is let go: a second caller, who must take it first, then
    # waits for this call instead of sharing its results area.
    proc.write(res_at + int(stub["results_pointed"]),
               struct.pack("<QQ", int(plan["seq"]), time.monotonic_ns()))
    _pause(plan, "pointed")
    return None


def _pause(plan: dict[str, Any], phase: str) -> None:
    """Wait at ``phase`` while the thread is held (a test's seam: it kills this process
    there, to show that a thread is never left anywhere but in its own code or the stub)."""
    if plan.get("pause_at") == phase:
        emit(0, phase=f"paused-{phase}")
        time.sleep(float(plan.get("pause_s") or 30))


def one(pid: int, plan: dict[str, Any], stub: dict[str, Any], retries: int,
        retry_delay: float, timeout: float) -> dict[str, Any]:
    """Everything for one process; the line to emit."""
    proc = Process(pid)
    checker = Checker(plan)
    try:
        proc.seize(pid)  # the main thread: only one tracer at a time
    except Gone:
        return {"error": "exited"}
    except OSError as e:
        tracer = _tracer(pid)
        if tracer:
            return {"error": "traced", "message": f"pid {pid} is already traced by pid "
                    f"{tracer} (a debugger?)"}
        return {"error": "attach", "message": f"ptrace: {e.strerror}"}
    held = 0.0  # the longest any thread was held
    tried = 0
    skipped: dict[str, int] = {}
    try:
        proc.mem = os.open(f"/proc/{pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        for attempt in range(retries + 1):
            # Read before any thread is held: the map, the objects' headers and FDE tables.
            maps = read_maps(pid)
            objects = unwind.Objects(unwind.Memory(proc.read), maps)
            objects.prefetch()
            for tid in threads(pid):
                tried += 1
                if tid != pid:
                    try:
                        proc.seize(tid)
                    except Gone:
                        continue
                t_stop = time.monotonic()
                try:
                    ptrace(PTRACE_INTERRUPT, tid)
                except Gone:
                    continue
                state = proc.wait_stop(tid, min(timeout, 2.0))
                if state == "gone":
                    continue
                if state == "group":
                    proc.release(tid)
                    return {"error": "stopped", "message": f"pid {pid} was stopped (SIGSTOP "
                            "or job control) while heapscope looked at it; it is left so"}
                if state == "late":
                    why = f"not stopped within 2 s ({_where_is(pid, tid)})"
                    skipped[why] = skipped.get(why, 0) + 1
                    proc.held.discard(tid)
                    ABANDONED.add(tid)  # let go when it stops, or when this process ends
                    continue
                try:
                    regs = proc.regs(tid)
                    problem = checker.problem(proc, regs, maps, objects)
                    if problem is None:
                        error = point(proc, tid, regs, plan, stub)
                        proc.release(tid)
                        held = max(held, time.monotonic() - t_stop)
                        if error is not None:
                            return {**error, "stopped_s": round(held, 6)}
                        return {"started": True, "seq": plan["seq"], "caller_tid": tid,
                                "symbol": plan["symbol"], "threads": _count_threads(pid),
                                "looked_at": tried,
                                "retries": attempt, "busy_threads": skipped.get(
                                    "inside the allocator", 0),
                                "stopped_s": round(held, 6), "mode": "stub"}
                    skipped[problem] = skipped.get(problem, 0) + 1
                except Gone:
                    continue
                proc.release(tid)
                held = max(held, time.monotonic() - t_stop)
            if attempt < retries:
                # Not held while waiting: the main thread runs, and takes its signals.
                proc.release(pid)
                time.sleep(retry_delay * (1 + attempt))
                try:
                    proc.seize(pid)
                except OSError:
                    return {"error": "traced", "message": f"pid {pid} was taken by another "
                            f"tracer (pid {_tracer(pid)}) while heapscope waited to try "
                            "again"}
        why = "; ".join(f"{n} {what}" for what, n in sorted(skipped.items())) or "none seen"
        return {"error": "busy", "message": f"no thread could run the call ({why})",
                "retries": retries, "busy_threads": skipped.get("inside the allocator", 0)}
    except Gone:
        return {"error": "exited"}
    except OSError as e:
        if not os.path.exists(f"/proc/{pid}"):
            return {"error": "exited"}
        return {"error": "call", "message": f"{e.strerror or e}"}
    finally:
        for tid in sorted(proc.held - {pid}):
            proc.release(tid)
        proc.release(pid)
        if proc.mem >= 0:
            os.close(proc.mem)


def _where_is(pid: int, tid: int) -> str:
    """A thread's state and kernel wait channel, to say why it did not stop."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        with open(f"/proc/{pid}/task/{tid}/wchan") as f:
            wchan = f.read().strip()
    except (OSError, IndexError):
        return "gone"
    return f"state {state}" + (f", in {wchan}" if wchan and wchan != "0" else "")


def _count_threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def _tracer(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


_out = None


def emit(pid: int, **kw: Any) -> None:
    assert _out is not None
    _out.write(MARK + json.dumps(dict(kw, pid=pid)) + "\n")
    _out.flush()


def main(argv: list[str]) -> int:
    global _out
    with open(argv[1]) as f:
        params = json.load(f)
    _out = open(argv[2], "a")  # noqa: SIM115 (open for the life of this process)
    # Nothing meant for heapscope's terminal reaches this process, and a heapscope that dies
    # must not take it down half way through.
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # taken by sigtimedwait
    # A busy machine must not preempt this process while it holds a thread: ahead of
    # ordinary processes where allowed (root), as it is when it is not.
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    for pid_text, plan in params["plans"].items():
        pid = int(pid_text)
        try:
            doc = one(pid, plan, params["stub"], int(params["retries"]),
                      float(params["retry_delay"]), float(params["timeout"]))
        except Exception as e:  # never leave a thread held: say what happened
            doc = {"error": "call", "message": f"{type(e).__name__}: {e}"}
        emit(pid, **doc)
    emit(0, phase="end")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
