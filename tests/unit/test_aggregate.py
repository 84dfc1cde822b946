"""The top view: flat/cum per granularity, recursion counted once, diff, text and JSON."""

from __future__ import annotations

import io
import json

from heapscope.analysis.aggregate import aggregate, sort_rows, subtract
from heapscope.analysis.filter import compile_re, focus, ignore
from heapscope.model import INUSE_SPACE
from heapscope.render.json import table_dict
from heapscope.render.text import render_table
from tests.unit.builders import Builder


def _profile(b: Builder):  # type: ignore[no-untyped-def]
    return b.profile(
        b.sample("leak_small@leaky.c:20", "main@leaky.c:90", values=(1000, 48000, 0, 0)),
        b.sample("leak_big@leaky.c:30", "main@leaky.c:91", values=(8, 8388608, 0, 0)),
        b.sample("rec@leaky.c:40", "rec@leaky.c:41", "rec@leaky.c:41", "main@leaky.c:92",
                 values=(1, 4096, 0, 0)),
        b.sample("?anon", "main@leaky.c:93", values=(1, 1024, 0, 0)),
        b.sample("helper@util.h:5;via_inline@leaky.c:50", "main@leaky.c:94",
                 values=(10, 2560, 0, 0)),
    )


def test_functions_flat_and_cum() -> None:
    b = Builder()
    t = aggregate([_profile(b)], INUSE_SPACE, "functions")
    rows = {r.key.name: (r.flat, r.cum) for r in t.rows}
    assert t.total == 48000 + 8388608 + 4096 + 1024 + 2560
    assert rows["main"] == (0, t.total)
    assert rows["rec"] == (4096, 4096)  # recursion counted once
    assert rows["helper"] == (2560, 2560)  # inlined frame gets the flat value
    assert rows["via_inline"] == (0, 2560)
    anon = [k for k in rows if k.startswith("app+0x")]
    assert anon and rows[anon[0]] == (1024, 1024)


def test_lines_granularity_golden(golden) -> None:  # type: ignore[no-untyped-def]
    b = Builder()
    t = aggregate([_profile(b)], INUSE_SPACE, "lines")
    out = io.StringIO()
    render_table(out, t, sort_rows(t), granularity="lines", show_bytes=True)
    golden("top_lines.txt", out.getvalue())


def test_functions_golden_mib_and_cum(golden) -> None:  # type: ignore[no-untyped-def]
    b = Builder()
    t = aggregate([_profile(b)], INUSE_SPACE, "functions")
    out = io.StringIO()
    render_table(out, t, sort_rows(t, by_cum=True), granularity="functions")
    golden("top_functions_cum.txt", out.getvalue())


def test_focus_and_ignore_whole_stacks() -> None:
    b = Builder()
    p = _profile(b)
    assert aggregate([focus(p, compile_re("^rec$", "--focus"))], INUSE_SPACE).total == 4096
    ign = ignore(p, compile_re("leaky.c:3", "--ignore"))
    assert aggregate([ign], INUSE_SPACE).total == 48000 + 4096 + 1024 + 2560


def test_diff_by_name_across_processes() -> None:
    b1, b2 = Builder(), Builder()
    base = b1.profile(b1.sample("leak_small", "main", values=(1, 1000, 0, 0)))
    b2.next[next(iter(b2.next))] += 0x5000  # different addresses in the new process
    new = b2.profile(b2.sample("leak_small", "main", values=(1, 3000, 0, 0)),
                     b2.sample("cache_fill", "main", values=(1, 500, 0, 0)))
    t = subtract(aggregate([new], INUSE_SPACE), aggregate([base], INUSE_SPACE))
    rows = {r.key.name: r.flat for r in sort_rows(t)}
    assert rows == {"leak_small": 2000, "cache_fill": 500, "main": 0}
    assert t.total == 2500


def test_json_shape() -> None:
    b = Builder()
    t = aggregate([_profile(b)], INUSE_SPACE, "functions")
    d = table_dict(t, sort_rows(t)[:2])
    json.dumps(d)
    assert d["sample_type"] == "inuse_space" and d["unit"] == "bytes"
    assert [r["name"] for r in d["rows"]] == ["leak_big", "leak_small"]
    assert set(d["rows"][0]) == {"name", "file", "line", "module", "flat", "cum", "via", "leaf"}
    assert d["rows"][0]["file"] == "leaky.c"


def test_control_characters_never_reach_the_terminal() -> None:
    """A perf map or DWARF name holding escape sequences is printed with them made visible."""
    import io

    from heapscope.analysis.aggregate import Key, Row, Table
    from heapscope.render.text import render_table

    evil = "jit\x1b]0;owned\x07\x1b[2J\u202egnp.exe\nnext"
    out = io.StringIO()
    render_table(out, Table((Row(Key(evil), 10.0, 10.0),), 10.0, "inuse_space", "bytes"),
                 (Row(Key(evil), 10.0, 10.0),))
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert "jit\\x1b]0;owned\\x07\\x1b[2J\\u202egnp.exe\\x0anext" in text
    assert text.count("\n") == 2  # the total line and one row: the name's newline is escaped
