"""Helpers shared by the symbolizer tests (no tests here).

The tests build tiny programs from ``tests/data/symbols`` with gcc/g++ and fabricate a
Profile whose memory map is what ``/proc/PID/maps`` would show for them: one mapping per
PT_LOAD at a chosen load base, so that runtime address = base + ELF virtual address.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from heapscope.model import Mapping, Profile, Sample
from heapscope.symbols.llvm import LlvmSymbolizer, RawFrame, discard_ahead

DATA = Path(__file__).resolve().parent.parent / "data" / "symbols"
EXE_BASE = 0x555555554000
LIB_BASE = 0x7F0000000000
PAGE = 0x1000


def need(*tools: str) -> None:
    """Skip the calling test/fixture when a tool is missing."""
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def run(*cmd: str | Path) -> str:
    """Run a command, failing the test with its stderr if it fails."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr}")
    return proc.stdout


def source_line(name: str, marker: str) -> int:
    """The 1-based line of ``/* LINE:marker */`` in a fixture source file."""
    for number, text in enumerate((DATA / name).read_text().splitlines(), start=1):
        if f"LINE:{marker} " in text:
            return number
    raise AssertionError(f"no LINE:{marker} in {name}")


def functions(path: Path) -> dict[str, tuple[int, int]]:
    """Function symbols of an (unstripped) ELF file: name -> (vaddr, size)."""
    out: dict[str, tuple[int, int]] = {}
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        table = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
        for sym in table.iter_symbols():
            if sym["st_info"]["type"] == "STT_FUNC" and sym["st_size"] > 0:
                out[sym.name] = (sym["st_value"], sym["st_size"])
    return out


def return_address(path: Path, function: str, callee: str) -> int:
    """ELF vaddr of the instruction after ``function``'s first call to ``callee``."""
    listing = run("objdump", "-d", "--no-show-raw-insn", path)
    in_function = False
    found_call = False
    for line in listing.splitlines():
        header = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if header:
            in_function = header.group(1) == function
            continue
        insn = re.match(r"^\s+([0-9a-f]+):\s+(.*)$", line)
        if not (in_function and insn):
            continue
        if found_call:
            return int(insn.group(1), 16)
        if re.search(rf"\bcall\s.*<{re.escape(callee)}(@plt)?>", insn.group(2)):
            found_call = True
    raise AssertionError(f"no call from {function} to {callee} in {path}")


def mappings_for(path: Path | str, base: int, map_path: str | None = None) -> list[Mapping]:
    """The /proc/PID/maps lines the kernel would create for ``path`` loaded at ``base``."""
    out = []
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        if elf.header.e_type == "ET_EXEC":
            base = 0
        for seg in elf.iter_segments():
            h = seg.header
            if h.p_type != "PT_LOAD":
                continue
            start = base + (h.p_vaddr & ~(PAGE - 1))
            limit = base + ((h.p_vaddr + h.p_memsz + PAGE - 1) & ~(PAGE - 1))
            perms = (
                ("r" if h.p_flags & 4 else "-")
                + ("w" if h.p_flags & 2 else "-")
                + ("x" if h.p_flags & 1 else "-")
                + "p"
            )
            out.append(
                Mapping(start, limit, h.p_offset & ~(PAGE - 1), map_path or str(path), perms)
            )
    return out


def profile(
    stacks: Sequence[Sequence[int]],
    mappings: Sequence[Mapping],
    source: str = "",
    pid: int | None = None,
) -> Profile:
    """A Profile with one sample per stack (leaf first) and the given memory map."""
    samples = tuple(Sample(tuple(stack), (1.0, 64.0, 1.0, 64.0)) for stack in stacks)
    ordered = tuple(sorted(mappings, key=lambda m: m.start))
    return Profile(samples=samples, mappings=ordered, source=source, pid=pid)


class CountingBackend:
    """Wraps the real llvm-symbolizer backend and counts the batches it runs."""

    def __init__(self) -> None:
        self.inner = LlvmSymbolizer()
        self.calls: list[tuple[str, int]] = []

    def lookup(self, path: str, vaddrs: Sequence[int]) -> list[list[RawFrame]]:
        self.calls.append((path, len(vaddrs)))
        return self.inner.lookup(path, vaddrs)


def build_c(src: str, out: Path, *flags: str) -> Path:
    """Compile a fixture C source into ``out``."""
    need("gcc")
    run("gcc", *flags, "-o", out, DATA / src)
    return out


def split_debug(binary: Path, debug: Path) -> None:
    """Move ``binary``'s debug info into ``debug`` and leave a stripped, debuglinked binary."""
    need("objcopy", "strip")
    run("objcopy", "--only-keep-debug", binary, debug)
    run("strip", "--strip-debug", "--strip-unneeded", binary)
    run("objcopy", f"--add-gnu-debuglink={debug}", binary)


def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The body of a cache fixture: an empty cache folder, no debuginfod, the llvm-symbolizer
    on PATH; nothing started ahead is left running after the test."""
    monkeypatch.setenv("HEAPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DEBUGINFOD_URLS", raising=False)
    monkeypatch.delenv("HEAPSCOPE_SYMBOLIZER", raising=False)
    yield tmp_path / "cache"
    discard_ahead()
