"""Walk a stopped thread's stack with the call frame information of its code (x86-64): the
frames ``ptracer`` checks before a thread may run heapscope's calls.

Standard library only: ``ptracer`` loads it by path in its own process. Everything is read
from the process's memory, as the C runtime's own unwinder reads it: each object's
``PT_GNU_EH_FRAME`` (``.eh_frame_hdr``, whose sorted table finds a code address's FDE) and
the ``.eh_frame`` entries (CIE and FDE instructions, run up to the address). A signal
frame is crossed through the ``ucontext`` the kernel saved (glibc describes its
``__restore_rt`` with expressions, which are not run here). What cannot be unwound (no FDE,
a frame address that is an expression, a frame that does not move up the stack) ends the
walk as ``unknown``: the caller then looks at the rest of the stack the conservative way.
"""

from __future__ import annotations

import bisect
import contextlib
import struct
from collections.abc import Callable
from typing import Any

PT_LOAD, PT_GNU_EH_FRAME = 1, 0x6474E550
RSP, RBP, RBX, RIP = 7, 6, 3, 16
KEPT = (3, 6, 7, 12, 13, 14, 15, 16)  # the registers a caller's frame is found by
# struct sigcontext, from the start of the rt_sigframe (its return address): ucontext at +8,
# its stack_t at +24 (sp, flags, size), sigcontext at +48 (r8..r15, rdi, rsi, rbp, rbx, rdx,
# rax, rcx, rsp, rip).
SC = 48
SC_REG = {12: SC + 32, 13: SC + 40, 14: SC + 48, 15: SC + 56, RBP: SC + 80, RBX: SC + 88,
          RSP: SC + 120, RIP: SC + 128}
MAX_FRAMES = 96

Read = Callable[[int, int], bytes]


class Unknown(Exception):
    """The stack cannot be walked further from here."""


class Memory:
    """Reads of the process's memory, a page at a time, remembered."""

    def __init__(self, read: Read) -> None:
        self._read = read
        self.pages: dict[int, bytes] = {}

    def bytes(self, addr: int, size: int) -> bytes:
        first, last = addr // 4096, (addr + size - 1) // 4096
        if last > first and any(p not in self.pages for p in range(first, last + 1)):
            try:  # a long span (a whole FDE table) in one read
                span = self._read(first * 4096, (last - first + 1) * 4096)
            except OSError as e:
                raise Unknown(f"memory at {addr:#x}: {e}") from None
            for k in range(len(span) // 4096):
                self.pages.setdefault(first + k, span[k * 4096:(k + 1) * 4096])
        out = b""
        while len(out) < size:
            page, off = divmod(addr + len(out), 4096)
            cached = self.pages.get(page)
            if cached is None:
                try:
                    cached = self._read(page * 4096, 4096)
                except OSError as e:
                    raise Unknown(f"memory at {addr:#x}: {e}") from None
                self.pages[page] = cached
            data = cached
            chunk = data[off:off + size - len(out)]
            if not chunk:
                raise Unknown(f"memory at {addr:#x} cannot be read")
            out += chunk
        return out

    def u64(self, addr: int) -> int:
        return int(struct.unpack("<Q", self.bytes(addr, 8))[0])


class _Cursor:
    """Sequential reads of DWARF data in memory."""

    def __init__(self, mem: Memory, addr: int) -> None:
        self.mem = mem
        self.addr = addr

    def fixed(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        value = struct.unpack(fmt, self.mem.bytes(self.addr, size))[0]
        self.addr += size
        return int(value)

    def _leb(self, signed: bool) -> int:
        result = shift = 0
        while True:
            b = self.mem.bytes(self.addr, 1)[0]
            self.addr += 1
            result |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return result - (1 << shift) if signed and b & 0x40 else result

    def uleb(self) -> int:
        return self._leb(False)

    def sleb(self) -> int:
        return self._leb(True)

    def cstring(self) -> bytes:
        out = b""
        while True:
            b = self.mem.bytes(self.addr, 1)
            self.addr += 1
            if b == b"\0":
                return out
            out += b

    def pointer(self, enc: int, data_base: int = 0) -> int:
        """A DW_EH_PE-encoded pointer."""
        if enc == 0xFF:
            raise Unknown("omitted pointer")
        at = self.addr
        fmt = enc & 0x0F
        if fmt == 0x00:
            value = self.fixed("<Q")
        elif fmt == 0x01:
            value = self.uleb()
        elif fmt == 0x09:
            value = self.sleb()
        else:
            value = self.fixed({0x02: "<H", 0x03: "<I", 0x04: "<Q", 0x0A: "<h", 0x0B: "<i",
                                0x0C: "<q"}.get(fmt, "") or _bad(enc))
        app = enc & 0x70
        if app == 0x10:
            value += at
        elif app == 0x30:
            value += data_base
        elif app not in (0x00,):
            raise Unknown(f"pointer encoding {enc:#x}")
        if enc & 0x80:
            value = self.mem.u64(value & (2**64 - 1))
        return value & (2**64 - 1)


def _bad(enc: int) -> str:
    raise Unknown(f"pointer encoding {enc:#x}")


class _Object:
    """One loaded object: its code's address ranges and its .eh_frame_hdr."""

    def __init__(self, ranges: list[tuple[int, int]], hdr: int) -> None:
        self.ranges = ranges
        self.hdr = hdr
        self.table: tuple[list[int], list[int]] | None = None

    def lookup(self, mem: Memory, pc: int) -> int:
        """The address of the FDE that covers ``pc`` (the caller checks the range)."""
        if self.table is None:
            c = _Cursor(mem, self.hdr)
            version = c.fixed("<B")
            ptr_enc, count_enc, table_enc = (c.fixed("<B") for _ in range(3))
            if version != 1:
                raise Unknown(f".eh_frame_hdr version {version}")
            c.pointer(ptr_enc, self.hdr)
            count = c.pointer(count_enc, self.hdr)
            if table_enc != 0x3B:  # datarel | sdata4: what every linker writes
                raise Unknown(f".eh_frame_hdr table encoding {table_enc:#x}")
            raw = mem.bytes(c.addr, 8 * count)
            pairs = struct.unpack(f"<{2 * count}i", raw)
            self.table = ([(self.hdr + v) & (2**64 - 1) for v in pairs[0::2]],
                          [(self.hdr + v) & (2**64 - 1) for v in pairs[1::2]])
        starts, fdes = self.table
        i = bisect.bisect_right(starts, pc) - 1
        if i < 0:
            raise Unknown(f"no FDE for {pc:#x}")
        return fdes[i]


class Objects:
    """The loaded objects of a process, found from its memory map (ELF headers read from
    memory, where the first segment of each object maps them)."""

    def __init__(self, mem: Memory, maps: list[tuple[int, int, str, str, int]]) -> None:
        """``maps``: (start, end, perms, path, file offset) of each mapping."""
        self.mem = mem
        self.objects: list[_Object] = []
        by_path: dict[str, list[tuple[int, int, str, str, int]]] = {}
        for m in maps:
            if m[3] and (not m[3].startswith("[") or m[3] == "[vdso]"):
                by_path.setdefault(m[3], []).append(m)
        for ms in by_path.values():
            first = min(ms, key=lambda m: m[0])
            if first[4] != 0:
                continue
            try:
                found = self._read_headers(first[0])
            except Unknown:
                continue
            if found is None:
                continue
            bias, hdr = found
            ranges = [(m[0], m[1]) for m in ms if "x" in m[2]]
            if ranges:
                self.objects.append(_Object(ranges, bias + hdr))
        self.starts: list[tuple[int, int, _Object]] = sorted(
            (lo, hi, o) for o in self.objects for lo, hi in o.ranges)
        self.keys = [s[0] for s in self.starts]

    def _read_headers(self, start: int) -> tuple[int, int] | None:
        head = self.mem.bytes(start, 64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            return None
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        if phentsize < 56 or phnum > 512:
            return None
        table = self.mem.bytes(start + phoff, phentsize * phnum)
        loads, eh = [], None
        for k in range(phnum):
            p_type, _flags, _off, vaddr = struct.unpack_from("<IIQQ", table, k * phentsize)
            if p_type == PT_LOAD:
                loads.append(vaddr)
            elif p_type == PT_GNU_EH_FRAME:
                eh = vaddr
        if not loads or eh is None:
            return None
        bias = start - (min(loads) & ~0xFFF)
        return bias, eh

    def prefetch(self) -> None:
        """Read every object's FDE table now (before a thread is held)."""
        for o in self.objects:
            with contextlib.suppress(Unknown):
                o.lookup(self.mem, o.ranges[0][0])

    def find(self, pc: int) -> _Object | None:
        i = bisect.bisect_right(self.keys, pc) - 1
        if i >= 0 and self.starts[i][0] <= pc < self.starts[i][1]:
            return self.starts[i][2]
        return None


class _Cie:
    def __init__(self, caf: int, daf: int, ra: int, enc: int, instructions: tuple[int, int],
                 augmented: bool) -> None:
        self.caf, self.daf, self.ra, self.enc = caf, daf, ra, enc
        self.instructions = instructions
        self.augmented = augmented  # FDEs carry augmentation data ('z')


def _cie(mem: Memory, addr: int, cache: dict[int, _Cie]) -> _Cie:
    got = cache.get(addr)
    if got is not None:
        return got
    c = _Cursor(mem, addr)
    length = c.fixed("<I")
    if length == 0xFFFFFFFF:
        raise Unknown("64-bit .eh_frame")
    end = c.addr + length
    if c.fixed("<I") != 0:
        raise Unknown("not a CIE")
    version = c.fixed("<B")
    aug = c.cstring()
    caf = c.uleb()
    daf = c.sleb()
    ra = c.fixed("<B") if version == 1 else c.uleb()
    enc = 0
    if aug.startswith(b"z"):
        size = c.uleb()
        after = c.addr + size
        for ch in aug[1:]:
            if ch == ord("R"):
                enc = c.fixed("<B")
            elif ch == ord("P"):
                c.pointer(c.fixed("<B"))
            elif ch == ord("L"):
                c.fixed("<B")
        c.addr = after
    got = cache[addr] = _Cie(caf, daf, ra, enc, (c.addr, end), aug.startswith(b"z"))
    return got


def rules_at(mem: Memory, fde: int, pc: int, cies: dict[int, _Cie]
             ) -> tuple[tuple[int, int] | None, dict[int, tuple[str, int]], _Cie]:
    """(CFA as (register, offset), or None when an expression; each register's rule; the
    CIE) of the frame of code address ``pc``, which the FDE at ``fde`` must cover."""
    c = _Cursor(mem, fde)
    length = c.fixed("<I")
    if length in (0, 0xFFFFFFFF):
        raise Unknown("empty or 64-bit FDE")
    end = c.addr + length
    cie_at = c.addr - c.fixed("<I")
    cie = _cie(mem, cie_at, cies)
    begin = c.pointer(cie.enc)
    size = c.pointer(cie.enc & 0x0F)
    if not begin <= pc < begin + size:
        raise Unknown(f"no FDE covers {pc:#x}")
    if cie.augmented:
        c.addr += c.uleb()  # augmentation data (the LSDA): of no use here
    cfa: list[Any] = [RSP, 8]
    rules: dict[int, tuple[str, int]] = {}
    initial: dict[int, tuple[str, int]] = {}
    stack: list[tuple[list[Any], dict[int, tuple[str, int]]]] = []

    def run(start: int, stop: int, loc: int) -> bool:
        """Run the instructions from ``start``; False once ``loc`` passes ``pc``."""
        ic = _Cursor(mem, start)
        while ic.addr < stop:
            op = ic.fixed("<B")
            high, low = op & 0xC0, op & 0x3F
            if high == 0x40:
                loc += low * cie.caf
                if loc > pc:
                    return False
            elif high == 0x80:
                rules[low] = ("offset", ic.uleb() * cie.daf)
            elif high == 0xC0:
                if low in initial:
                    rules[low] = initial[low]
                else:
                    rules.pop(low, None)
            elif op == 0x00:
                pass
            elif op == 0x01:
                loc = ic.pointer(cie.enc)
                if loc > pc:
                    return False
            elif op in (0x02, 0x03, 0x04):
                loc += ic.fixed({2: "<B", 3: "<H", 4: "<I"}[op]) * cie.caf
                if loc > pc:
                    return False
            elif op == 0x05:
                reg = ic.uleb()
                rules[reg] = ("offset", ic.uleb() * cie.daf)
            elif op == 0x06:
                reg = ic.uleb()
                if reg in initial:
                    rules[reg] = initial[reg]
                else:
                    rules.pop(reg, None)
            elif op == 0x07:
                rules[ic.uleb()] = ("undefined", 0)
            elif op == 0x08:
                rules[ic.uleb()] = ("same", 0)
            elif op == 0x09:
                reg = ic.uleb()
                rules[reg] = ("register", ic.uleb())
            elif op == 0x0A:
                stack.append((list(cfa), dict(rules)))
            elif op == 0x0B:
                if not stack:
                    raise Unknown("DW_CFA_restore_state without a state")
                saved_cfa, saved = stack.pop()
                cfa[:] = saved_cfa
                rules.clear()
                rules.update(saved)
            elif op == 0x0C:
                cfa[:] = [ic.uleb(), ic.uleb()]
            elif op == 0x0D:
                cfa[0] = ic.uleb()
            elif op == 0x0E:
                cfa[1] = ic.uleb()
            elif op == 0x0F:
                ic.addr += ic.uleb()
                cfa[:] = [None, 0]
            elif op in (0x10, 0x16):
                reg = ic.uleb()
                ic.addr += ic.uleb()
                rules[reg] = ("expression", 0)
            elif op == 0x11:
                reg = ic.uleb()
                rules[reg] = ("offset", ic.sleb() * cie.daf)
            elif op == 0x12:
                cfa[:] = [ic.uleb(), ic.sleb() * cie.daf]
            elif op == 0x13:
                cfa[1] = ic.sleb() * cie.daf
            elif op == 0x14:
                reg = ic.uleb()
                rules[reg] = ("value", ic.uleb() * cie.daf)
            elif op == 0x15:
                reg = ic.uleb()
                rules[reg] = ("value", ic.sleb() * cie.daf)
            elif op == 0x2E:
                ic.uleb()
            elif op == 0x2F:
                reg = ic.uleb()
                rules[reg] = ("offset", -ic.uleb() * cie.daf)
            else:
                raise Unknown(f"call frame instruction {op:#x}")
        return True

    run(*cie.instructions, begin)
    initial.update(rules)
    run(c.addr, end, begin)
    return (None if cfa[0] is None else (int(cfa[0]), int(cfa[1]))), rules, cie


class Frame:
    """One frame of the walk: its code address, and for a signal frame, the stack it
    interrupted and the alternate stack recorded then."""

    def __init__(self, pc: int, signal: tuple[int, int, int] | None = None) -> None:
        self.pc = pc  # the address inside the function (a return address minus one)
        self.signal = signal  # (interrupted rsp, ss_sp, ss_size)


def walk(objects: Objects, stack: Memory, regs: dict[int, int], restorers: set[int]
         ) -> tuple[list[Frame], str, int]:
    """The frames of a stopped thread, innermost first: (frames, how the walk ended,
    the stack address where it stopped). It ends "done" at the outermost frame (a return
    address rule that is undefined, or zero), or "unknown: …" where it could not go on.
    ``stack`` reads the thread's stack (fresh for each walk: it changes as threads run);
    the objects' call frame information is read through ``objects.mem``."""
    mem = objects.mem
    frames: list[Frame] = []
    regs = dict(regs)
    exact = True  # the first pc (and one a signal interrupted) is not a return address
    cies: dict[int, _Cie] = {}
    for _ in range(MAX_FRAMES):
        pc = regs[RIP]
        if pc == 0:
            return frames, "done", regs[RSP]
        if pc in restorers and not exact:
            # Returned into rt_sigreturn: the caller is the code the signal interrupted.
            f = regs[RSP] - 8  # the rt_sigframe starts at its return address
            saved = {reg: stack.u64(f + off) for reg, off in SC_REG.items()}
            ss_sp, ss_size = stack.u64(f + 24), stack.u64(f + 40)
            frames.append(Frame(pc, (saved[RSP], ss_sp, ss_size)))
            regs.update(saved)
            exact = True
            continue
        look = pc if exact else pc - 1
        frames.append(Frame(look))
        obj = objects.find(look)
        if obj is None:
            return frames, f"unknown: no code object at {look:#x}", regs[RSP]
        try:
            cfa_rule, rules, cie = rules_at(mem, obj.lookup(mem, look), look, cies)
            if cfa_rule is None:
                raise Unknown("the frame address is an expression")
            base = regs.get(cfa_rule[0])
            if base is None:
                raise Unknown(f"the frame address needs register {cfa_rule[0]}")
            cfa = base + cfa_rule[1]
            ra = rules.get(cie.ra)
            if ra is None:
                raise Unknown("no rule for the return address")
            if ra[0] == "undefined":
                return frames, "done", regs[RSP]
            new: dict[int, int] = {}
            for reg in KEPT:
                rule = rules.get(reg)
                if reg == RSP:
                    new[RSP] = cfa
                elif rule is None or rule[0] == "same":
                    if reg in regs and reg != cie.ra:
                        new[reg] = regs[reg]
                elif rule[0] == "offset":
                    new[reg] = stack.u64(cfa + rule[1])
                elif rule[0] == "value":
                    new[reg] = cfa + rule[1]
                elif rule[0] == "register" and rule[1] in regs:
                    new[reg] = regs[rule[1]]
                elif reg == cie.ra:
                    raise Unknown("the return address is an expression")
            if ra[0] == "offset":
                new[RIP] = stack.u64(cfa + ra[1])
            elif ra[0] == "register" and ra[1] in regs:
                new[RIP] = regs[ra[1]]
            else:
                raise Unknown("the return address rule")
        except Unknown as e:
            return frames, f"unknown: {e}", regs[RSP]
        if new[RSP] <= regs[RSP]:
            return frames, "unknown: the stack did not move up", regs[RSP]
        regs = new
        exact = False
    return frames, "unknown: too many frames", regs[RSP]
