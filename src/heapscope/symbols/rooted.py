"""A path as a process in another root sees it, resolved to a host path without leaving that
root: the file a container's ``/app/svc`` or ``/lib/x86_64-linux-gnu/libc.so.6`` names.

Walking ``ROOT/lib/…`` from the host would follow an absolute symlink planted in the
container (``/lib -> /``) against the host's own root, and read a host file in its place.
Here every component is looked at with ``lstat`` and each symlink is followed by hand: an
absolute target starts again at ``ROOT`` and ``..`` never climbs above it, as the kernel
resolves the path for the process itself. The result names no symlink, so opening it does
not leave the root unless the container swaps a folder for a link in between; the build-id
check of :mod:`heapscope.symbols.locate` then refuses the wrong file.
"""

from __future__ import annotations

import os
import stat

MAX_LINKS = 40  # as the kernel's limit: a loop of links is not a path


def resolve_in_root(root: str, path: str) -> str | None:
    """The host path of the file ``path`` names inside ``root``, or None when it does not
    exist there (or links too deep)."""
    todo = [p for p in path.split("/") if p not in ("", ".")]
    todo.reverse()
    done: list[str] = []
    links = 0
    while todo:
        part = todo.pop()
        if part == "..":
            if done:
                done.pop()
            continue
        here = os.path.join(root, *done, part)
        try:
            st = os.lstat(here)
        except (OSError, ValueError):
            return None
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > MAX_LINKS:
                return None
            try:
                target = os.readlink(here)
            except OSError:
                return None
            if target.startswith("/"):
                done = []
            todo.extend(reversed([p for p in target.split("/") if p not in ("", ".")]))
            continue
        if todo and not stat.S_ISDIR(st.st_mode):
            return None
        done.append(part)
    return os.path.join(root, *done)
