"""Opening files a dump or a user names: regular files only, never blocking on a FIFO.

A memory map, a dump folder or a command line can name a FIFO, a device or a socket;
opening one of those with a plain ``open()`` can block forever (a FIFO without a writer) or
read without end (/dev/zero). :func:`open_regular` opens without blocking, checks that the
descriptor is a regular file, and only then hands back a normal file object.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO, TextIO


class NotRegularFile(OSError):
    """The path names something other than a regular file."""


def open_regular(path: str) -> BinaryIO:
    """``open(path, "rb")`` for a regular file; :class:`NotRegularFile` for anything else
    (a FIFO, device, socket or folder), raised without waiting on it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory", path)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile("not a regular file")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _new_fd(path: str, mode: int) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                   | getattr(os, "O_CLOEXEC", 0), mode)


def create_new(path: str, mode: int = 0o644) -> BinaryIO:
    """Open ``path`` for writing only if nothing is there yet, never following a symlink:
    a file or link another user planted in a shared folder is never written through."""
    return os.fdopen(_new_fd(path, mode), "wb")


def create_new_text(path: str, mode: int = 0o644) -> TextIO:
    """:func:`create_new` for text (UTF-8)."""
    return os.fdopen(_new_fd(path, mode), "w", encoding="utf-8")
