"""Progress display for slow work: shown on stderr (rich) only once work passes one second."""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn


class DelayedProgress:
    """A progress bar that appears only when a task runs for more than ``delay`` seconds.

    Used as a context manager; ``update(description, done, total)`` matches the
    ``symbols.options.Progress`` callback. Nothing is drawn when stderr is not a terminal.
    """

    def __init__(self, delay: float = 1.0, enabled: bool | None = None) -> None:
        self.delay = delay
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.started = time.monotonic()
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __enter__(self) -> DelayedProgress:
        self.started = time.monotonic()
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def update(self, description: str, done: int, total: int) -> None:
        """Report that ``done`` of ``total`` units of ``description`` are finished."""
        if not self.enabled:
            return
        if self._bar is None:
            if time.monotonic() - self.started < self.delay:
                return
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._bar.start()
            self._task = self._bar.add_task(description, total=total)
        assert self._task is not None
        self._bar.update(self._task, description=description, completed=done, total=total)
