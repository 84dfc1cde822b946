"""The inputs a viewer was started on, and every dump in them, each under a number.

A request names a dump or an input by its number only: the paths come from the command line
and from folders the server lists itself, never from a request. Folders are listed again
(at most once a second, when asked) so that dumps a running session writes show up; a dump
keeps its number for the life of the server, also when the session's self-contained copy
(``symbolized/…json.gz``) replaces the raw dump it was made from. A dump deleted since (the
agent keeps only a window of dumps per target) leaves its input's list.

A session directly inside a folder named on the command line (the state folder of
``heapscope agent --state`` holds one attach session per target; a folder of ``heapscope
run`` sessions) is an input of its own, with its manifest, not a heap of dumps in the
folder's; one that appears there later (a new target) is added when the folder is listed
again, and a folder holding nothing but sessions is not listed itself. Only the folder's
own subfolders count, never a link to elsewhere.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from heapscope.errors import InputError
from heapscope.formats.load import parse_dump_name
from heapscope.formats.symbolized import SUFFIX
from heapscope.formats.trust import Ignored
from heapscope.prepare import expand_inputs, is_session
from heapscope.units import plural

SESSION = "session"
FOLDER = "folder"
FILE = "file"
RESCAN_SECONDS = 1.0


class Dump:
    """One dump of an input: its number, where it is, and what its name says."""

    __slots__ = ("id", "input", "key", "kind", "path", "pid", "seq", "size", "time")

    def __init__(self, id: int, input: int, key: str, path: str) -> None:
        self.id = id
        self.input = input
        self.key = key  # the raw dump's name: a symbolized copy is the same dump
        self.path = path
        name = parse_dump_name(key)
        self.pid = name.pid if name else None
        self.seq = name.seq if name else None
        # "f" final, "i" interval, "m" manual, "u" high-water mark; with its index
        self.kind = (name.kind + (str(name.index) if name.index >= 0 else "")) if name else ""
        self.size = 0
        self.time: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The JSON form the page lists."""
        return {"id": self.id, "input": self.input, "name": self.key, "path": self.path,
                "pid": self.pid, "seq": self.seq, "kind": self.kind, "size": self.size,
                "time": self.time, "symbolized": self.path.endswith(SUFFIX)}


class Input:
    """A path named on the command line (a session, a folder of dumps or one dump file), or
    a session found directly inside a folder named there."""

    __slots__ = ("dumps", "id", "ignored", "kind", "parent", "path", "problem", "sessions")

    def __init__(self, id: int, path: str, parent: int | None = None) -> None:
        self.id = id
        self.path = path
        self.parent = parent  # the folder of sessions it was found in
        self.sessions: set[str] = set()  # a folder's subfolders that are inputs now
        if os.path.isdir(path):
            self.kind = SESSION if is_session(path) else FOLDER
        else:
            self.kind = FILE
        self.dumps: list[int] = []
        self.ignored: list[Ignored] = []
        self.problem = ""  # why no dump could be listed (an empty folder so far)

    @property
    def title(self) -> str:
        """The folder's or file's name."""
        return os.path.basename(os.path.abspath(self.path)) or self.path

    @property
    def shown(self) -> bool:
        """False for a folder that holds nothing but sessions: they are shown instead."""
        return bool(self.dumps) or not self.sessions


def _sessions_in(folder: str) -> list[str]:
    """The sessions directly inside ``folder`` (not through links), by name."""
    try:
        with os.scandir(folder) as entries:
            return sorted(e.path for e in entries
                          if e.is_dir(follow_symlinks=False) and is_session(e.path))
    except OSError:
        return []


def _key(path: str) -> str:
    name = os.path.basename(path)
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name


def _dump_time(path: str, key: str) -> tuple[int, float | None]:
    """Size and modification time of a dump; for a session's copy, the raw dump's time."""
    size, mtime = 0, None
    try:
        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime
    except OSError:
        pass
    if path.endswith(SUFFIX):
        raw = os.path.join(os.path.dirname(os.path.dirname(path)), "dumps", key)
        with contextlib.suppress(OSError):
            mtime = os.stat(raw).st_mtime
    return size, mtime


class Catalog:
    """Every input and dump, numbered; :meth:`refresh` lists the folders again."""

    def __init__(self, paths: Sequence[str], trust_uids: Sequence[int] = ()) -> None:
        self.lock = threading.Lock()
        self.trust_uids = list(trust_uids)
        self.inputs = [Input(i, p) for i, p in enumerate(paths)]
        self.dumps: list[Dump] = []
        self._by_key: dict[tuple[int, str], int] = {}
        self.version = 0
        self._listed = 0.0
        self.refresh(force=True)

    def refresh(self, *, force: bool = False) -> int:
        """List the inputs' folders again (at most once a second unless ``force``); returns
        the version, which grows whenever a dump appeared or changed."""
        with self.lock:
            now = time.monotonic()
            if not force and now - self._listed < RESCAN_SECONDS:
                return self.version
            self._listed = now
            changed = False
            for inp in list(self.inputs):
                if inp.kind == FOLDER and inp.parent is None:
                    changed |= self._adopt_sessions(inp)
                changed |= self._list(inp)
            if changed:
                self.version += 1
            return self.version

    def _list(self, inp: Input) -> bool:
        ignored: list[Ignored] = []
        if inp.kind == FILE:
            found = [inp.path]
        else:
            try:
                found = expand_inputs([inp.path], ignored=ignored, trust_uids=self.trust_uids)
                inp.problem = ""
            except InputError as e:
                found = []  # a session whose first dump is still to come
                inp.problem = str(e)
        if inp.sessions:  # a session's dumps belong to the session's own input
            inside = tuple(os.path.join(p, "") for p in inp.sessions)
            found = [p for p in found if not p.startswith(inside)]
            ignored = [i for i in ignored if not i.path.startswith(inside)]
            if inp.problem or not found:
                inp.problem = f"{plural(len(inp.sessions), 'session')}, no other dumps"
        inp.ignored = ignored
        changed = False
        listed: list[int] = []
        for path in found:
            key = _key(path)
            known = self._by_key.get((inp.id, key))
            if known is None:
                dump = Dump(len(self.dumps), inp.id, key, path)
                self.dumps.append(dump)
                self._by_key[(inp.id, key)] = dump.id
                changed = True
            else:
                dump = self.dumps[known]
                if dump.path != path:
                    dump.path = path
                    changed = True
            listed.append(dump.id)
            size, mtime = _dump_time(path, key)
            if (size, mtime) != (dump.size, dump.time):
                dump.size, dump.time = size, mtime
                changed = True
        if listed != inp.dumps:  # a dump was deleted (or arrived): the list as found
            inp.dumps = listed
            changed = True
        return changed

    def _adopt_sessions(self, folder: Input) -> bool:
        """Add the sessions directly inside a folder as inputs of their own."""
        added = False
        for path in _sessions_in(folder.path):
            if path not in folder.sessions:
                folder.sessions.add(path)
                real = os.path.realpath(path)
                if any(os.path.realpath(i.path) == real for i in self.inputs):
                    continue  # named on the command line as well
                inp = Input(len(self.inputs), path, parent=folder.id)
                self.inputs.append(inp)
                self._list(inp)
                added = True
        return added

    def dump(self, dump_id: int) -> Dump:
        """The dump numbered ``dump_id``; KeyError when there is none."""
        with self.lock:
            if not 0 <= dump_id < len(self.dumps):
                raise KeyError(dump_id)
            return self.dumps[dump_id]

    def input(self, input_id: int) -> Input:
        """The input numbered ``input_id``; KeyError when there is none."""
        if not 0 <= input_id < len(self.inputs):
            raise KeyError(input_id)
        return self.inputs[input_id]

    def input_dumps(self, input_id: int) -> list[Dump]:
        """The dumps of an input, in the order they were found (jemalloc's order), but those
        deleted since the folder was last listed (the agent's window moves every round, and
        a leak report on a deleted dump would fail)."""
        with self.lock:
            dumps = [self.dumps[i] for i in self.inputs[input_id].dumps]
        return [d for d in dumps if os.path.exists(d.path)]

    def as_dict(self) -> dict[str, Any]:
        """Every input with its dumps, as ``/api/inputs`` returns them."""
        with self.lock:
            return {"version": self.version, "inputs": [
                {"id": inp.id, "kind": inp.kind, "path": inp.path, "title": inp.title,
                 "problem": inp.problem, "parent": inp.parent,
                 "dumps": [self.dumps[i].as_dict() for i in inp.dumps]}
                for inp in self.inputs if inp.shown]}
