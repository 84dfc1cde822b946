"""How many functions of a program call a function directly: evidence read from its code.

A dump shows only the callers that still hold memory; a helper such as Redis's
``_sdsnewlen`` may have one caller in a profile (``dbAdd``, under a SET-only load) and a dozen
in the program. This module counts, for x86-64 ELF files, the distinct functions whose code
holds a ``call rel32`` (``E8``) or ``jmp rel32`` (``E9``, a tail call) aimed at a function's
first byte. The executable segments are scanned as bytes, not disassembled: a stray ``E8``
byte inside another instruction names a random target, and landing exactly on a function's
start by chance is rare enough to be noise next to the counts that matter (it can only add
a caller). A shared library calls its own exported functions through its PLT (unless built
with hidden visibility): a call aimed at a PLT entry whose GOT slot the file's own
``JUMP_SLOT`` relocation binds to a function the file defines counts for that function.
Calls through pointers, or from other modules, are not counted: the count is a lower bound
of the program's direct callers. Other architectures give no evidence (an empty answer),
never a guess.
"""

from __future__ import annotations

import os
import struct
import threading
from array import array
from typing import TYPE_CHECKING

from heapscope.native import core
from heapscope.symbols.elfread import ElfError, ElfHeaders
from heapscope.symbols.symtab import SymbolTable

if TYPE_CHECKING:
    import numpy as np

EM_X86_64 = 62
PT_LOAD = 1
PF_X = 1
_CACHED = 8  # files whose counts are kept (a run folds each dump of the same program)
# Executable bytes read at most (a browser's code is ~150 MiB): past it, no evidence
# rather than a read that size on a report's path.
MAX_CODE = 256 << 20


class CallerCounts:
    """Direct callers of each function of one ELF file, by the function's symbol name."""

    def __init__(self, by_name: dict[str, int]) -> None:
        self._by_name = by_name

    def get(self, name: str) -> int:
        """The number of distinct functions calling or tail-calling ``name`` (0: unknown)."""
        return self._by_name.get(name, 0)


_lock = threading.Lock()
_cache: dict[tuple[str, int, int, int], CallerCounts] = {}


def caller_counts(path: str) -> CallerCounts:
    """The counts for the ELF file at ``path``, kept while the file (device, inode, mtime)
    is unchanged; empty for a file that is not a readable x86-64 ELF file, has no function
    symbols or more than ``MAX_CODE`` bytes of code."""
    try:
        st = os.stat(path)
    except OSError:
        return CallerCounts({})
    key = (path, st.st_dev, st.st_ino, st.st_mtime_ns)
    with _lock:
        got = _cache.get(key)
    if got is not None:
        return got
    got = CallerCounts(_count(path))
    with _lock:
        if len(_cache) >= _CACHED:
            _cache.pop(next(iter(_cache)))
        _cache[key] = got
    return got


def _count(path: str) -> dict[str, int]:
    try:
        with ElfHeaders.open(path) as elf:
            if not elf.elf64 or not elf.little or elf.machine != EM_X86_64:
                return {}
            segments = [seg for seg in elf.segments
                        if seg.p_type == PT_LOAD and seg.p_flags & PF_X and seg.p_filesz > 0]
            if sum(seg.p_filesz for seg in segments) > MAX_CODE:
                return {}
            code = [(seg.p_vaddr, elf.segment_data(seg)) for seg in segments]
            stubs = plt_stubs(elf)
        functions = SymbolTable.read(path).functions()
    except (ElfError, OSError, struct.error):
        return {}
    if not functions or not code:
        return {}
    # PLT entries are counted as functions of their own, then added to the function each
    # one reaches (the callers through it are others than the direct ones, or the same
    # function calling both ways, which is rare: a sum).
    starts = {start for start, _, _ in functions}
    stubs = [s for s in stubs if s[0] not in starts]
    table = sorted([*functions, *stubs])
    counts = (direct_callers(code, table) if core is not None
              else direct_callers_numpy(code, table))
    # Aliases (names sharing a start) were counted on the first of them: each gets it.
    by_start: dict[int, int] = {}
    for (start, _, _), n in zip(table, counts, strict=True):
        if n:
            by_start[start] = max(by_start.get(start, 0), n)
    out: dict[str, int] = {}
    for start, _, name in functions:
        n = by_start.get(start, 0)
        if n:
            out[name] = max(out.get(name, 0), n)
    for start, _, name in stubs:
        n = by_start.get(start, 0)
        if n:
            out[name] = out.get(name, 0) + n
    return out


R_X86_64_JUMP_SLOT = 7
STT_FUNC = 2
PLT_ENTRY = 16  # bytes of one x86-64 PLT entry (.plt and .plt.sec alike)


def plt_stubs(elf: ElfHeaders) -> list[tuple[int, int, str]]:
    """``(start, end, name)`` of the PLT entries of ``elf`` that reach a function ``elf``
    itself defines: each entry's ``jmp *GOT(%rip)`` read for its GOT slot, the slot's
    ``JUMP_SLOT`` relocation for the symbol. Empty when there is no PLT."""
    rela = elf.section_by_name(".rela.plt")
    stubs = elf.section_by_name(".plt.sec") or elf.section_by_name(".plt")
    if rela is None or stubs is None or not rela.has_data or not stubs.has_data:
        return []
    dynsym = elf.section(rela.sh_link)
    dynstr = elf.section(dynsym.sh_link) if dynsym is not None else None
    if dynsym is None or dynstr is None:
        return []
    syms, strings, relocs = elf.data(dynsym), elf.data(dynstr), elf.data(rela)
    slots: dict[int, str] = {}
    for offset, info, _addend in struct.iter_unpack("<QQq", relocs[:len(relocs) // 24 * 24]):
        index = info >> 32
        if info & 0xFFFFFFFF != R_X86_64_JUMP_SLOT or (index + 1) * 24 > len(syms):
            continue
        name_at, kind, _other, shndx, _value, _size = struct.unpack_from("<IBBHQQ", syms,
                                                                         index * 24)
        if shndx == 0 or kind & 0xF != STT_FUNC:
            continue  # another module's function, or not a plain function
        end = strings.find(b"\0", name_at)
        if end > name_at:
            slots[offset] = strings[name_at:end].decode("utf-8", "replace")
    if not slots:
        return []
    code = elf.data(stubs)
    first = 0 if stubs.name == ".plt.sec" else PLT_ENTRY  # .plt starts with its resolver
    out = []
    for at in range(first, len(code) - PLT_ENTRY + 1, PLT_ENTRY):
        jump = code.find(b"\xff\x25", at, at + PLT_ENTRY - 5)
        if jump < 0:
            continue
        (disp,) = struct.unpack_from("<i", code, jump + 2)
        name = slots.get(stubs.sh_addr + jump + 6 + disp)
        if name is not None:
            out.append((stubs.sh_addr + at, stubs.sh_addr + at + PLT_ENTRY, name))
    return out


def direct_callers(code: list[tuple[int, bytes]], functions: list[tuple[int, int, str]]
                   ) -> list[int]:
    """Per function (sorted ``(start, end, name)``), its distinct direct callers in the
    ``(vaddr, bytes)`` segments ``code``: the compiled loop (heapscope._native)."""
    assert core is not None
    starts = array("q", [f[0] for f in functions]).tobytes()
    ends = array("q", [f[1] for f in functions]).tobytes()
    counts = array("i")
    counts.frombytes(core.direct_callers(code, starts, ends))
    return counts.tolist()


def direct_callers_numpy(code: list[tuple[int, bytes]], functions: list[tuple[int, int, str]]
                         ) -> list[int]:
    """The same with numpy: the reference the compiled loop is checked against, and the
    fallback without it."""
    import numpy as np

    starts = np.array([f[0] for f in functions], dtype=np.int64)
    ends = np.array([f[1] for f in functions], dtype=np.int64)
    pairs = [_calls(np.frombuffer(data, dtype=np.uint8), vaddr, starts, ends)
             for vaddr, data in code]
    both = np.concatenate(pairs, axis=1)
    # Distinct (caller, callee) pairs, a function calling itself left out.
    both = both[:, both[0] != both[1]]
    uniq = np.unique(both[0] * len(functions) + both[1])
    return [int(n) for n in np.bincount(uniq % len(functions), minlength=len(functions))]


def _calls(code: np.ndarray, vaddr: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """(caller index, callee index) of every E8/E9 rel32 in ``code`` that lands on a
    function's first byte from inside a function."""
    import numpy as np

    if len(code) < 5:
        return np.zeros((2, 0), dtype=np.int64)
    pos = np.nonzero((code[:-4] == 0xE8) | (code[:-4] == 0xE9))[0]
    rel = (code[pos + 1].astype(np.int64) | code[pos + 2].astype(np.int64) << 8
           | code[pos + 3].astype(np.int64) << 16 | code[pos + 4].astype(np.int64) << 24)
    rel -= (rel >= 1 << 31) * (1 << 32)
    at = vaddr + pos.astype(np.int64)
    target = at + 5 + rel
    callee = np.searchsorted(starts, target)
    callee_ok = callee < len(starts)
    callee = np.minimum(callee, len(starts) - 1)
    hit = callee_ok & (starts[callee] == target)
    caller = np.searchsorted(starts, at, side="right") - 1
    inside = (caller >= 0) & (at < ends[np.maximum(caller, 0)])
    keep = hit & inside
    return np.stack([caller[keep], callee[keep]])
