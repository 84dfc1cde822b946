"""The words and units of the text reports: IEC units in ``top`` and ``diff``, the diff's
signed changes and shares (never above 100%), counts agreeing with their nouns, shortened
texts ending in an ellipsis, and the leak report's heading when no leak was found.

Expected values are counted by hand from the sizes the builders are given (whole MiB)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heapscope.analysis.aggregate import aggregate, sort_rows
from heapscope.analysis.leaks import find_leaks
from heapscope.analysis.series import group_by_pid, load_series
from heapscope.analysis.top import View, build_diff
from heapscope.model import INUSE_OBJECTS, INUSE_SPACE, Profile
from heapscope.render.leaks import render_leaks
from heapscope.render.report import _cmd
from heapscope.render.text import render_diff, render_table
from heapscope.symbols import SymbolOptions
from heapscope.units import plural, shorten, shorten_command
from tests import leaksim as ls
from tests.unit.builders import Builder

MIB = 1 << 20


def _top_profile(b: Builder) -> Profile:
    return b.profile(
        b.sample("log_request", "main", values=(3, 3 * MIB, 0, 0)),
        b.sample("cache_put", "main", values=(1, 1 * MIB, 0, 0)),
    )


def _pair() -> tuple[Profile, Profile]:
    """BASE and NEW of one process: log_request 4 -> 7 MiB and cache_put 2 -> 3 MiB grow (by
    3 and 1: all growth 4 MiB), parse 3 -> 2 MiB shrinks (all shrinkage 1 MiB); 9 -> 12 MiB
    in all, +3 MiB, +33%."""
    b = Builder()

    def side(log: int, cache: int, parse: int) -> Profile:
        return b.profile(
            b.sample("log_request", "main", values=(log, log * MIB, 0, 0)),
            b.sample("cache_put", "main", values=(cache, cache * MIB, 0, 0)),
            b.sample("parse", "main", values=(parse, parse * MIB, 0, 0)),
        )

    base = side(4, 2, 3).with_(source="/srv/dumps/jeprof.7346.1.m1.heap", pid=7346)
    new = side(7, 3, 2).with_(source="/srv/dumps/jeprof.7346.5.m5.heap", pid=7346)
    return base, new


def _diff_text(base: Profile, new: Profile) -> str:
    out = io.StringIO()
    render_diff(out, build_diff([new], View(), [base]), [base], [new])
    return out.getvalue()


# --- top: IEC units, jeprof's columns ---------------------------------------------------------


def test_top_total_says_mib(golden: Any) -> None:
    t = aggregate([_top_profile(Builder())], INUSE_SPACE)
    out = io.StringIO()
    render_table(out, t, sort_rows(t))
    text = out.getvalue()
    assert text.splitlines()[0] == "Total: 4.0 MiB"
    assert " MB" not in text
    golden("top_functions_mib.txt", text)


def test_top_objects_total_agrees_with_its_count() -> None:
    b = Builder()
    one = b.profile(b.sample("only", "main", values=(1, MIB, 0, 0)))
    out = io.StringIO()
    table = aggregate([one], INUSE_OBJECTS)
    render_table(out, table, sort_rows(table))
    assert out.getvalue().splitlines()[0] == "Total: 1 object"


# --- diff: header, signs, shares --------------------------------------------------------------


def test_diff_golden(golden: Any) -> None:
    golden("diff_functions.txt", _diff_text(*_pair()))


def test_diff_header_names_both_sides_and_the_change() -> None:
    lines = _diff_text(*_pair()).splitlines()
    assert lines[0] == "base    jeprof.7346.1.m1.heap (pid 7346)   9.0 MiB"
    assert lines[1] == "new     jeprof.7346.5.m5.heap (pid 7346)  12.0 MiB"
    assert lines[2] == "change  +3.0 MiB (+33%)"
    assert lines[3].split() == ["flat", "MiB", "share", "sum", "cum", "MiB", "name"]


def test_diff_change_past_doubling_says_times_not_percent() -> None:
    b = Builder()
    base = b.profile(b.sample("log_request", "main", values=(2, 2 * MIB, 0, 0)))
    new = b.profile(b.sample("log_request", "main", values=(9, 9 * MIB, 0, 0)))
    # 2 -> 9 MiB: +7 MiB, 4.5 times the base (not "+350%").
    assert _diff_text(base, new).splitlines()[2] == "change  +7.0 MiB (×4.5 the base)"


_ROW = re.compile(r"^ *(\S+) +(\d+\.\d)% +(?:(\d+\.\d)% +)?(\S+) (\S+)$")


def _rows(text: str) -> dict[str, tuple[str, float, float | None, str]]:
    rows = {}
    for line in text.splitlines()[4:]:
        m = _ROW.match(line)
        if m:
            run = float(m.group(3)) if m.group(3) else None
            rows[m.group(5)] = (m.group(1), float(m.group(2)), run, m.group(4))
    return rows


def test_diff_shares_are_of_growth_and_of_shrinkage() -> None:
    rows = _rows(_diff_text(*_pair()))
    assert set(rows) == {"log_request", "cache_put", "main", "parse"}
    # Hand count: growth 3 + 1 = 4 MiB, so 3/4 and 1/4; shrinkage 1 MiB, all of it parse's.
    assert rows["log_request"] == ("+3.0", 75.0, 75.0, "+3.0")
    assert rows["cache_put"] == ("+1.0", 25.0, 100.0, "+1.0")
    assert rows["parse"] == ("-1.0", 100.0, 100.0, "-1.0")
    assert rows["main"] == ("0.0", 0.0, None, "+3.0")  # no flat change: unsigned
    growing = [share for flat, share, _, _ in rows.values() if flat.startswith("+")]
    assert sum(growing) == 100.0
    assert max(share for _, share, _, _ in rows.values()) <= 100.0
    assert max(run for _, _, run, _ in rows.values() if run is not None) <= 100.0


def test_diff_footer_states_the_share_rule() -> None:
    last = _diff_text(*_pair()).splitlines()[-1]
    assert last == ("share: of all growth (+4.0 MiB) for a growing row, of all shrinkage "
                    "(-1.0 MiB) for a shrinking one; sum runs per kind")


def test_diff_change_below_the_precision_is_unsigned() -> None:
    b = Builder()
    base = b.profile(b.sample("tiny", "main", values=(1, 2000, 0, 0)))
    new = b.profile(b.sample("tiny", "main", values=(1, 1000, 0, 0)))
    rows = _rows(_diff_text(base, new))
    # -1000 bytes is -0.00095 MiB: printed 0.0, never "-0.0"; still all of the shrinkage.
    assert rows["tiny"] == ("0.0", 100.0, 100.0, "0.0")


def test_diff_of_one_dump_with_itself() -> None:
    base, _ = _pair()
    lines = _diff_text(base, base).splitlines()
    assert lines[2] == "change  0 B"
    assert len(lines) == 4  # the column header, no rows and so no footer


def test_diff_command_text_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from heapscope.cli.main import main
    from heapscope.formats import symbolized

    base, new = _pair()
    paths = []
    for p in (base, new):
        path = str(tmp_path / (p.source.rsplit("/", 1)[1] + symbolized.SUFFIX))
        symbolized.write(p.with_(source=path), path)
        paths.append(path)
    assert main(["diff", *paths, "--no-cache"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[2] == "change  +3.0 MiB (+33%)"
    assert _rows(text)["log_request"] == ("+3.0", 75.0, 75.0, "+3.0")
    assert main(["diff", "--format", "json", *paths, "--no-cache"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["base_total"], doc["new_total"], doc["total"]) == (9 * MIB, 12 * MIB, 3 * MIB)
    assert (doc["growth"], doc["shrinkage"]) == (4 * MIB, 1 * MIB)
    assert doc["base_sources"] == [paths[0]] and doc["sources"] == [paths[1]]


# --- counts and their nouns -------------------------------------------------------------------


@pytest.mark.parametrize(("n", "noun", "expected"), [
    (1, "object", "1 object"),
    (2, "object", "2 objects"),
    (0, "object", "0 objects"),
    (1234, "object", "1,234 objects"),
    (1.9, "object", "1 object"),  # a float count is truncated first, as jeprof does
    (1, "process", "1 process"),
    (3, "process", "3 processes"),
    (2, "entry", "2 entries"),
    (2, "day", "2 days"),
    (1, "call path", "1 call path"),
    (5, "call path", "5 call paths"),
])
def test_plural(n: float, noun: str, expected: str) -> None:
    assert plural(n, noun) == expected


def test_plural_given_form_and_ungrouped() -> None:
    assert plural(2, "wrapper or helper", "wrappers and helpers") == "2 wrappers and helpers"
    assert plural(1, "wrapper or helper", "wrappers and helpers") == "1 wrapper or helper"
    assert plural(12345, "object", grouped=False) == "12345 objects"


# --- shortened texts ---------------------------------------------------------------------------


def test_shorten_marks_the_cut() -> None:
    assert shorten("abcdef", 6) == "abcdef"
    assert shorten("abcdefgh", 6) == "abcde…"
    assert shorten("/a/b/c/program", 8, keep="end") == "…program"
    assert shorten("namespace::middle::name", 11, keep="middle") == "names…:name"


PROGRAM = "/tmp/pytest-of-root/pytest-12/test_many_stacks0/bin/many_stacks"  # 63 characters


def test_shorten_command_keeps_whole_arguments() -> None:
    words = ["/opt/bench/bin/many_stacks", "20000", "300"]  # 26 + 1 + 5 + 1 + 3 = 36
    assert shorten_command(words, 36) == "/opt/bench/bin/many_stacks 20000 300"
    assert shorten_command(words, 35) == "/opt/bench/bin/many_stacks 20000 …"
    assert shorten_command(words, 33) == "/opt/bench/bin/many_stacks …"
    # The program is never cut, however narrow the room.
    assert shorten_command(words, 10) == "/opt/bench/bin/many_stacks …"
    assert shorten_command(["a b", "c"], 10) == "'a b' c"  # quoted as a shell reads it


def test_run_report_command_is_cut_with_an_ellipsis() -> None:
    assert _cmd([PROGRAM, "20000", "300"]) == PROGRAM + " …"  # 60 characters of room
    assert _cmd(["./many_stacks", "20000", "300"]) == "./many_stacks 20000 300"


# --- the leak report ----------------------------------------------------------------------------


def _one_dump_report(tmp_path: Path) -> Any:
    """One process, one dump: two sites of 1 MiB objects, one holding 1 object, one 3."""
    sites = {0x100: ls.Series(np.asarray([[1]]), MIB, 4096, False),
             0x200: ls.Series(np.asarray([[3]]), MIB, 4096, False)}
    paths = [str(p) for p in ls.write_series(tmp_path / "dumps", 4242, sites, 0)]
    (pid, group), = group_by_pid(paths).items()
    report = find_leaks([load_series(pid, group, SymbolOptions(cache_dir=None))])
    report.processes[0].cmdline = [PROGRAM, "20000", "300"]
    return report


def test_no_leak_heading_does_not_call_sites_suspects(tmp_path: Path) -> None:
    out = io.StringIO()
    render_leaks(out, _one_dump_report(tmp_path), color=False)
    text = out.getvalue()
    assert "suspects" not in text
    lines = text.splitlines()
    head = lines.index("largest live sites (no leak found)")
    assert lines[head + 1].startswith("  1. live  3.0 MiB in 3 objects  sim+0x201")
    assert lines[head + 3].startswith("  2. live  1.0 MiB in 1 object  sim+0x101")


def test_process_line_command_ends_in_an_ellipsis(tmp_path: Path) -> None:
    out = io.StringIO()
    render_leaks(out, _one_dump_report(tmp_path), color=False)
    line = out.getvalue().splitlines()[1]
    # 63 + " 20000" + " …" is 71, one more than the 70 of room: the program, then "…".
    assert line.endswith(f"1 dump           live 4.0 MiB  {PROGRAM} …"), line


def test_diff_header_escapes_control_characters() -> None:
    base, new = _pair()
    hostile = new.with_(source="/srv/jeprof.\x1b[2J.heap", pid=None)
    lines = _diff_text(base, hostile).splitlines()
    # Padded to the base's label (32 characters) as shown: 19 of them, then 13 + 2 spaces.
    assert lines[1] == "new     jeprof.\\x1b[2J.heap" + " " * 15 + "12.0 MiB"
