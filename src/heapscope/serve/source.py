"""The source view: a file a profile names, read from this machine, with values per line.

Only a file named by the profile's own locations is ever read (the debug info's path, as
the symbolizer gave it): the request names one of those, and what is opened is the
profile's string, looked up in the profile, or that path under a folder the user gave on
the command line (``--source-path DIR``, ``--sysroot DIR``). Only regular files are read
(:func:`heapscope.files.open_regular`: no FIFO, device or folder), and at most
:data:`MAX_SOURCE` bytes of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from heapscope.analysis.aggregate import Table
from heapscope.files import open_regular

MAX_SOURCE = 4 << 20  # bytes of a source file shown; a bigger one is cut


def profile_files(keys: Iterable[str]) -> set[str]:
    """The distinct non-empty file names among ``keys``."""
    return {f for f in keys if f}


def candidates(file: str, source_paths: Sequence[str], sysroot: str | None) -> list[str]:
    """Where ``file`` (a path from debug info) may be on this machine, most likely first:
    the path itself, under the sysroot, then under each source folder the path with fewer
    and fewer of its leading folders (a tree built elsewhere, copied here)."""
    out: list[str] = []
    if os.path.isabs(file):
        out.append(file)
        if sysroot:
            out.append(os.path.join(sysroot, file.lstrip("/")))
    parts = [p for p in file.split("/") if p and p != "."]
    for folder in source_paths:
        for k in range(len(parts)):
            out.append(os.path.join(folder, *parts[k:]))
    if not os.path.isabs(file) and not source_paths:
        out.append(file)  # relative to where the server runs, as a compiler would have
    return list(dict.fromkeys(out))


def read_source(file: str, source_paths: Sequence[str], sysroot: str | None
                ) -> tuple[str, list[str], bool] | None:
    """(the path read, its lines, whether it was cut) for the first candidate that is a
    regular file; None when none is."""
    for path in candidates(file, source_paths, sysroot):
        try:
            with open_regular(path) as f:
                raw = f.read(MAX_SOURCE + 1)
        except (OSError, ValueError):
            continue
        cut = len(raw) > MAX_SOURCE
        text = raw[:MAX_SOURCE].decode("utf-8", errors="replace")
        return path, text.splitlines(), cut
    return None


def line_values(file: str, own: Table, own_objects: Table, through: Table,
                through_objects: Table) -> dict[int, dict[str, float]]:
    """Per line of ``file``: bytes and objects allocated with the line as the site (``flat``
    of ``top --lines``) and through it (``cum``), from tables by line."""
    out: dict[int, dict[str, float]] = {}

    def add(table: Table, field: str, cum: bool) -> None:
        for r in table.rows:
            if r.key.file != file or r.key.line <= 0:
                continue
            v = r.cum if cum else r.flat
            if not v:
                continue
            slot = out.setdefault(r.key.line, {"flat": 0.0, "flat_objects": 0.0, "cum": 0.0,
                                               "cum_objects": 0.0})
            slot[field] += v

    add(own, "flat", False)
    add(own_objects, "flat_objects", False)
    add(through, "cum", True)
    add(through_objects, "cum_objects", True)
    return out


def source_doc(file: str, found: tuple[str, list[str], bool] | None,
               values: dict[int, dict[str, float]], looked: list[str]) -> dict[str, Any]:
    """The JSON of ``/api/dump/{id}/source``."""
    lines = {str(k): v for k, v in sorted(values.items())}
    if found is None:
        where = ", ".join(looked[:4]) + (f" and {len(looked) - 4} more" if len(looked) > 4
                                          else "")
        return {"file": file, "found": False, "values": lines,
                "message": f"The source of {file} is not on this machine (looked at "
                           f"{where or 'nothing'}). Start heapscope serve with "
                           "--source-path DIR to say where the sources are."}
    path, text, cut = found
    return {"file": file, "found": True, "path": path, "lines": text, "cut": cut,
            "values": lines, "message": "the file is longer than shown" if cut else ""}
