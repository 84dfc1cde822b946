"""--fail-on-leak and --fail-on-live: the exit status a CI job gets, on real dump files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heapscope.analysis.leaks import LeakReport, find_leaks
from heapscope.analysis.series import group_by_pid, load_series
from heapscope.cli.gates import LEAK_EXIT, UNJUDGED_EXIT, gate
from heapscope.symbols import SymbolOptions
from tests import leaksim as ls

MIB = 1 << 20
R = 512 * 1024  # jemalloc's default period; 64-byte objects: one sample per ~512 KiB


def report(folder: Path, counts: dict[int, list[int]]) -> LeakReport:
    sites = {off: ls.Series(np.asarray([c]), 64, R, False) for off, c in counts.items()}
    paths = [str(p) for p in ls.write_series(folder, 77, sites, 0)]
    (pid, group), = group_by_pid(paths).items()
    return find_leaks([load_series(pid, group, SymbolOptions(cache_dir=None))])


def test_two_dumps_that_grew_10_mib_fail_a_6_mib_threshold(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    # 20 -> 40 samples of ~512 KiB: +10 MiB between two dumps, not yet judged a leak, but
    # a series this short fails closed.
    r = report(tmp_path, {0x100: [20, 40]})
    (proc,) = r.processes
    assert proc.verdict == "undecided"
    assert proc.growing_bytes == pytest.approx(10 * MIB, rel=0.01)
    assert gate(r, 6 * MIB, None) == LEAK_EXIT
    assert "leaks hold 10.0 MiB" in capsys.readouterr().err
    assert gate(r, 11 * MIB, None) == 0


def test_a_single_dump_is_not_judged_but_can_fail_on_live(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    r = report(tmp_path, {0x100: [40]})  # one (final) dump holding ~20 MiB
    assert r.processes[0].verdict == "unjudged"
    assert gate(r, 0, None) == UNJUDGED_EXIT
    assert "needs a series" in capsys.readouterr().err
    assert gate(r, None, 10 * MIB) == LEAK_EXIT
    assert gate(r, None, 30 * MIB) == 0


def test_a_judged_series_without_leaks_passes(tmp_path: Path) -> None:
    r = report(tmp_path, {0x100: [50] * 8, 0x200: [5, 30, 8, 25, 6, 28, 7, 29]})
    assert r.processes[0].verdict == "clean"
    assert gate(r, 0, None) == 0


def _with_rounds(folder: Path, counts: dict[int, list[int]], rounds: int, missed: int
                 ) -> LeakReport:
    sites = {off: ls.Series(np.asarray([c]), 64, R, False) for off, c in counts.items()}
    paths = [str(p) for p in ls.write_series(folder, 77, sites, 0)]
    (pid, group), = group_by_pid(paths).items()
    info = {pid: {"rounds": rounds, "missed_rounds": missed, "missed_why": "pid 77 is stopped"}}
    return find_leaks([load_series(pid, group, SymbolOptions(cache_dir=None))], info=info)


@pytest.mark.parametrize("dumps, rounds, missed, verdict", [
    (8, 8, 0, "clean"),      # nothing missed
    (8, 10, 2, "clean"),     # a fifth missed, eight dumps left: enough to rule a leak out
    (6, 8, 2, "undecided"),  # a quarter missed
    (5, 6, 1, "undecided"),  # five dumps are a short series
    (4, 8, 4, "undecided"),
])
def test_missed_rounds_never_leave_a_process_clean_on_too_little(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], dumps: int, rounds: int,
        missed: int, verdict: str) -> None:
    """A flat series (a steady table) with rounds missed: clean only when enough dumps were
    taken and little was lost; otherwise undecided, with the reason, and --fail-on-leak
    fails closed (exit 11: nothing rules a leak out)."""
    r = _with_rounds(tmp_path, {0x100: [50] * dumps}, rounds, missed)
    (proc,) = r.processes
    assert (proc.verdict, proc.rounds, proc.missed) == (verdict, rounds, missed)
    if verdict == "undecided":
        assert any(f"{missed} of {rounds} rounds of dumps were missed (pid 77 is stopped)" in n
                   and "too few to call it clean" in n for n in r.notes), r.notes
        assert gate(r, 0, None) == UNJUDGED_EXIT
        assert "nothing rules a leak out" in capsys.readouterr().err
    else:
        assert gate(r, 0, None) == 0


def test_missed_rounds_do_not_hide_a_leak(tmp_path: Path) -> None:
    """A leak gaining ~20 samples a dump over 8 dumps taken of 12 rounds is still a leak."""
    r = _with_rounds(tmp_path, {0x100: [20 * (i + 1) for i in range(8)]}, 12, 4)
    (proc,) = r.processes
    assert proc.verdict == "leaks"
    assert gate(r, 0, None) == LEAK_EXIT


def test_growing_beside_a_small_leak_still_counts(tmp_path: Path) -> None:
    """Three dumps: one site leaks a little (a steady 7 samples a dump, a leak already),
    another grows by ~20 MiB with too much scatter to be sure. The process "leaks", and
    --fail-on-leak holds both against it: the growing site alone crosses 10 MiB (a
    process verdict of "leaks" used to drop its growing sites from the gate)."""
    r = report(tmp_path, {0x100: [5, 12, 19], 0x200: [20, 60, 62]})
    (proc,) = r.processes
    verdicts = {f.function: f.verdict for f in r.findings}
    assert proc.verdict == "leaks" and proc.growing_bytes > 15 * MIB, (verdicts, proc)
    assert proc.leak_bytes < 10 * MIB, proc
    assert gate(r, 10 * MIB, None) == LEAK_EXIT
