"""Which dump files found in a folder are read, and why the others are not.

A dump folder that other users can write to (``/tmp``, a mode-1777 dumps folder) can hold
files they planted: fake dumps that would be analysed as the service's, or links to files
they cannot read themselves. Files named one by one on the command line are the user's
choice and always read; files found by walking a folder are read when

- the folder lets no one but its owner write (mode without group/other write): all of them;
- otherwise only regular files (never links) owned by root, by the caller, by the folder's
  owner, by the user a session's manifest names as its dumps' owner, or by a user given
  with ``--trust-owner``.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Iterable
from typing import NamedTuple


# A NamedTuple, not a dataclass: `heapscope top` must not import dataclasses (start-up time).
class Ignored(NamedTuple):
    """A file found in a folder and left out, with the reason."""

    path: str
    reason: str


def _who(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def uid_of(user: str) -> int | None:
    """A user name or number as a uid (None when there is no such user)."""
    try:
        return int(user) if user.isdigit() else pwd.getpwnam(user).pw_uid
    except (KeyError, ValueError):
        return None


class FolderTrust:
    """Decides, file by file, what a walk of one folder may read."""

    def __init__(self, trusted_uids: Iterable[int] = ()) -> None:
        self.trusted = {0, os.geteuid(), *trusted_uids}
        self._open: dict[str, tuple[bool, int]] = {}

    def _folder(self, folder: str) -> tuple[bool, int]:
        """(others can write into it, its owner's uid)."""
        if folder not in self._open:
            try:
                st = os.stat(folder)
                self._open[folder] = (bool(st.st_mode & 0o022), st.st_uid)
            except OSError:
                self._open[folder] = (True, -1)
        return self._open[folder]

    def reason(self, path: str) -> str | None:
        """None when ``path`` may be read; else why it is left out."""
        shared, owner = self._folder(os.path.dirname(path))
        if not shared:
            return None
        try:
            st = os.lstat(path)
        except OSError as e:
            return f"cannot be examined: {e.strerror or e}"
        if stat.S_ISLNK(st.st_mode):
            return "a symbolic link in a folder other users can write to"
        if not stat.S_ISREG(st.st_mode):
            return "not a regular file"
        if st.st_uid not in self.trusted and st.st_uid != owner:
            return (f"owned by {_who(st.st_uid)} in a folder other users can write to "
                    "(read it with --trust-owner USER if that user wrote it)")
        return None
