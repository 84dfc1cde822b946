"""Progress display for slow work: shown on stderr (rich) only once work passes one second.

Without a terminal (a CI log) a plain line takes the bar's place every ``PLAIN_EVERY``
seconds; ``$HEAPSCOPE_PROGRESS_EVERY`` (seconds, 0 for a line at every step) changes that
period, for a log that wants more or fewer lines, and for tests.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

from heapscope.terminal import clean

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class DelayedProgress:
    """A progress display that appears only when work runs for more than ``delay`` seconds.

    Used as a context manager; ``update(description, done, total)`` matches the
    ``symbols.options.Progress`` callback. A timer starts the display, so it also appears
    during one long step (such as parsing a 90 MB dump) that sends no updates; rich then
    refreshes it from its own thread. When stderr is not a terminal (a CI log), a plain line
    of the same state is written at most every ``PLAIN_EVERY`` seconds instead.

    With ``dumps`` (the dump paths per process, as ``group_by_pid`` gives them) the reading
    steps, which the series loader reports per process (``reading dumps of pid P``, k of n
    after each dump), are counted in dumps across all processes, with a rate and an ETA.

    Plain lines come from a timer thread when no step reports (one long step), and from
    ``update`` when the period has passed since the last line; once a line has been written,
    the end of the reading (every dump read) gets its line too, so the log shows the count
    reach its total.

    ``lazy`` waits for the first update before anything is timed or shown: ``run`` reports
    only once the program has ended, and a bar drawn during the program's run would be torn
    by the program's own output on the terminal they share.
    """

    def __init__(self, delay: float = 1.0, enabled: bool | None = None,
                 dumps: dict[int | None, list[str]] | None = None,
                 stream: TextIO | None = None, clock: Clock = time.monotonic,
                 lazy: bool = False) -> None:
        self.delay = delay
        self.lazy = lazy
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty()
        self.enabled = True if enabled is None else enabled
        self.clock = clock
        self._lock = threading.Lock()
        self._state = ("working", 0, 0)
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._timer: threading.Timer | None = None
        self._plain: threading.Thread | None = None
        self._stop = threading.Event()
        self._closed = False
        self._dumps = {pid: len(paths) for pid, paths in (dumps or {}).items()}
        self._read: list[int | None] = []  # processes whose reading has begun, in order
        self._began = clock()
        self.every = plain_every()
        self._last_line = self._began  # when the last plain line was written (or work began)
        self._outer: tuple[int, int] | None = None  # dumps read one by one, of how many
        # the state (and dumps read) the last plain line showed
        self._wrote: tuple[tuple[str, int, int], tuple[int, int] | None] | None = None

    def __enter__(self) -> DelayedProgress:
        if not self.lazy:
            self._begin()
        return self

    def _begin(self) -> None:
        self._began = self._last_line = self.clock()
        self.lazy = False
        if self.enabled and self.tty:
            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        elif self.enabled:
            self._plain = threading.Thread(target=self._plain_lines, daemon=True,
                                           name="heapscope-progress")
            self._plain.start()

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                self._bar.stop()
                self._bar = None

    def _plain_lines(self) -> None:
        """Without a terminal: the state as a plain line when ``every`` seconds have passed
        since the last one (which ``update`` may have written)."""
        while not self._stop.wait(self.every if self.every > 0 else PLAIN_EVERY):
            with self._lock:
                if self._closed:
                    return
                if self.clock() - self._last_line >= self.every:
                    self._write_plain()

    def _write_plain(self) -> None:
        """Write the current state as a plain line (the lock held)."""
        self._last_line = self.clock()
        self._wrote = (self._state, self._outer)
        try:
            self.stream.write(self.plain_line() + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False  # stderr gone: progress is not worth failing the work for

    def plain_line(self) -> str:
        """The current state as one line: ``heapscope: reading dumps of pid 7, 120/301
        dumps, 4.1 dumps/s, ETA 44 s (29 s)``."""
        what, _done, _total, count, rate = self._view()
        elapsed = self.clock() - self._began
        return f"heapscope: {', '.join(p for p in (what, count, rate) if p)} " \
               f"({_duration(elapsed)})"

    def _view(self) -> tuple[str, int, int, str, str]:
        """What to show of the state: the step, the bar's done and total, the count in
        words, and the rate and ETA of dumps (empty when nothing counts dumps)."""
        what, done, total = self._state
        count = _count(done, total)
        dumps = self._dumps_done()
        if dumps is not None and dumps != (done, total):
            # a step inside one dump of a command that reads dumps one by one
            done, total = dumps
            count = ", ".join(c for c in (count, f"{done}/{total} dumps") if c)
        elif dumps is not None:
            count += " dumps"
        rate = rate_text(*dumps, self.clock() - self._began) if dumps is not None else ""
        return what, done, total, count, rate

    def _dumps_done(self) -> tuple[int, int] | None:
        """(dumps read, of how many) when something counts them: the series loader's
        reading step, or a command that reads dumps one by one (:data:`DUMPS_READ`)."""
        what, done, total = self._state
        if total and _READING.match(what):
            return done, total
        return self._outer

    def _show(self) -> None:
        # rich is imported only when a display is really needed: it costs start-up time.
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with self._lock:
            if self._closed:
                return
            self._bar = Progress(
                # Descriptions name modules and dumps: plain text, never rich markup.
                TextColumn("{task.description}", markup=False),
                BarColumn(),
                TextColumn("{task.fields[count]}"),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            what, done, total, count, rate = self._view()
            self._task = self._bar.add_task(what, total=total or None, completed=done,
                                            count=count, rate=rate)
            self._bar.start()

    def update(self, description: str, done: int, total: int) -> None:
        """Report that ``done`` of ``total`` units of ``description`` are finished."""
        if not self.enabled:
            return
        description = clean(description)  # shown on the terminal
        if self.lazy:
            self._begin()
        with self._lock:
            if description == DUMPS_READ:
                self._outer = (done, total) if total else None
            else:
                self._state = self._in_dumps(description, done, total)
            if self._bar is not None and self._task is not None:
                what, done, total, count, rate = self._view()
                self._bar.update(self._task, description=what, completed=done,
                                 total=total or None, count=count, rate=rate)
            elif self._plain is not None and not self._closed and self._plain_due():
                self._write_plain()

    def _plain_due(self) -> bool:
        """True when ``update`` should write a plain line now: the period has passed, or
        the reading has just ended and the log has already shown part of it."""
        if self.clock() - self._last_line >= self.every:
            return True
        dumps = self._dumps_done()
        return (self._wrote is not None and dumps is not None and dumps[0] == dumps[1]
                and self._wrote != (self._state, self._outer))

    def _in_dumps(self, description: str, done: int, total: int) -> tuple[str, int, int]:
        """A per-process reading step (k of n) restated in dumps across every process: the
        dumps of the processes read before this one are done."""
        m = _READING.match(description)
        if not self._dumps or m is None:
            return description, done, total
        pid: int | None = None if m.group(1) == "None" else int(m.group(1))
        if pid not in self._read:
            self._read.append(pid)
        before = sum(self._dumps.get(p, 0) for p in self._read[:-1])
        mine = self._dumps.get(pid, 0)
        # n is this process's dumps as the display was told them; if not, k says nothing
        inside = done if total == mine else 0
        return description, before + inside, sum(self._dumps.values())


# the series loader's step: "reading dumps of pid 7", k of n after each dump
_READING = re.compile(r"reading dumps of pid (\d+|None)$")

#: What a command that reads its dumps one by one reports between two dumps (k of n dumps
#: read): shown beside the steps inside each dump, with a rate and an ETA, never in their
#: place.
DUMPS_READ = "dumps read"


def _count(done: int, total: int) -> str:
    return f"{done}/{total}" if total else ""


# --- plain progress lines (no terminal) and the rounds of run --every / attach watch --------

Clock = Callable[[], float]

#: Seconds between two plain progress lines when stderr is not a terminal: a CI log shows
#: life without one line per round (an --every 1 run of an hour would write 3,600 lines).
PLAIN_EVERY = 15.0
EVERY_ENV = "HEAPSCOPE_PROGRESS_EVERY"


def plain_every() -> float:
    """Seconds between two plain progress lines: ``$HEAPSCOPE_PROGRESS_EVERY`` when it is a
    number >= 0, else :data:`PLAIN_EVERY`."""
    try:
        every = float(os.environ.get(EVERY_ENV, ""))
    except ValueError:
        return PLAIN_EVERY
    return every if 0 <= every < float("inf") else PLAIN_EVERY


class Throttle:
    """Says whether a progress line may be written now: at most one per ``every`` seconds
    of ``clock`` (the first at once). ``every`` 0 lets every line through (a terminal)."""

    def __init__(self, every: float, clock: Clock = time.monotonic) -> None:
        self.every = every
        self.clock = clock
        self._last: float | None = None

    def ready(self) -> bool:
        """True (and the time remembered) when a line may be written now."""
        now = self.clock()
        if self._last is not None and now - self._last < self.every:
            return False
        self._last = now
        return True


def rate_text(done: int, total: int, elapsed: float) -> str:
    """``12.3 dumps/s, ETA 20 s`` for ``done`` of ``total`` dumps after ``elapsed``
    seconds; empty until there is a rate to speak of."""
    if done <= 0 or elapsed <= 0:
        return ""
    rate = done / elapsed
    text = f"{rate:.1f} dumps/s" if rate < 100 else f"{rate:.0f} dumps/s"
    if total > done:
        text += f", ETA {_duration((total - done) / rate)}"
    return text


def _duration(seconds: float) -> str:
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m} min {s:02d} s"
    h, m = divmod(m, 60)
    return f"{h} h {m:02d} min"


@dataclass
class RoundStatus:
    """Where a series of periodic dumps stands after one round (``run --every``,
    ``attach watch``): what a round line shows."""

    round: int
    of: int | None  # rounds asked for (attach watch --count), None when open-ended
    dumps: dict[int, int]  # per process alive in the series: its dumps so far
    pause_s: float | None  # longest stop of a process in this round; None: no stop (helper)
    max_pause_s: float | None  # longest stop so far
    missed: int = 0  # dumps this round did not bring
    growing: str = ""  # the cheap estimate of sites growing so far, when there is one


def round_line(s: RoundStatus) -> str:
    """One compact line: ``heapscope: round 7 · 3 processes · 21 dumps (7 per process) ·
    pause 4.0 ms (max 9.0 ms) · growing: …``."""
    n = len(s.dumps)
    total = sum(s.dumps.values())
    parts = [f"round {s.round}" + (f" of {s.of}" if s.of else ""),
             f"{n} process{'es' if n != 1 else ''}"]
    per = sorted(s.dumps.values())
    dumps = f"{total} dump{'s' if total != 1 else ''}"
    if n > 1:
        dumps += (f" ({per[0]} per process)" if per[0] == per[-1]
                  else f" ({per[0]}-{per[-1]} per process)")
    parts.append(dumps)
    if s.missed:
        parts.append(f"{s.missed} missed")
    if s.pause_s is None and s.max_pause_s is None:
        parts.append("no pause (helper)")
    else:
        parts.append(f"pause {_ms(s.pause_s or 0.0)} (max {_ms(s.max_pause_s or 0.0)})")
    if s.growing:
        parts.append(f"growing: {s.growing}")
    return "heapscope: " + " · ".join(parts)


def _ms(seconds: float) -> str:
    ms = seconds * 1000
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


class RoundReporter:
    """Writes round lines of a dump series to ``stream`` (heapscope's stderr).

    Why one line per round and no live, redrawn view: under ``run`` the terminal is shared
    with the program, whose own output heapscope can neither see nor hold back; a redrawn
    status line (rich's live view) would be torn by it, or would erase and overwrite the
    program's last line. Whole lines never mix with the program's lines except in order. On
    a terminal every round gets its line; elsewhere (a CI log) one line at most every
    ``PLAIN_EVERY`` seconds (or ``$HEAPSCOPE_PROGRESS_EVERY``), and ``close`` writes the
    last state if it was held back.
    """

    def __init__(self, stream: TextIO, tty: bool | None = None,
                 clock: Clock = time.monotonic, enabled: bool = True) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.enabled = enabled
        self.throttle = Throttle(0.0 if self.tty else plain_every(), clock)
        self._held: RoundStatus | None = None
        self._lock = threading.Lock()

    def round(self, status: RoundStatus) -> None:
        """Report one finished round (written now or held back by the throttle)."""
        if not self.enabled:
            return
        with self._lock:
            if self.throttle.ready():
                self._write(status)
                self._held = None
            else:
                self._held = status

    def close(self) -> None:
        """Write the last round if its line was held back, so the log ends on the truth."""
        with self._lock:
            if self._held is not None:
                self._write(self._held)
                self._held = None

    def _write(self, status: RoundStatus) -> None:
        try:
            self.stream.write(clean(round_line(status)) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False  # stderr gone: progress is not worth failing the run for
