"""Progress display for slow work: shown on stderr (rich) only once work passes one second."""

from __future__ import annotations

import sys
import threading
from types import TracebackType
from typing import TYPE_CHECKING

from heapscope.terminal import clean

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class DelayedProgress:
    """A progress display that appears only when work runs for more than ``delay`` seconds.

    Used as a context manager; ``update(description, done, total)`` matches the
    ``symbols.options.Progress`` callback. A timer starts the display, so it also appears
    during one long step (such as parsing a 90 MB dump) that sends no updates; rich then
    refreshes it from its own thread. Nothing is drawn when stderr is not a terminal.
    """

    def __init__(self, delay: float = 1.0, enabled: bool | None = None) -> None:
        self.delay = delay
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._lock = threading.Lock()
        self._state = ("working", 0, 0)
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._timer: threading.Timer | None = None
        self._closed = False

    def __enter__(self) -> DelayedProgress:
        if self.enabled:
            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            if self._bar is not None:
                self._bar.stop()
                self._bar = None

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
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            what, done, total = self._state
            self._task = self._bar.add_task(what, total=total or None, completed=done,
                                            count=_count(done, total))
            self._bar.start()

    def update(self, description: str, done: int, total: int) -> None:
        """Report that ``done`` of ``total`` units of ``description`` are finished."""
        if not self.enabled:
            return
        description = clean(description)  # shown on the terminal
        with self._lock:
            self._state = (description, done, total)
            if self._bar is not None and self._task is not None:
                self._bar.update(self._task, description=description, completed=done,
                                 total=total or None, count=_count(done, total))


def _count(done: int, total: int) -> str:
    return f"{done}/{total}" if total else ""
