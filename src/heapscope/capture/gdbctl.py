"""Call ``mallctl`` inside a running process through gdb, one bounded gdb process per step.

gdb runs in batch mode with a generated Python script (``_SCRIPT``) that attaches, looks at
every thread's newest frames, detaches and retries a little later while a thread is inside the
allocator, calls ``mallctl`` on a thread outside it with ``scheduler-locking off`` (the other
threads run during the call, so they release whatever lock they hold), restores the thread's
registers and detaches. Safety nets around it: every gdb run is bounded by a timeout (SIGINT
first, which makes gdb unwind the call and detach, then SIGKILL, after which the kernel
detaches); a target found stopped afterwards gets SIGCONT.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

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
    value: Any = None
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


def _stop_gdb(proc: subprocess.Popen[str], grace: float) -> tuple[str, str]:
    """SIGINT (gdb unwinds the inferior call and detaches), then SIGKILL."""
    try:
        proc.send_signal(signal.SIGINT)
        return proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def call(pid: int, ops: list[Op], *, need_prof: bool = True, timeout: float = 60.0,
         retries: int = 5, retry_delay: float = 0.05, symbols: tuple[str, ...] = SYMBOLS
         ) -> CallResult:
    """Attach to ``pid``, run ``ops`` through mallctl, detach; one-line errors for failures."""
    gdb = gdb_path()
    check_pid(pid)
    was_stopped = proc_state(pid) == "T"
    params = {"pid": pid, "ops": [op.as_dict() for op in ops], "need_prof": need_prof,
              "retries": retries, "retry_delay": retry_delay, "symbols": list(symbols),
              "call_timeout": max(1, int(timeout)), "no_debug_files": True}
    with tempfile.TemporaryDirectory(prefix="heapscope-gdb-") as tmp:
        script = os.path.join(tmp, "attach.py")
        with open(script, "w", encoding="utf-8") as f:
            f.write(_SCRIPT)
        pfile = os.path.join(tmp, "params.json")
        with open(pfile, "w", encoding="utf-8") as f:
            json.dump(params, f)
        env = dict(os.environ, HEAPSCOPE_GDB_PARAMS=pfile, PYTHONDONTWRITEBYTECODE="1")
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
        cmd = [gdb, "-nx", "-nh", "-q", "-batch", "-x", script]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, env=env,
                                    start_new_session=True)
        except OSError as e:
            raise ToolError(f"cannot run gdb: {e.strerror or e}") from None
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            out, err = _stop_gdb(proc, grace=10.0)
        except BaseException:
            _stop_gdb(proc, grace=10.0)
            ensure_running(pid, was_stopped)
            raise
        wall = time.monotonic() - start
    resumed = ensure_running(pid, was_stopped)
    doc = _parse(out)
    if timed_out and (doc is None or doc.get("error") == "interrupted"):
        raise AttachError(f"gdb did not finish within {timeout:g} s on pid {pid}; it was "
                          "stopped" + (" and the target sent SIGCONT" if resumed else "")
                          + " (raise --timeout for huge heaps)")
    if doc is None:
        return _no_result(pid, out, err, proc.returncode)
    if "error" in doc:
        raise _error(pid, doc)
    values = {r["name"]: r["value"] for r in doc["results"] if not r["write"]}
    rcs = {r["name"]: r["rc"] for r in doc["results"]}
    return CallResult(values, rcs, doc.get("symbol", ""), doc.get("threads", 0),
                      doc.get("retries", 0), doc.get("busy_threads", 0),
                      float(doc.get("stopped_s", 0.0)), wall, doc)


def _parse(out: str) -> dict[str, Any] | None:
    for line in reversed(out.splitlines()):
        if line.startswith(MARK):
            try:
                doc = json.loads(line[len(MARK):])
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def _no_result(pid: int, out: str, err: str, rc: int | None) -> NoReturn:
    if proc_state(pid) in (None, "Z", "X"):
        raise AttachError(f"process {pid} exited during the attach")
    lines = [ln.strip() for ln in (err + "\n" + out).splitlines()
             if ln.strip() and not ln.startswith(MARK)]
    last = lines[-1] if lines else f"exit status {rc}"
    if "Python scripting is not supported" in err:
        raise ToolError("this gdb has no Python support; install a gdb built with Python "
                        "(Debian's gdb package has it)")
    raise ToolError(f"gdb failed on pid {pid}: {last}")


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


# The program gdb's embedded Python runs (parameters in $HEAPSCOPE_GDB_PARAMS).
_SCRIPT = r'''
import json
import os
import random
import re
import sys
import time

import gdb

MARK = "@@HEAPSCOPE@@"
P = json.load(open(os.environ["HEAPSCOPE_GDB_PARAMS"]))
PID = int(P["pid"])

ALLOC_NAME = re.compile(
    r"^(_rjem_)?(je_|malloc|free|cfree|calloc|realloc|reallocarray|mallocx|rallocx|xallocx|"
    r"sdallocx|dallocx|nallocx|posix_memalign|aligned_alloc|memalign|valloc|pvalloc|mallctl|"
    r"malloc_|__libc_malloc|__libc_free|__libc_calloc|__libc_realloc|__libc_memalign|_int_malloc|"
    r"_int_free|_int_realloc|tcache_|arena_|prof_|extent_|extents_|emap_|edata_|ecache_|pac_|pa_|"
    r"sec_|hpa_|hpdata_|large_|bin_|base_|ckh_|tsd_|ctl_|witness_|background_thread|"
    r"imalloc|ifree|isfree|iralloc|ialloc|idalloc|ipalloc|sz_|eset_|rtree_|psset_|"
    r"__rust_alloc|__rust_dealloc|__rust_realloc|__rdl_|__rg_)"
)
# A thread stopped here must not run our call: it may hold the loader or unwinder locks a
# sampled allocation inside mallctl would take, or be inside a signal handler.
UNSAFE_CALLER = re.compile(r"^(_dl_|__GI__dl_|dl_iterate_phdr|__dl_iterate_phdr|_Unwind_|"
                           r"__libc_fork|_Fork|fork|__run_fork_handlers|__libc_dlopen|dlopen|"
                           r"dlclose)")


def emit(**kw):
    sys.stdout.write(MARK + json.dumps(kw) + "\n")
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


def frames_of(thread, depth=10):
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


def unsafe_caller(frames):
    for name, _so, sig in frames:
        if sig or UNSAFE_CALLER.match(name):
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


def attach():
    try:
        run(f"attach {PID}")
        return None
    except gdb.error as e:
        return str(e)


def detach():
    try:
        run("detach")
    except gdb.error:
        pass


def main():
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
        for t in threads:
            fr = frames_of(t)
            where = in_allocator(fr)
            if where:
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
                rc, val = caller.call(op["name"], op["type"], op.get("value"),
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
            "busy_where": sorted(set(busy.values()))[:5], "retries": retries,
            "busy_seen": busy_seen, "caller_tid": caller_tid,
            "stopped_s": round(stopped, 4)}
    if error is not None:
        error.setdefault("message", error["error"])
        emit(**error, **info)
    else:
        emit(ok=True, results=results, **info)


try:
    main()
except KeyboardInterrupt:
    detach()
    emit(error="interrupted", message="interrupted")
'''
