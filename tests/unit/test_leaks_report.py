"""The leak report end to end on fixed, hand-written series: real heap_v2 files read by the
normal reader, judged, and printed (text against a golden file, JSON against hand counts).

Series (sampled counts per dump, sample period 4 KiB, 4 KiB objects: each sample stands for
4096 / (1 - e^-1) = 6480 bytes), twelve running dumps one minute apart, then an exit dump
written after a clean shutdown that kept only the table:
- leak:   10 → 54, about four samples a dump, never falling;
- cache:  fills in four dumps to ~120, then turns over around it;
- churn:  swings between 5 and 90 with no trend;
- table:  100 throughout, and still there at exit.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heapscope.analysis.leaks import find_leaks
from heapscope.analysis.series import group_by_pid, load_series
from heapscope.render.leaks import render_leaks
from heapscope.symbols import SymbolOptions
from tests import leaksim as ls

SERIES = {
    0x100: [10, 14, 18, 21, 25, 30, 34, 37, 41, 46, 50, 54, 0],  # leak
    0x200: [0, 40, 80, 120, 119, 121, 120, 118, 122, 120, 119, 121, 0],  # cache
    0x300: [50, 10, 80, 20, 60, 5, 90, 30, 70, 15, 85, 25, 0],  # churn
    0x400: [100] * 12 + [100],  # table, kept at exit
}
SAMPLE_BYTES = 4096 / (1 - np.exp(-1.0))


def _write(folder: Path) -> list[str]:
    return ls.write_counts(folder, 4242, SERIES)


@pytest.fixture
def report(tmp_path: Path) -> Any:
    paths = _write(tmp_path / "dumps")
    (pid, group), = group_by_pid(paths).items()
    series = load_series(pid, group, SymbolOptions(cache_dir=None))
    return find_leaks([series])


def test_text_report(report: Any, golden: Any) -> None:
    out = io.StringIO()
    render_leaks(out, report, color=False)
    golden("leaks_report.txt", out.getvalue())


def test_verdicts_and_numbers(report: Any) -> None:
    doc = json.loads(json.dumps(report.as_dict()))
    (proc,) = doc["processes"]
    assert proc["dumps"] == 13 and proc["judged_dumps"] == 12
    assert proc["verdict"] == "leaks"
    assert proc["exit_bytes"] == pytest.approx(100 * SAMPLE_BYTES)
    by = {s["function"]: s for s in doc["suspects"]}
    # the dumps hold return addresses (one past the call), as jemalloc writes them
    leak, cache, churn, table = (by[f"sim+0x{o + 1:x}"] for o in (0x100, 0x200, 0x300, 0x400))
    assert (leak["verdict"], cache["verdict"], churn["verdict"], table["verdict"]) == (
        "leak", "bounded", "churn", "steady")
    assert leak["growth_bytes"] == pytest.approx(44 * SAMPLE_BYTES)
    assert leak["samples"] == 54 and leak["at_exit_bytes"] == 0
    assert leak["growth_bytes_per_dump_95"][0] < 4 * SAMPLE_BYTES < leak[
        "growth_bytes_per_dump_95"][1]
    # one dump a minute: the rate per second is the rate per dump over 60
    assert leak["growth_bytes_per_s"] == pytest.approx(leak["growth_bytes_per_dump"] / 60)
    assert proc["leak_bytes"] == pytest.approx(leak["growth_bytes"])
    assert table["at_exit_bytes"] == pytest.approx(100 * SAMPLE_BYTES)
    assert proc["left_bytes"] == pytest.approx(100 * SAMPLE_BYTES)


def test_leak_report_escapes_control_characters() -> None:
    import io

    from heapscope.analysis.leaks import Finding, LeakReport, ProcessFinding
    from heapscope.render.leaks import render_leaks

    evil = "f\x1b[2Jx"
    proc = ProcessFinding(7, exe="/srv/a\x1b]0;t\x07", dumps=1, judged=1, live_bytes=100.0)
    report = LeakReport([proc], [Finding(7, evil, "a\x1b.c", 3, "m", (evil, "main\x9b"),
                                         100.0, 1.0, "live")], notes=["n\x1bote"])
    out = io.StringIO()
    render_leaks(out, report, color=False)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, text
    assert "f\\x1b[2Jx" in text and "main\\x9b" in text and "n\\x1bote" in text


def _procs_text(helpers: list[tuple[str, int, str]]) -> list[str]:
    from heapscope.analysis.leaks import LeakReport, ProcessFinding
    from heapscope.render.leaks import render_leaks

    procs = [ProcessFinding(100, exe="/usr/bin/python3", cmdline=["python3", "app.py"],
                            dumps=6, judged=6, live_bytes=1e6)]
    procs += [ProcessFinding(200 + i, exe=exe, role="helper", dumps=dumps, judged=dumps,
                             unreadable=unreadable)
              for i, (exe, dumps, unreadable) in enumerate(helpers)]
    out = io.StringIO()
    render_leaks(out, LeakReport(procs, []), color=False)
    return out.getvalue().splitlines()


def test_a_shims_helpers_share_one_line_after_the_program() -> None:
    helpers = [("/usr/bin/bash", 1, "")] * 30 + [("/usr/bin/readlink", 1, "")] * 5 + \
        [("/usr/bin/basename", 2, ""), ("/usr/bin/env", 1, ""), ("/usr/bin/sed", 1, "")]
    lines = _procs_text(helpers)
    assert lines[0] == "processes (1 of the program, 38 wrappers and helpers listed last)"
    assert "python3 app.py" in lines[1]
    assert lines[2] == ("  + 38 wrappers and helpers (bash ×30, readlink ×5, basename, env, …), "
                        "1-2 dumps each, not judged as the program: --format json lists them")
    assert not any("/usr/bin/bash" in ln for ln in lines)


def test_a_helper_whose_dumps_were_unreadable_keeps_its_line() -> None:
    helpers = [("/usr/bin/bash", 1, "")] * 4 + [("/usr/bin/tr", 1, "dump damaged")]
    lines = _procs_text(helpers)
    assert any("/usr/bin/tr" in ln for ln in lines[:4]), lines
    assert "no dump could be read: dump damaged" in "\n".join(lines)
    assert "  + 4 wrappers and helpers (bash ×4), 1 dump each" in "\n".join(lines)


def test_a_few_helpers_are_listed_one_by_one() -> None:
    lines = _procs_text([("/usr/bin/bash", 1, ""), ("/usr/bin/env", 1, "")])
    assert [ln.split()[-1] for ln in lines[2:4]] == ["/usr/bin/bash", "/usr/bin/env"], lines
