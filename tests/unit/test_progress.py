"""Progress lines: their wording, and how often they may be written (a fake clock: no
sleeping, no wall-clock values)."""

from __future__ import annotations

import io

from heapscope.progress import (
    PLAIN_EVERY,
    DelayedProgress,
    RoundReporter,
    RoundStatus,
    Throttle,
    rate_text,
    round_line,
)
from heapscope.seriesview import Growth, growth_text


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _status(n: int, dumps: dict[int, int] | None = None) -> RoundStatus:
    return RoundStatus(n, None, dumps or {1: n}, None, None)


def test_round_line_with_pause_and_growth() -> None:
    s = RoundStatus(7, None, {11: 7, 12: 7, 13: 7}, 0.004, 0.009, 0,
                    "1 stack +1.2 MiB/min (pid 11)")
    assert round_line(s) == ("heapscope: round 7 · 3 processes · 21 dumps (7 per process) · "
                             "pause 4.0 ms (max 9.0 ms) · growing: 1 stack +1.2 MiB/min "
                             "(pid 11)")


def test_round_line_through_the_helper_and_of_a_count() -> None:
    s = RoundStatus(2, 6, {5: 2}, None, None)
    assert round_line(s) == "heapscope: round 2 of 6 · 1 process · 2 dumps · no pause (helper)"
    uneven = RoundStatus(4, None, {1: 4, 2: 2}, 0.0123, 0.0123, 1)
    assert round_line(uneven) == ("heapscope: round 4 · 2 processes · 6 dumps (2-4 per "
                                  "process) · 1 missed · pause 12 ms (max 12 ms)")


def test_growth_text_names_the_fastest_process() -> None:
    assert growth_text([]) == ""
    assert growth_text([Growth(3, 0, 0.0)]) == ""
    text = growth_text([Growth(3, 2, 1024.0), Growth(4, 5, 3 * 1024 * 1024.0)])
    assert text == "5 stacks +3.0 MiB/min (pid 4), 1 more process"


def test_throttle_lets_one_line_through_per_period() -> None:
    clock = FakeClock()
    t = Throttle(15.0, clock)
    assert t.ready()
    clock.now += 14.9
    assert not t.ready()
    clock.now += 0.1
    assert t.ready()
    assert not t.ready()
    every = Throttle(0.0, clock)
    assert every.ready() and every.ready()


def test_reporter_on_a_terminal_writes_every_round() -> None:
    out = io.StringIO()
    r = RoundReporter(out, tty=True, clock=FakeClock())
    for n in range(1, 4):
        r.round(_status(n))
    r.close()
    assert [line.split(" · ")[0] for line in out.getvalue().splitlines()] == [
        "heapscope: round 1", "heapscope: round 2", "heapscope: round 3"]


def test_reporter_in_a_log_is_rate_limited_and_ends_on_the_last_round() -> None:
    clock = FakeClock()
    out = io.StringIO()
    r = RoundReporter(out, tty=False, clock=clock)
    for n in range(1, 41):  # one round a second for 40 s
        r.round(_status(n))
        clock.now += 1.0
    r.close()
    firsts = [line.split(" · ")[0] for line in out.getvalue().splitlines()]
    assert PLAIN_EVERY == 15.0
    assert firsts == ["heapscope: round 1", "heapscope: round 16", "heapscope: round 31",
                      "heapscope: round 40"]
    r.close()  # nothing held: nothing more
    assert len(out.getvalue().splitlines()) == 4


def test_reporter_disabled_writes_nothing() -> None:
    out = io.StringIO()
    r = RoundReporter(out, tty=True, enabled=False)
    r.round(_status(1))
    r.close()
    assert out.getvalue() == ""


def test_rate_and_eta() -> None:
    assert rate_text(0, 10, 5.0) == ""
    assert rate_text(30, 300, 10.0) == "3.0 dumps/s, ETA 1 min 30 s"
    assert rate_text(300, 300, 10.0) == "30.0 dumps/s"
    assert rate_text(1000, 100000, 2.0) == "500 dumps/s, ETA 3 min 18 s"
    assert rate_text(1, 10000, 1.0) == "1.0 dumps/s, ETA 2 h 46 min"


def test_reading_is_counted_in_dumps_across_processes() -> None:
    """The loader reports per process (k of n); the display counts dumps of all of them."""
    clock = FakeClock()
    bar = DelayedProgress(enabled=True, clock=clock, stream=io.StringIO(),
                          dumps={7: ["a"] * 301, 8: ["b"] * 99})
    bar.update("reading dumps of pid 7", 0, 301)
    assert bar.plain_line() == "heapscope: reading dumps of pid 7, 0/400 dumps (0 s)"
    clock.now += 30.0
    bar.update("reading dumps of pid 7", 137, 301)
    assert bar.plain_line() == ("heapscope: reading dumps of pid 7, 137/400 dumps, "
                                "4.6 dumps/s, ETA 58 s (30 s)")
    clock.now += 30.0
    bar.update("reading dumps of pid 8", 0, 99)
    assert bar.plain_line() == ("heapscope: reading dumps of pid 8, 301/400 dumps, "
                                "5.0 dumps/s, ETA 20 s (1 min 00 s)")
    bar.update("symbolizing libc.so.6", 3, 10)
    assert bar.plain_line() == "heapscope: symbolizing libc.so.6, 3/10 (1 min 00 s)"


def test_reading_one_by_one_counts_each_dump() -> None:
    clock = FakeClock()
    bar = DelayedProgress(enabled=True, clock=clock, stream=io.StringIO(),
                          dumps={None: ["a"] * 4, 3: ["b"] * 6})
    bar.update("reading dumps of pid None", 2, 4)
    clock.now += 2.0
    assert bar.plain_line() == ("heapscope: reading dumps of pid None, 2/10 dumps, "
                                "1.0 dumps/s, ETA 8 s (2 s)")
    bar.update("reading dumps of pid 3", 1, 6)
    assert bar.plain_line().startswith("heapscope: reading dumps of pid 3, 5/10 dumps")


def test_lazy_progress_waits_for_work() -> None:
    """``run``: nothing is timed (nor drawn) while the program runs."""
    clock = FakeClock()
    with DelayedProgress(enabled=True, clock=clock, stream=io.StringIO(), lazy=True) as bar:
        clock.now += 100.0  # the program runs
        assert bar.lazy
        bar.update("symbolizing dumps of pid 1", 0, 2)
        assert not bar.lazy
        clock.now += 3.0
        assert bar.plain_line() == "heapscope: symbolizing dumps of pid 1, 0/2 (3 s)"
