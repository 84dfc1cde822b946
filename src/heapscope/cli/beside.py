"""A viewer beside another command: ``run --serve``, ``attach PID watch --serve`` and the
shell's ``web`` serve what they work on in the browser while they work.

The viewer is :class:`heapscope.serve.server.Viewer` (the one of ``heapscope serve``) run in a
thread of this process; the page's live polling shows the dumps the command writes as they
come. Starlette and uvicorn are imported only when a viewer is asked for, so a plain ``run``
or ``top`` starts as fast as before. A viewer never decides how the command goes: one that
cannot start is a warning, and the command carries on without it.
"""

from __future__ import annotations

import gc
import shlex
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, TextIO

from heapscope.analysis.fold import FramePolicy
from heapscope.symbols import SymbolOptions
from heapscope.terminal import clean

if TYPE_CHECKING:
    from heapscope.serve.server import Viewer

#: How often :meth:`SideViewer.stay` looks whether it was asked to stop.
STAY_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class ViewerInputs:
    """What a viewer is started on: the paths it lists, and how their dumps are read."""

    paths: tuple[str, ...]
    symbols: SymbolOptions
    frames: FramePolicy
    source_paths: tuple[str, ...] = ()
    trust_uids: tuple[int, ...] = ()


def look_again(session: str) -> str:
    """The command that shows ``session`` in the browser again."""
    return f"heapscope serve {clean(shlex.quote(session))}"


class SideViewer:
    """A viewer of ``inputs`` in a thread beside a command; its lines go to ``err``."""

    def __init__(self, inputs: ViewerInputs, err: TextIO | None = None) -> None:
        self.inputs = inputs
        self.err = err
        self.viewer: Viewer | None = None

    def _say(self, text: str) -> None:
        err = self.err or sys.stderr
        err.write(f"heapscope: {text}\n")
        err.flush()

    @property
    def url(self) -> str | None:
        """The URL to open (with its token), while the viewer serves."""
        return self.viewer.url if self.running and self.viewer is not None else None

    @property
    def running(self) -> bool:
        """True while the viewer serves."""
        return self.viewer is not None and self.viewer.running

    def start(self) -> bool:
        """Start serving and print the URL in one line; False, with a warning, when the
        viewer cannot start (the command goes on)."""
        if self.running:
            return True
        try:
            from heapscope.serve.server import Viewer
            from heapscope.serve.views import Settings

            inp = self.inputs
            viewer = Viewer(list(inp.paths), Settings(inp.symbols, inp.frames, inp.source_paths),
                            trust_uids=inp.trust_uids)
            # The command line switches the cyclic collector off for short commands; a
            # server's requests leave cycles behind, and it may run for hours.
            gc.enable()
            viewer.start()
        except ImportError as e:
            # starlette and uvicorn are dependencies, but an install may have lost one
            self._say(f"warning: no viewer: {clean(e.name or str(e))} is not installed; going "
                      "on without it")
            return False
        except Exception as e:  # a viewer never takes the command down with it
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self._say(f"warning: no viewer: {clean(why or type(e).__name__)}; going on "
                      "without it")
            return False
        self.viewer = viewer
        self._say(f"viewer at {viewer.url}")
        return True

    def stop(self, session: str | None = None) -> None:
        """Stop serving and close the port; with ``session``, say how to look again."""
        if self.viewer is None:
            return
        viewer, self.viewer = self.viewer, None
        viewer.stop()
        if session is not None:
            self._say(f"viewer stopped; to look again: {look_again(session)}")

    def stay(self, what: str = "the finished session") -> None:
        """Serve on until Ctrl-C, SIGTERM or SIGHUP (or until the server ends), then stop."""
        if not self.running or self.viewer is None:
            return
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread can be told to stop by a signal
        asked: list[int] = []

        def ask_stop(signum: int, _frame: FrameType | None) -> None:
            asked.append(signum)

        self._say(f"the viewer goes on showing {what} at {self.viewer.url}; Ctrl-C stops it")
        signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, ask_stop) for sig in signals}
        try:
            # A short sleep, not an Event: a signal handler must not take a lock the main
            # thread may be holding while it waits.
            while not asked and self.running:
                time.sleep(STAY_POLL_SECONDS)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop()


def inputs_of(paths: Sequence[str], symbols: SymbolOptions,
              frames: FramePolicy | None = None) -> ViewerInputs:
    """The inputs of a viewer on ``paths``, with ``heapscope serve``'s default frames when
    the command has no frame options."""
    return ViewerInputs(tuple(paths), symbols, frames or FramePolicy.from_env())
