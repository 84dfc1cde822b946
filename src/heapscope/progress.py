"""Progress display for slow work: shown on stderr (rich) only once work passes one second."""

from __future__ import annotations

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
    steps, which the series loader reports per process (``reading N dumps of pid P``, 0 of
    1), are counted in dumps across all processes, with a rate and an ETA.

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

    def __enter__(self) -> DelayedProgress:
        if not self.lazy:
            self._begin()
        return self

    def _begin(self) -> None:
        self._began = self.clock()
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
        """Without a terminal: the state as a plain line every ``PLAIN_EVERY`` seconds."""
        while not self._stop.wait(PLAIN_EVERY):
            with self._lock:
                if self._closed:
                    return
                line = self.plain_line()
            try:
                self.stream.write(line + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                return

    def plain_line(self) -> str:
        """The current state as one line: ``heapscope: reading dumps of pid 7: 120/301
        dumps, 4.1 dumps/s, ETA 44 s (29 s)``."""
        what, done, total = self._state
        elapsed = self.clock() - self._began
        parts = [what]
        if total:
            parts.append(f"{done}/{total}" + (" dumps" if self._counting() else ""))
        rate = self._rate(done, total, elapsed)
        if rate:
            parts.append(rate)
        return f"heapscope: {', '.join(parts)} ({_duration(elapsed)})"

    def _counting(self) -> bool:
        return bool(self._dumps) and self._state[0].startswith("reading")

    def _rate(self, done: int, total: int, elapsed: float) -> str:
        return rate_text(done, total, elapsed) if self._counting() else ""

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
            what, done, total = self._state
            self._task = self._bar.add_task(what, total=total or None, completed=done,
                                            count=self._count_text(done, total),
                                            rate=self._rate(done, total,
                                                            self.clock() - self._began))
            self._bar.start()

    def _count_text(self, done: int, total: int) -> str:
        return _count(done, total) + (" dumps" if total and self._counting() else "")

    def update(self, description: str, done: int, total: int) -> None:
        """Report that ``done`` of ``total`` units of ``description`` are finished."""
        if not self.enabled:
            return
        description = clean(description)  # shown on the terminal
        if self.lazy:
            self._begin()
        with self._lock:
            description, done, total = self._in_dumps(description, done, total)
            self._state = (description, done, total)
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, description=description, completed=done,
                                 total=total or None, count=self._count_text(done, total),
                                 rate=self._rate(done, total, self.clock() - self._began))

    def _in_dumps(self, description: str, done: int, total: int) -> tuple[str, int, int]:
        """A per-process reading step restated in dumps across every process: the dumps of
        the processes read before this one are done."""
        m = _READING.match(description)
        if not self._dumps or m is None:
            return description, done, total
        pid: int | None = None if m.group(2) == "None" else int(m.group(2))
        if pid not in self._read:
            self._read.append(pid)
        before = sum(self._dumps.get(p, 0) for p in self._read[:-1])
        mine = self._dumps.get(pid, 0)
        # keep_raw reading reports dumps itself (k of n in this process)
        inside = done if m.group(1) is None and total == mine else 0
        return (f"reading dumps of pid {m.group(2)}", before + inside,
                sum(self._dumps.values()))


# "reading 301 dumps of pid 7" (counts only, 0 of 1) or "reading dumps of pid 7" (k of n)
_READING = re.compile(r"reading (?:(\d+) )?dumps of pid (\d+|None)$")


def _count(done: int, total: int) -> str:
    return f"{done}/{total}" if total else ""


# --- plain progress lines (no terminal) and the rounds of run --every / attach watch --------

Clock = Callable[[], float]

#: Seconds between two plain progress lines when stderr is not a terminal: a CI log shows
#: life without one line per round (an --every 1 run of an hour would write 3,600 lines).
PLAIN_EVERY = 15.0


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
    ``PLAIN_EVERY`` seconds, and ``close`` writes the last state if it was held back.
    """

    def __init__(self, stream: TextIO, tty: bool | None = None,
                 clock: Clock = time.monotonic, enabled: bool = True) -> None:
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.enabled = enabled
        self.throttle = Throttle(0.0 if self.tty else PLAIN_EVERY, clock)
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
