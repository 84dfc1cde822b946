"""Direct callers counted from a program's code (heapscope.symbols.callsites), against the
callers written in tests/e2e/sites/codecallers.c, counted by hand."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heapscope.native import core
from heapscope.symbols.callsites import caller_counts, direct_callers, direct_callers_numpy

SOURCE = Path(__file__).resolve().parents[1] / "e2e" / "sites" / "codecallers.c"
# By hand from the source: the functions whose code calls each one.
BY_HAND = {
    "buf_reserve": 4,  # keep_names, parse_header, format_reply, copy_path
    "fill_table": 3,  # load_rows, load_more, load_extra
    "xmalloc": 1,  # buf_reserve
    "keep_names": 1,  # main
    "main": 0,  # called by libc, not by the program
}


def _build(out: Path, *flags: str) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    subprocess.run(["gcc", *flags, "-o", str(out), str(SOURCE)], check=True)
    return out


@pytest.mark.parametrize("level", ["-O0", "-O1", "-O2"])
def test_callers_as_written(tmp_path: Path, level: str) -> None:
    binary = _build(tmp_path / "cc", level, "-g")
    counts = caller_counts(str(binary))
    assert {name: counts.get(name) for name in BY_HAND} == BY_HAND


@pytest.mark.parametrize("level", ["-O0", "-O1", "-O2"])
def test_callers_through_a_librarys_own_plt(tmp_path: Path, level: str) -> None:
    """The same code as a shared library (default visibility): it calls its own exported
    functions through its PLT, and those calls count as the direct ones do."""
    library = _build(tmp_path / "libcc.so", level, "-g", "-fPIC", "-shared")
    counts = caller_counts(str(library))
    assert {name: counts.get(name) for name in BY_HAND} == BY_HAND


def test_a_stripped_program_says_nothing(tmp_path: Path) -> None:
    # Without .symtab its functions have no names to count by (they are not exported).
    binary = _build(tmp_path / "cc", "-O1")
    subprocess.run(["strip", "--strip-all", str(binary)], check=True)
    assert caller_counts(str(binary)).get("buf_reserve") == 0


def test_a_file_that_changed_is_counted_again(tmp_path: Path) -> None:
    binary = _build(tmp_path / "cc", "-O1")
    assert caller_counts(str(binary)).get("buf_reserve") == 4
    text = SOURCE.read_text().replace("free(copy_path(\"/\"));", "")
    other = tmp_path / "other.c"
    other.write_text(text)
    subprocess.run(["gcc", "-O1", "-o", str(tmp_path / "new"), str(other)], check=True)
    os.replace(tmp_path / "new", binary)
    assert caller_counts(str(binary)).get("buf_reserve") == 3  # copy_path gone, unused


def test_what_is_not_x86_64_code_gives_no_evidence(tmp_path: Path) -> None:
    binary = _build(tmp_path / "cc", "-O1")
    data = bytearray(binary.read_bytes())
    data[18:20] = (183).to_bytes(2, "little")  # e_machine: AArch64
    arm = tmp_path / "arm"
    arm.write_bytes(bytes(data))
    assert caller_counts(str(arm)).get("buf_reserve") == 0
    text = tmp_path / "text"
    text.write_text("not an ELF file\n")
    assert caller_counts(str(text)).get("buf_reserve") == 0
    assert caller_counts(str(tmp_path / "absent")).get("buf_reserve") == 0


# The compiled loop against its numpy reference: on real programs and on random bytes.

def _segments(path: str) -> tuple[list[tuple[int, bytes]], list[tuple[int, int, str]]]:
    from heapscope.symbols.elfread import ElfHeaders
    from heapscope.symbols.symtab import SymbolTable

    with ElfHeaders.open(path) as elf:
        code = [(seg.p_vaddr, elf.segment_data(seg)) for seg in elf.segments
                if seg.p_type == 1 and seg.p_flags & 1 and seg.p_filesz > 0]
    return code, SymbolTable.read(path).functions()


@pytest.mark.skipif(core is None, reason="the compiled loops (heapscope._native) are not built")
def test_compiled_and_numpy_agree_on_real_programs(tmp_path: Path) -> None:
    files = [str(_build(tmp_path / "cc", "-O2", "-g")), "/lib/x86_64-linux-gnu/libc.so.6",
             os.path.realpath("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")]
    for path in files:
        code, functions = _segments(path)
        want = direct_callers_numpy(code, functions)
        assert direct_callers(code, functions) == want, path
        assert sum(want) > 0, path  # its functions call each other


@pytest.mark.skipif(core is None, reason="the compiled loops (heapscope._native) are not built")
@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=300), st.integers(0, 2**40),
       st.lists(st.tuples(st.integers(0, 400), st.integers(1, 80)), max_size=12))
def test_compiled_and_numpy_agree_on_any_bytes(data: bytes, base: int,
                                               spans: list[tuple[int, int]]) -> None:
    # Calls land anywhere: sprinkle E8/E9 so that some aim at function starts.
    functions = sorted({(base + a, base + a + n, f"f{a}") for a, n in spans})
    raw = bytearray(data)
    for i in range(0, len(raw), 7):
        raw[i] = 0xE8 if i % 2 else 0xE9
    code = [(base, bytes(raw))]
    if not functions:
        return
    assert direct_callers(code, functions) == direct_callers_numpy(code, functions)


def test_code_past_the_bound_is_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heapscope.symbols import callsites

    binary = _build(tmp_path / "cc", "-O1")
    monkeypatch.setattr(callsites, "MAX_CODE", 64)  # bytes: less than any program's code
    assert caller_counts(str(binary)).get("buf_reserve") == 0
