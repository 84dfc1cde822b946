"""The call stub's heapscope side: its bytes, the room it takes in a process, the data block it
is given, the results it leaves; and the code map the ptracer checks threads against.

The room and the code map are read from this very test process (a real process with a real
memory map), and checked against what the kernel and the C library say about it.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import struct
from pathlib import Path

import pytest

from heapscope.capture import codemap, ptracer, stub
from heapscope.capture.helper import parse_answer, request

SOURCE = Path(stub.__file__).with_name("stub_x86_64.S")


@pytest.mark.skipif(shutil.which("as") is None or shutil.which("objcopy") is None,
                    reason="GNU as/objcopy not installed: apt-get install binutils")
def test_bytes_are_the_assembled_source() -> None:
    assert stub.assemble(str(SOURCE)) == stub.BLOB


def test_entry_points() -> None:
    # The kernel restarts an interrupted system call by moving the instruction pointer back
    # over the 2-byte `syscall`: the byte pair before `entry` must be a 2-byte jump.
    assert stub.BLOB[:8] == stub.CODE_MAGIC
    assert stub.ENTRY - stub.RESTART == 2 and stub.BLOB[stub.RESTART] == 0xEB
    # `lea rsp, [rsp - (128 + DATA)]` at the entry, with the sizes stub.py assumes.
    lea = stub.BLOB[stub.ENTRY:stub.ENTRY + 8]
    assert lea[:4] == bytes.fromhex("488da424")
    assert struct.unpack("<i", lea[4:8])[0] == -(stub.RED_ZONE + stub.DATA)
    # It returns with `ret 128 + DATA`: the stack pointer as the thread had it.
    assert stub.BLOB[-3:] == b"\xc2" + struct.pack("<H", stub.RED_ZONE + stub.DATA)


def test_block_layout_by_hand() -> None:
    ops = [{"name": "opt.prof", "type": "bool", "value": None, "write": False},
           {"name": "prof.dump", "type": "str", "value": "/t/x.heap", "write": True},
           {"name": "prof.reset", "type": "size_t", "value": 12, "write": True},
           {"name": "epoch", "type": "uint64", "value": 1, "write": True}]
    block = stub.build_block(ops, seq=77, pid=4242)
    data = block.data
    assert struct.unpack_from("<QQ", data, 0) == (77, 4242)
    calls = [struct.unpack_from("<7Q", data, stub.CALLS_AT + stub.CALL_SIZE * i)
             for i in range(5)]
    assert calls[4] == (0,) * 7  # the end
    assert block.functions == tuple(stub.CALLS_AT + stub.CALL_SIZE * i for i in range(4))
    # read: mallctl("opt.prof", old, &oldlen=1, 0, 0)
    fn, name, old, oldlen, new, newlen, rec = calls[0]
    assert (fn, new, newlen, rec) == (0, 0, 0, 0)
    assert data[name:name + 9] == b"opt.prof\0"
    assert data[old:old + 8] == bytes(8)
    assert struct.unpack_from("<Q", data, oldlen)[0] == 1
    # write a string: new points at a pointer to the string
    fn, name, old, oldlen, new, newlen, rec = calls[1]
    assert (old, oldlen, newlen, rec) == (0, 0, 8, 1)
    assert data[name:name + 10] == b"prof.dump\0"
    text = struct.unpack_from("<Q", data, new)[0]
    assert data[text:text + 10] == b"/t/x.heap\0"
    # write numbers: 8 bytes for size_t and uint64
    assert struct.unpack_from("<Q", data, calls[2][4])[0] == 12 and calls[2][5] == 8
    assert struct.unpack_from("<Q", data, calls[3][4])[0] == 1 and calls[3][5] == 8
    # Every pointer the ptracer must move by the block's address, and nothing else.
    pointers = {stub.CALLS_AT + stub.CALL_SIZE * i + 8 * k for i, c in enumerate(calls[:4])
                for k in (1, 2, 3, 4) if c[k]} | {new for new in (calls[1][4],)}
    assert set(block.relocs) == pointers
    assert len(data) <= stub.DATA and len(data) % 16 == 0


def test_block_limits() -> None:
    op = {"name": "prof.dump", "type": "str", "value": "x" * 9000, "write": True}
    with pytest.raises(ValueError, match="do not fit"):
        stub.build_block([op], 1, 1)
    many = [{"name": "epoch", "type": "uint64", "value": 1, "write": True}] * 35
    with pytest.raises(ValueError, match="at most 34"):
        stub.build_block(many, 1, 1)


def test_decode_records() -> None:
    # A string the way mallctl returns one: a pointer into the process (this one).
    text = ctypes.create_string_buffer(b"5.3.0-0-gdeadbeef")
    ops = [{"name": "version", "type": "str", "write": False},
           {"name": "opt.prof", "type": "bool", "write": False},
           {"name": "arenas.narenas", "type": "unsigned", "write": False},
           {"name": "opt.lg_prof_interval", "type": "ssize_t", "write": False},
           {"name": "prof.active", "type": "bool", "write": True},
           {"name": "prof.dump", "type": "str", "write": False}]
    raw = bytearray(stub.RESULTS_NEEDED)
    records = [(0, ctypes.addressof(text).to_bytes(8, "little")),
               (0, b"\x01" + b"\xff" * 7),  # a bool is its first byte
               (0, (8).to_bytes(4, "little") + b"\xee" * 4),  # unsigned: 4 bytes
               (0, (-1).to_bytes(8, "little", signed=True)),
               (0, bytes(8)),
               (2, b"junk....")]  # ENOENT: no value
    for i, (rc, value) in enumerate(records):
        struct.pack_into("<q8s", raw, stub.RECORDS_AT + stub.RECORD_SIZE * i, rc, value)
    got = stub.decode(ops, bytes(raw), os.getpid())
    assert [(r["rc"], r["value"]) for r in got] == [
        (0, "5.3.0-0-gdeadbeef"), (0, True), (0, 8), (0, -1), (0, None), (2, None)]


def test_busy_rules() -> None:
    now = 100 * 10**9
    mine = {10, 11}

    def head(started: int, done: int, pid: int, tid: int, pointed: int, at: int) -> bytes:
        return stub.RESULTS_MAGIC + struct.pack("<QQQQQQ", started, done, pid, tid, pointed,
                                                at)

    assert ptracer.busy(head(5, 4, 10, 11, 5, now - 1), 10, mine, now) == \
        "an earlier call is still running in thread 11"
    assert ptracer.busy(head(5, 5, 10, 11, 5, now - 1), 10, mine, now) is None  # finished
    assert ptracer.busy(head(5, 4, 99, 11, 5, now - 1), 10, mine, now) is None  # fork's copy
    assert ptracer.busy(head(5, 4, 10, 12, 5, now - 1), 10, mine, now) is None  # thread gone
    assert ptracer.busy(head(4, 4, 10, 11, 6, now - 10**9), 10, mine, now) == \
        "another call is just starting"
    assert ptracer.busy(head(4, 4, 10, 11, 6, now - 11 * 10**9), 10, mine, now) is None
    # A call that started without its pointing being written (its tracer died in between)
    # leaves an older number in `pointed`: nothing is starting.
    assert ptracer.busy(head(6, 6, 10, 11, 4, now - 10**9), 10, mine, now) is None
    state = stub.parse_state(head(5, 4, 10, 11, 6, 7))
    assert state == stub.State(True, 5, 4, 10, 11, 6, 7)


def test_room_in_a_real_process() -> None:
    room = stub.find_room(os.getpid())
    assert isinstance(room, stub.Room), room
    maps = stub.read_maps(os.getpid())
    code = next(m for m in maps if m.contains(room.code))
    assert code.executable and code.contains(room.code + len(stub.BLOB) - 1)
    results = next(m for m in maps if m.contains(room.results))
    assert results.perms.startswith("rw")
    assert results.contains(room.results + stub.RESULTS_NEEDED - 1)
    # What is there now is what an untouched process has (the stub was never put here), and
    # the results tail is unused: zeros.
    assert stub.read_memory(os.getpid(), room.code, len(stub.BLOB)) == room.pristine
    assert stub.read_memory(os.getpid(), room.results, stub.RESULTS_NEEDED) == \
        bytes(stub.RESULTS_NEEDED)


class _Sigaction(ctypes.Structure):
    _fields_ = [("handler", ctypes.c_void_p), ("flags", ctypes.c_ulong),
                ("restorer", ctypes.c_void_p), ("mask", ctypes.c_ulong)]


def test_code_map_of_a_real_process() -> None:
    """The signal-return trampoline found by its bytes is the one the C library gives the
    kernel for this process's handlers (rt_sigaction's sa_restorer); the loader and the C
    library's dl_iterate_phdr and fork count as places a thread must not run the calls from,
    the C library's own malloc does not (jemalloc, when there is one, is another)."""
    signal.signal(signal.SIGUSR2, lambda *_a: None)
    act = _Sigaction()
    libc = ctypes.CDLL(None, use_errno=True)
    rc = libc.syscall(13, signal.SIGUSR2, None, ctypes.byref(act), 8)  # rt_sigaction
    assert rc == 0
    maps = stub.read_maps(os.getpid())
    cm = codemap.code_map(os.getpid(), maps)
    assert act.restorer in cm.restorers
    loader = next(m for m in maps if "ld-linux" in m.path and m.executable)
    assert (loader.start, loader.limit, "loader") in cm.unsafe
    def where(name: str) -> set[str]:
        addr = ctypes.cast(getattr(libc, name), ctypes.c_void_p).value
        assert addr is not None
        return {what for lo, hi, what in cm.unsafe if lo <= addr < hi}

    assert where("dl_iterate_phdr") == {"loader, unwinder or fork"}
    assert where("fork") == {"loader, unwinder or fork"}
    assert where("malloc") == set() and where("epoll_wait") == set()
    assert cm.mallctl == 0  # no jemalloc in this process


def test_helper_protocol() -> None:
    ops = [{"name": "version", "type": "str", "write": False},
           {"name": "prof.dump", "type": "str", "value": "/a b/c.heap", "write": True},
           {"name": "prof.active", "type": "bool", "value": False, "write": True},
           {"name": "prof.reset", "type": "size_t", "value": 14, "write": True},
           {"name": "epoch", "type": "uint64", "value": 1, "write": True},
           {"name": "prof.lg_sample", "type": "size_t", "write": False},
           {"name": "opt.lg_prof_interval", "type": "ssize_t", "write": False},
           {"name": "thread.tcache.flush", "type": "none", "write": True}]
    assert request(ops) == (b"r t version\n"
                            b"w t prof.dump " + b"/a b/c.heap".hex().encode() + b"\n"
                            b"w b prof.active 0\nw z prof.reset 14\nw q epoch 1\n"
                            b"r z prof.lg_sample\nr s opt.lg_prof_interval\n"
                            b"w n thread.tcache.flush\n\n")
    answer = ("heapscope-ctl 1 4242 4243 mallctl\n"
              f"0 {b'5.3.0'.hex()}\n0 -\n0 -\n0 -\n0 -\n0 14\n0 -1\n2 -\nend\n").encode()
    head, got = parse_answer(ops, answer)
    assert head == {"pid": 4242, "tid": 4243, "symbol": "mallctl"}
    assert [(r["rc"], r["value"]) for r in got] == [
        (0, "5.3.0"), (0, None), (0, None), (0, None), (0, None), (0, 14), (0, -1), (2, None)]
    with pytest.raises(ValueError):
        parse_answer(ops, b"HTTP/1.1 200 OK\n")


class _Stack:
    """A stopped thread's stack for the checker: words at an address."""

    def __init__(self, sp: int, words: list[int]) -> None:
        self.sp = sp
        self.data = struct.pack(f"<{len(words)}Q", *words)

    def read(self, addr: int, size: int) -> bytes:
        off = addr - self.sp
        return self.data[off:off + size]


SP = 0x7FFF00010000
MAPS = [(0x7FFF00000000, 0x7FFF00100000, "rw-p", "[stack]"),
        (0x7F0000000000, 0x7F0000100000, "rw-p", "")]
ALLOC = (0x7E0000001000, 0x7E0000002000, "allocator")
LOADER = (0x7E0000010000, 0x7E0000020000, "loader")
RESTORER = 0x7E0000030000
ENTRY = 0x55000000100  # somewhere in the program


def _checker() -> ptracer.Checker:
    return ptracer.Checker({"unsafe": [ALLOC, LOADER], "restorers": [RESTORER],
                            "stack_needed": stub.STACK_NEEDED})


def _regs(rip: int, orig_rax: int = -1 & (2**64 - 1)) -> list[int]:
    regs = [0] * ptracer.NREGS
    regs[ptracer.RIP], regs[ptracer.RSP], regs[ptracer.ORIG_RAX] = rip, SP, orig_rax
    return regs


def _frame(rip: int, sp: int, ss: tuple[int, int] = (0, 0)) -> list[int]:
    """A signal frame as the kernel lays it out: return address into the trampoline,
    ucontext (flags, link, stack_t, sigcontext with rsp at +21 and rip at +22), sigmask,
    siginfo; registers that point anywhere (here into the loader) are not return addresses."""
    words = [RESTORER, 7, 0, ss[0], 0, ss[1], *[LOADER[0] + 8] * 15, sp, rip]
    return words + [0] * (55 - len(words))


def test_checker_finds_what_a_thread_is_inside() -> None:
    ck = _checker()
    clean = [0x1234, ENTRY, 0x7F0000000100, 0] * 8
    assert ck.problem(_Stack(SP, clean), _regs(ENTRY), MAPS) is None
    # its own instruction pointer
    assert ck.problem(_Stack(SP, clean), _regs(ALLOC[0] + 4), MAPS) == "inside the allocator"
    # a return address into the allocator or the loader further up
    inside = [*clean[:5], ALLOC[0] + 0x10, *clean]
    assert ck.problem(_Stack(SP, inside), _regs(ENTRY), MAPS) == "inside the allocator"
    in_loader = [*clean[:5], LOADER[0] + 0x10, *clean]
    assert ck.problem(_Stack(SP, in_loader), _regs(ENTRY), MAPS) == "inside the loader"


def test_checker_spares_idle_threads_the_loader_words() -> None:
    """Asleep in epoll_wait (232), a word that points into the loader is a stale one; one
    into the allocator still counts."""
    ck = _checker()
    in_loader = [ENTRY, LOADER[0] + 0x10, 0]
    assert ck.problem(_Stack(SP, in_loader), _regs(ENTRY, 232), MAPS) is None
    assert ck.problem(_Stack(SP, in_loader), _regs(ENTRY, 0), MAPS) == "inside the loader"
    in_alloc = [ENTRY, ALLOC[0] + 0x10, 0]
    assert ck.problem(_Stack(SP, in_alloc), _regs(ENTRY, 232), MAPS) == "inside the allocator"


def test_checker_reads_signal_frames() -> None:
    ck = _checker()
    # A handler on the thread's own stack (PostgreSQL's workers): allowed, and the saved
    # registers (pointing into the loader here) are not taken for return addresses.
    own = [ENTRY, 0, *_frame(ENTRY, SP + 0x4000), ENTRY, 0]
    assert ck.problem(_Stack(SP, own), _regs(ENTRY), MAPS) is None
    # The code the handler interrupted was inside the allocator.
    interrupted = [ENTRY, *_frame(ALLOC[0] + 0x20, SP + 0x4000), 0]
    assert ck.problem(_Stack(SP, interrupted), _regs(ENTRY), MAPS) == "inside the allocator"
    # On an alternate stack: the thread's stack pointer lies in the one the frame records,
    # or the stack it interrupted is another mapping.
    alt = [ENTRY, *_frame(ENTRY, SP + 0x4000, ss=(SP - 0x1000, 0x8000)), 0]
    assert ck.problem(_Stack(SP, alt), _regs(ENTRY), MAPS) == \
        "it runs on an alternate signal stack"
    other = [ENTRY, *_frame(ENTRY, 0x7F0000000800), 0]
    assert ck.problem(_Stack(SP, other), _regs(ENTRY), MAPS) == \
        "it runs on an alternate signal stack"


def test_checker_wants_room_below_the_stack_pointer() -> None:
    ck = _checker()
    small = [(SP - 0x1000, SP + 0x1000, "rw-p", "")]
    assert ck.problem(_Stack(SP, [0] * 8), _regs(ENTRY), small) == \
        "too little stack below its stack pointer"
    assert ck.problem(_Stack(SP, [0] * 8), _regs(ENTRY), [(SP - 8, SP + 8, "r--p", "x")]) == \
        "its stack pointer is not in writable memory"
