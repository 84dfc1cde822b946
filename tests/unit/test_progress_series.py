"""Progress while a series is read: the loader tells each dump read (k of n, 1..n in order)
in the serial path, in the worker processes' path and from the scan cache, and the display
counts those in dumps across processes, with plain lines that end at the total.

The dumps are real heap_v2 files (``tests.leaksim.write_series``); the expected counts are
the number of files written."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from heapscope.analysis import series as series_mod
from heapscope.analysis.series import group_by_pid
from heapscope.formats import scan
from heapscope.formats.scan import PARALLEL_MIN, Scanner
from heapscope.inputs import judge
from heapscope.progress import (
    DUMPS_READ,
    EVERY_ENV,
    PLAIN_EVERY,
    DelayedProgress,
    plain_every,
)
from heapscope.symbols import SymbolOptions
from tests import leaksim as ls

N = 24  # dumps of the main series: above PARALLEL_MIN, so two jobs use worker processes


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _series(folder: Path, pid: int, n: int) -> list[str]:
    """``n`` dumps of one process (the last a final dump): two growing sites, one steady."""
    sites = {0x100: ls.Series(np.arange(1, n + 1)[None, :] * 3, 4096, 4096, False),
             0x200: ls.Series(np.full((1, n), 40), 4096, 4096, False),
             0x300: ls.Series(np.arange(1, n + 1)[None, :], 4096, 4096, False)}
    return [str(p) for p in ls.write_series(folder, pid, sites, 0)]


class Recorder:
    """A progress callback that keeps every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    def __call__(self, what: str, done: int, total: int) -> None:
        self.calls.append((what, done, total))

    def reading(self, pid: int) -> list[int]:
        """The counts told for the reading of ``pid``'s dumps (each of them of all its
        dumps)."""
        got = [(done, total) for what, done, total in self.calls
               if what == f"reading dumps of pid {pid}"]
        assert {total for _, total in got} <= {N}, got
        return [done for done, _ in got]


@pytest.fixture
def dumps(tmp_path: Path) -> list[str]:
    paths = _series(tmp_path / "dumps", 4242, N)
    assert len(paths) == N
    return paths


@pytest.fixture
def parallel_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many dumps each call of the worker processes' path was given."""
    calls: list[int] = []
    real = Scanner._parallel

    def spy(self: Scanner, paths: list[str], todo: list[int], *rest: Any) -> None:
        calls.append(len(todo))
        real(self, paths, todo, *rest)

    monkeypatch.setattr(Scanner, "_parallel", spy)
    return calls


@pytest.mark.parametrize("jobs", [1, 2], ids=["serial", "workers"])
def test_leaks_pipeline_tells_every_dump(dumps: list[str], tmp_path: Path, jobs: int,
                                         parallel_calls: list[int],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series_mod, "_jobs", lambda: jobs)
    seen = Recorder()
    series, _report = judge([str(tmp_path / "dumps")], dumps, SymbolOptions(cache_dir=None),
                           None, progress=seen)
    assert series[0].count == N
    # 0 of N names the step before the first dump; then each dump once, in order
    assert seen.reading(4242) == list(range(N + 1))
    assert parallel_calls == ([N] if jobs > 1 else [])
    # whichever path read them, the sampled objects per site are those written:
    # 3·(1+…+24), 40·24 and 1+…+24
    assert sorted(series[0].samples.sum(axis=1)) == [300.0, 900.0, 960.0]


def test_dumps_from_the_scan_cache_are_told_too(dumps: list[str], tmp_path: Path,
                                                parallel_calls: list[int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(series_mod, "_jobs", lambda: 2)
    options = SymbolOptions(cache_dir=str(tmp_path / "cache"))
    cold, warm = Recorder(), Recorder()
    judge([str(tmp_path / "dumps")], dumps, options, None, progress=cold)
    judge([str(tmp_path / "dumps")], dumps, options, None, progress=warm)
    assert cold.reading(4242) == warm.reading(4242) == list(range(N + 1))
    assert parallel_calls == [N]  # the second run scanned nothing


def test_a_dump_the_workers_leave_is_counted_when_read(dumps: list[str],
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """A dump the fast reader refuses (a carriage return in its records) is read by the full
    parser in this process, after the workers: counted then, once."""
    odd = Path(dumps[5])
    odd.write_bytes(odd.read_bytes().replace(b"\n@", b"\r\n@", 1))
    told: list[int] = []
    got = Scanner().read_all(dumps, jobs=2, done=told.append)
    assert len(got) == N
    assert told == list(range(1, N + 1))


def test_a_worker_count_that_falls_back_is_not_told_twice() -> None:
    told: list[int] = []
    tally = scan._Tally(told.append, 10)
    tally.to(2)
    tally.to(6)  # the workers' count, read once: every number up to it
    tally.to(4)  # a share refused after it was counted: read again, nothing told
    tally.to(12)  # never past the total
    assert told == list(range(1, 11))


def test_fewer_dumps_than_worth_workers_stay_serial(tmp_path: Path,
                                                    parallel_calls: list[int]) -> None:
    paths = _series(tmp_path / "few", 7, PARALLEL_MIN - 1)
    told: list[int] = []
    Scanner().read_all(paths, jobs=2, done=told.append)
    assert told == list(range(1, PARALLEL_MIN))
    assert parallel_calls == []


def test_display_counts_dumps_across_processes(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes (24 and 10 dumps): the display's count runs 0..34 without a step back,
    and the plain line names the dumps of all processes."""
    monkeypatch.setattr(series_mod, "_jobs", lambda: 1)
    paths = _series(tmp_path / "a", 4242, N) + _series(tmp_path / "b", 77, 10)
    groups = group_by_pid(paths)
    clock = FakeClock()
    bar = DelayedProgress(enabled=True, clock=clock, stream=io.StringIO(), dumps=groups)
    counts: list[int] = []

    def update(what: str, done: int, total: int) -> None:
        bar.update(what, done, total)
        clock.now += 0.5
        state = bar._state
        if state[0].startswith("reading"):
            assert state[2] == N + 10
            counts.append(state[1])

    judge([str(tmp_path)], paths, SymbolOptions(cache_dir=None), None, progress=update)
    assert sorted(set(counts)) == list(range(N + 10 + 1))
    assert counts == sorted(counts)
    assert counts[-1] == N + 10


def _updates(bar: DelayedProgress, clock: FakeClock, pid: int, n: int) -> None:
    """The loader's calls for ``n`` dumps read one a second."""
    bar.update(f"reading dumps of pid {pid}", 0, n)
    for k in range(1, n + 1):
        clock.now += 1.0
        bar.update(f"reading dumps of pid {pid}", k, n)


def test_plain_lines_show_the_count_rise_and_end_at_the_total(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """No terminal, 40 dumps read one a second: a line at 15 s and 30 s (the period), and
    one when the last dump is read, so the log ends at 40/40."""
    monkeypatch.delenv(EVERY_ENV, raising=False)
    clock = FakeClock()
    out = io.StringIO()
    with DelayedProgress(clock=clock, stream=out, dumps={9: ["d"] * 40}) as bar:
        _updates(bar, clock, 9, 40)
        bar.update("symbolizing /srv/app", 0, 1)
    assert out.getvalue().splitlines() == [
        "heapscope: reading dumps of pid 9, 15/40 dumps, 1.0 dumps/s, ETA 25 s (15 s)",
        "heapscope: reading dumps of pid 9, 30/40 dumps, 1.0 dumps/s, ETA 10 s (30 s)",
        "heapscope: reading dumps of pid 9, 40/40 dumps, 1.0 dumps/s (40 s)",
    ]


def test_a_short_read_writes_no_plain_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVERY_ENV, raising=False)
    clock = FakeClock()
    out = io.StringIO()
    with DelayedProgress(clock=clock, stream=out, dumps={9: ["d"] * 10}) as bar:
        _updates(bar, clock, 9, 10)  # 10 s: under one period
    assert out.getvalue() == ""


def test_every_zero_writes_a_line_per_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EVERY_ENV, "0")
    clock = FakeClock()
    out = io.StringIO()
    with DelayedProgress(clock=clock, stream=out, dumps={9: ["d"] * 5}) as bar:
        _updates(bar, clock, 9, 5)
    counts = [re.search(r", (\d+)/5 dumps\b", line) for line in out.getvalue().splitlines()]
    assert [int(m[1]) for m in counts if m] == [0, 1, 2, 3, 4, 5]
    assert len(counts) == 6


@pytest.mark.parametrize(("text", "every"), [
    (None, PLAIN_EVERY), ("2.5", 2.5), ("0", 0.0), ("-1", PLAIN_EVERY), ("soon", PLAIN_EVERY),
    ("inf", PLAIN_EVERY), ("nan", PLAIN_EVERY)])
def test_plain_every_from_the_environment(text: str | None, every: float,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if text is None:
        monkeypatch.delenv(EVERY_ENV, raising=False)
    else:
        monkeypatch.setenv(EVERY_ENV, text)
    assert plain_every() == every


def test_dumps_read_one_by_one_are_counted_beside_each_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``top`` of 3 dumps: the steps inside each dump keep their own counts, and the dumps
    read so far show beside them with a rate; the end of the count gets its line."""
    monkeypatch.setenv(EVERY_ENV, "20")
    clock = FakeClock()
    out = io.StringIO()
    with DelayedProgress(clock=clock, stream=out) as bar:
        for k, name in enumerate(["a.heap", "b.heap", "c.heap"]):
            bar.update(DUMPS_READ, k, 3)
            bar.update(f"reading {name}", 0, 0)
            clock.now += 6.0
            bar.update("symbolizing libc.so.6", 1, 4)
            if k == 1:
                assert bar.plain_line() == ("heapscope: symbolizing libc.so.6, 1/4, 1/3 dumps, "
                                            "0.1 dumps/s, ETA 28 s (14 s)")
            clock.now += 2.0
        bar.update(DUMPS_READ, 3, 3)
    assert out.getvalue().splitlines() == [
        # 22 s: the period (20 s) passed during the third dump
        "heapscope: symbolizing libc.so.6, 1/4, 2/3 dumps, 0.1 dumps/s, ETA 11 s (22 s)",
        "heapscope: symbolizing libc.so.6, 1/4, 3/3 dumps, 0.1 dumps/s (24 s)",
    ]


def _plain_counts(text: str, total: int) -> list[int]:
    return [int(m[1]) for m in re.finditer(rf", (\d+)/{total} dumps\b", text)]


@pytest.mark.parametrize("command", ["leaks", "top"])
def test_commands_print_the_count_of_dumps_in_a_log(
        command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The command line in this process, stderr not a terminal, a line at every step: the
    count of dumps rises one by one to the number of files given."""
    from heapscope.cli.main import main

    monkeypatch.setenv(EVERY_ENV, "0")
    monkeypatch.setenv("HEAPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    paths = _series(tmp_path / "dumps", 4242, N)
    assert main([command, *paths, "--no-cache"]) == 0
    counts = _plain_counts(capsys.readouterr().err, N)
    assert counts == sorted(counts)
    assert sorted(set(counts)) == list(range(N + 1))
