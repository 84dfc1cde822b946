"""Dumps of processes that cannot write the session's dumps/: one private folder per process
in another root, however many threads ask for it at once, and nothing of it left behind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

import pytest

from heapscope.capture import container
from heapscope.capture.userdumps import UserDumps


class FakeDrop:
    """Stands for container.Drop: counts the folders made and closed."""

    made: ClassVar[list[FakeDrop]] = []
    during_make: ClassVar[list[Callable[[], None]]] = []

    def __init__(self, pid: int, owner: object) -> None:
        self.closed = False
        self.n = len(FakeDrop.made)
        FakeDrop.made.append(self)
        # Another thread asks for the same process while this folder is being made.
        for ask in FakeDrop.during_make:
            FakeDrop.during_make = []
            ask()

    def path(self, name: str) -> str:
        return f"/tmp/.heapscope-{self.n}/{name}"

    def close(self) -> None:
        self.closed = True


def test_two_threads_asking_at_once_get_one_folder(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    box = container.Confinement(4242, (4242, 1), "/proc/4242/root", False, True, True, "")
    monkeypatch.setattr(container, "confinement", lambda pid: box)
    monkeypatch.setattr(container, "Drop", FakeDrop)
    FakeDrop.made = []
    dumps = UserDumps(str(tmp_path), 0)
    inner: list[str | None] = []
    FakeDrop.during_make = [lambda: inner.append(dumps.prefix_for(4242))]
    outer = dumps.prefix_for(4242)
    # Both callers are told the same folder; the one made second is removed at once.
    assert inner == [outer] and outer is not None
    assert len(FakeDrop.made) == 2
    kept = [d for d in FakeDrop.made if not d.closed]
    assert len(kept) == 1 and outer == kept[0].path("jeprof")
    assert dumps.prefix_for(4242) == outer  # asked again later: the same folder
    dumps.close()
    assert all(d.closed for d in FakeDrop.made)
