"""llvm.py's reading of llvm-symbolizer's JSON answer lines, against json.loads.

heapscope reads the answer lines of ``llvm-symbolizer --output-style=JSON`` with a regular
expression for LLVM's usual layout and falls back to json.loads for anything else; either
way an answer must become the frames json.loads of the same line gives. The expected
frames here are built from ``json.loads`` by :func:`json_frames`, written from the
documented meaning of :class:`RawFrame` (innermost first; "" and "??" mean unknown; line 0
means no line; an address nothing is known about has no frames; an "Error" answer is a
failure), not from llvm.py.

The answer lines come from llvm-symbolizer run here on programs built here (gcc/g++ -g -O2:
inlining, templates, a static function, a -g0 translation unit, a source file whose name
needs JSON escapes), and from hand-written lines for what the regular expression could get
wrong (escapes, unicode, missing fields, other layouts).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from heapscope.symbols import llvm
from heapscope.symbols.llvm import BackendError, LlvmSymbolizer, RawFrame

FLAGS = ["--output-style=JSON", "--inlines", "--no-demangle", "--functions=linkage"]


def json_frames(line: str) -> tuple[list[RawFrame], bool]:
    """The reference: (frames, failed) of one answer line, from json.loads."""
    try:
        obj: Any = json.loads(line)
    except ValueError:
        return [], True
    if not isinstance(obj, dict) or "Error" in obj:
        return [], True
    symbols = obj.get("Symbol")
    frames = []
    for sym in symbols if isinstance(symbols, list) else []:
        if not isinstance(sym, dict):
            continue
        name, file, line_no = sym.get("FunctionName"), sym.get("FileName"), sym.get("Line")
        frames.append(RawFrame(
            name if isinstance(name, str) and name not in ("", "??") else "",
            file if isinstance(file, str) and file not in ("", "??") else "",
            line_no if type(line_no) is int and line_no > 0 else 0,
        ))
    if not any(f.function or f.file for f in frames):
        frames = []
    return frames, False


def fast_path(line: str) -> bool:
    """True when llvm.py reads ``line`` with its regular expressions, not json.loads."""
    return bool(llvm._patterns()[0].fullmatch(line) or llvm._patterns()[1].fullmatch(line))


# ---------------------------------------------------------------- real llvm-symbolizer


C_MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
extern int no_debug_info(int);
static inline int square(int x) { return x * x; }
static inline int sum_squares(const int *v, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) s += square(v[i]);
    return s;
}
static __attribute__((noinline)) int helper(int x) { return sum_squares(&x, 1) + x; }
int rust_like(int) __asm__("_ZN4core3fmt5write17h0123456789abcdefE");
__attribute__((noinline)) int rust_like(int x) { return helper(x) - 1; }
int rust_v0(int) __asm__("_RNvCs1234_7mycrate3foo");
__attribute__((noinline)) int rust_v0(int x) { return x ^ 5; }
int main(int argc, char **argv) {
    int v[4] = {argc, 2, 3, 4};
    (void)argv;
    printf("%d\n", sum_squares(v, 4) + helper(argc) + rust_like(argc) + rust_v0(argc)
           + no_debug_info(argc));
    return 0;
}
"""
C_NODEBUG = r"""
__attribute__((noinline)) int no_debug_info(int x) { return x * 7 + 3; }
"""
CXX_MAIN = r"""
#include <cstdio>
#include <map>
#include <string>
#include <vector>
namespace app {
template <typename T> struct Box {
    T value;
    __attribute__((noinline)) T twice() const { return value + value; }
};
template <typename T> inline T add(T a, T b) { return a + b; }
unsigned long long operator"" _km(unsigned long long v) { return v * 1000; }
__attribute__((noinline)) int fold(const std::vector<int> &v) {
    int s = 0;
    for (int x : v) s = add(s, x);
    return s;
}
}  // namespace app
using app::operator""_km;
int main(int argc, char **) {
    std::vector<int> v{argc, 2, 3};
    std::map<std::string, int> m{{"a", argc}};
    app::Box<double> b{1.5};
    auto lambda = [&](int k) { return k + m["a"]; };
    std::printf("%d %f %llu %d\n", app::fold(v), b.twice(), 3_km, lambda(argc));
    return 0;
}
"""
# A source file name that LLVM must write with JSON escapes (quote, backslash) and with
# raw UTF-8.
ODD_SOURCE = 'we"ird\\\u00fc\u2603.c'
ODD_C = "__attribute__((noinline)) int odd(int x) { return x + 11; }\n" \
        "int main(int argc, char **argv) { (void)argv; return odd(argc); }\n"


def _need(*tools: str) -> None:
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


def _run(*cmd: str | Path, cwd: Path | None = None, stdin: str | None = None) -> str:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, cwd=cwd, input=stdin,
                          text=True, encoding="utf-8", errors="surrogateescape", check=False)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed:\n{proc.stderr}")
    return proc.stdout


def _symbolizer() -> str:
    try:
        return llvm.find_symbolizer()
    except Exception as exc:  # ToolError: no llvm-symbolizer
        pytest.skip(f"no llvm-symbolizer: {exc}")


@dataclass(frozen=True)
class Program:
    path: Path
    addresses: list[int]


def _addresses(binary: Path) -> list[int]:
    """Addresses in and around every sized symbol ``nm`` lists (code and data): the start,
    a few bytes in, the middle, the last byte, one past the end; and one nowhere."""
    out: set[int] = {0x0, 0x7FFFFFF0}
    for row in _run("nm", "-S", "--defined-only", binary).splitlines():
        fields = row.split()
        if len(fields) != 4:
            continue
        start, size = int(fields[0], 16), int(fields[1], 16)
        if size:
            out.update({start, start + min(3, size - 1), start + size // 2,
                        start + size - 1, start + size})
    return sorted(out)


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Program]:
    _need("gcc", "g++", "nm")
    _symbolizer()
    d = tmp_path_factory.mktemp("llvm")
    (d / "main.c").write_text(C_MAIN)
    (d / "nodebug.c").write_text(C_NODEBUG)
    (d / "main.cc").write_text(CXX_MAIN)
    (d / ODD_SOURCE).write_text(ODD_C)
    _run("gcc", "-g0", "-O2", "-c", "nodebug.c", "-o", "nodebug.o", cwd=d)
    _run("gcc", "-g", "-O2", "main.c", "nodebug.o", "-o", "c_prog", cwd=d)
    _run("g++", "-g", "-O2", "main.cc", "-o", "cxx_prog", cwd=d)
    _run("gcc", "-g", "-O2", ODD_SOURCE, "-o", "odd_prog", cwd=d)
    return {name: Program(d / name, _addresses(d / name))
            for name in ("c_prog", "cxx_prog", "odd_prog")}


def _answers(program: Program) -> list[str]:
    """llvm-symbolizer's answer lines for the program's addresses, run here. Split on "\\n"
    only: an answer is one line of JSON, which escapes every control character but not
    U+2028 or U+0085."""
    out = _run(_symbolizer(), *FLAGS, f"--obj={program.path}",
               stdin="".join(f"{a:#x}\n" for a in program.addresses))
    lines = [ln for ln in out.split("\n") if ln.strip()]
    assert len(lines) == len(program.addresses)
    return lines


@pytest.mark.parametrize("name", ["c_prog", "cxx_prog", "odd_prog"])
def test_real_answers_parse_like_json(programs: dict[str, Program], name: str) -> None:
    program = programs[name]
    lines = _answers(program)
    for address, line in zip(program.addresses, lines, strict=True):
        assert llvm._parse_answer(line) == json_frames(line), (hex(address), line)


def test_real_answers_cover_what_they_are_meant_to(programs: dict[str, Program]) -> None:
    """The answers above hold the cases this file is about, on both parsing paths."""
    lines = {name: _answers(p) for name, p in programs.items()}
    frames = {name: [json_frames(ln)[0] for ln in ls] for name, ls in lines.items()}
    c_frames, cxx_frames = frames["c_prog"], frames["cxx_prog"]
    assert any(len(f) >= 2 for f in c_frames)  # inlined frames
    assert any(len(f) >= 2 for f in cxx_frames)
    assert any(len(f) == 1 for f in c_frames)
    assert [] in c_frames  # an address nothing is known about
    names = {fr.function for fs in frames.values() for f in fs for fr in f}
    assert {"_ZN4core3fmt5write17h0123456789abcdefE", "_RNvCs1234_7mycrate3foo"} <= names
    assert any(n.startswith("_ZNK3app3BoxIdE5twiceEv") for n in names)  # template
    assert "helper" in names or any(n.startswith("helper.") for n in names)  # static
    # the -g0 function: a name from the symbol table, no file, no line
    assert [RawFrame("no_debug_info", "", 0)] in c_frames
    assert any(fr.file.endswith(ODD_SOURCE) for f in frames["odd_prog"] for fr in f)
    all_lines = [ln for ls in lines.values() for ln in ls]
    assert any(llvm._patterns()[0].fullmatch(ln) for ln in all_lines)  # one frame
    assert any(llvm._patterns()[1].fullmatch(ln) and not llvm._patterns()[0].fullmatch(ln)
               for ln in all_lines)  # several frames, by the regular expression
    assert any(not fast_path(ln) for ln in all_lines)  # escapes: by json.loads


@pytest.mark.parametrize("name", ["c_prog", "cxx_prog", "odd_prog"])
def test_lookup_gives_the_json_frames(programs: dict[str, Program], name: str) -> None:
    """LlvmSymbolizer.lookup (its own process, temporary file, decoding) gives, address by
    address, the frames json.loads gives for the answers of the same command."""
    program = programs[name]
    expected = [json_frames(ln)[0] for ln in _answers(program)]
    assert LlvmSymbolizer(_symbolizer()).lookup(str(program.path), program.addresses) == expected


def test_lookup_with_unicode_line_separator_in_source_path(tmp_path: Path) -> None:
    """LLVM writes U+2028 and U+0085 raw inside its JSON strings: answers are lines ended by
    "\n" only, not by everything str.splitlines() takes for a line end."""
    _need("gcc", "nm")
    symbolizer = _symbolizer()
    source = "line\u2028sep\u0085arated.c"
    (tmp_path / source).write_text(ODD_C)
    _run("gcc", "-g", "-O0", source, "-o", "prog", cwd=tmp_path)
    program = Program(tmp_path / "prog", _addresses(tmp_path / "prog"))
    expected = [json_frames(ln)[0] for ln in _answers(program)]
    assert any(fr.file.endswith(source) for f in expected for fr in f)
    assert LlvmSymbolizer(symbolizer).lookup(str(program.path), program.addresses) == expected


def test_unreadable_object_is_backend_error(tmp_path: Path) -> None:
    symbolizer = _symbolizer()
    text = tmp_path / "not-elf.txt"
    text.write_text("hello\n")
    with pytest.raises(BackendError) as info:
        LlvmSymbolizer(symbolizer).lookup(str(text), [0x1000, 0x2000])
    assert str(text) in str(info.value)


# ----------------------------------------------------------------- hand-written lines


def _esc(value: str, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only)


def llvm_line(*frames: tuple[str, str, int], module: str = "/bin/x", address: str = "0x1",
              ascii_only: bool = False) -> str:
    """An answer line in LLVM 14's layout, strings escaped as a JSON writer would."""
    syms = ",".join(
        '{"Column":3,"Discriminator":0,"FileName":' + _esc(file, ascii_only)
        + ',"FunctionName":' + _esc(name, ascii_only) + f',"Line":{line_no}'
        + ',"StartAddress":"0x1000","StartFileName":' + _esc(file, ascii_only)
        + f',"StartLine":{line_no}}}'
        for name, file, line_no in frames)
    return ('{"Address":' + _esc(address, ascii_only) + ',"ModuleName":'
            + _esc(module, ascii_only) + ',"Symbol":[' + syms + "]}")


ODD_STRINGS = [
    "plain", "", "??", "???", " ", "a\"b", "back\\slash", "\\", "\"", "tab\there",
    "new\nline", "nul\x00byte", "\x1f", "del\x7f", "caf\u00e9", "\u2603", "\U0001f600",
    "\u2028", "\u0085", "\ud800", "\udcff", "sl/ash", "_ZN4core3fmt5write17h0123456789abcdefE",
    "_RNvCs1234_7mycrate3foo", "_ZN65_$LT$alloc..vec..Vec$LT$T$GT$$u20$as$u20$Drop$GT$4drop17h1E",
    "foo.cold", "foo.isra.0", "operator\"\" _km", "{\"Column\":0}", "\",\"FunctionName\":\"x",
    "]}", "\\u0041",
]


def _hand_lines() -> list[str]:
    lines = []
    for text in ODD_STRINGS:
        for ascii_only in (False, True):
            lines += [
                llvm_line((text, "/src/a.c", 7), ascii_only=ascii_only),
                llvm_line(("f", text, 7), ascii_only=ascii_only),
                llvm_line((text, text, 0), ascii_only=ascii_only),
                llvm_line(("inner", "a.c", 1), (text, "b.c", 2), ("outer", text, 3),
                          ascii_only=ascii_only),
                llvm_line(("f", "a.c", 1), module=text, address=text, ascii_only=ascii_only),
            ]
    lines += [
        llvm_line(),  # "Symbol":[]
        llvm_line(("", "", 0)),  # nothing known
        llvm_line(("??", "??", 0)),
        llvm_line(("", "", 0), ("??", "??", 0)),
        llvm_line(("", "", 0), ("f", "", 0)),
        llvm_line(("f", "", 12)),
        llvm_line(("", "a.c", 12)),
        llvm_line(("f", "a.c", 4294967296)),
        llvm_line(("f", "a.c", 10**30)),
    ]
    base = llvm_line(("f", "a.c", 5))
    lines += [
        base.replace('"Line":5', '"Line":05'),  # not JSON
        base.replace('"Line":5', '"Line":-5'),
        base.replace('"Line":5', '"Line":5.0'),
        base.replace('"Line":5', '"Line":5e0'),
        base.replace('"Line":5', '"Line":"5"'),
        base.replace('"Line":5', '"Line":null'),
        base.replace('"Line":5,', ""),
        base.replace('"FileName":"a.c",', ""),
        base.replace('"FunctionName":"f",', ""),
        base.replace('"FunctionName":"f"', '"FunctionName":null'),
        base.replace('"FunctionName":"f"', '"FunctionName":7'),
        base.replace('"Column":3', '"Column":-1'),
        base.replace('"Discriminator":0', '"Discriminator":00'),
        base.replace('"StartLine":5', '"StartLine":5.5'),
        base.replace(",", ", "),  # another writer's spacing
        base.replace(":", ": "),
        " " + base + " ",
        base + "\r",
        base.replace('{"Column":3,', '{').replace('"StartLine":5}', '"StartLine":5,"Column":3}'),
        base.replace('"StartLine":5}', '"StartLine":5,"Extra":"x"}'),  # a newer LLVM's field
        base.replace('"Symbol":[', '"Extra":1,"Symbol":['),
        base.replace('"Symbol":[', '"Symbol":[7,'),
        '{"Address":"0x1","ModuleName":"/bin/x","Symbol":null}',
        '{"Address":"0x1","ModuleName":"/bin/x","Symbol":{}}',
        '{"Address":"0x1","ModuleName":"/bin/x"}',
        '{"Address":"0x1","ModuleName":"/bin/x","Symbol":[{}]}',
        '{"Error":{"Message":"No such file or directory"},"ModuleName":"/bin/x"}',
        '{"Address":"0x1","Error":{"Message":"x"},"Symbol":[]}',
        base[:-1],  # cut short
        base + base,
        "[]",
        "null",
        "42",
        "",
        "not json",
        base.replace('"FunctionName":"f"', '"FunctionName":"f","FunctionName":"g"'),
        base.replace('"FileName":"a.c"', '"FileName":"a.c\x01"'),  # raw control character
    ]
    return lines


HAND_LINES = _hand_lines()


@pytest.mark.parametrize("line", HAND_LINES, ids=range(len(HAND_LINES)))
def test_hand_written_line_parses_like_json(line: str) -> None:
    assert llvm._parse_answer(line) == json_frames(line)


def test_hand_written_lines_reach_both_paths() -> None:
    fast = [ln for ln in HAND_LINES if fast_path(ln)]
    assert len(fast) > 50 and len(HAND_LINES) - len(fast) > 50
    # Every string that needs no escape is read by the regular expression, wherever it is.
    for text in ODD_STRINGS:
        if not re.search(r'["\\\x00-\x1f]', text):
            assert fast_path(llvm_line((text, text, 7))), text
            assert fast_path(llvm_line(("f", "a.c", 1), module=text, address=text)), text
