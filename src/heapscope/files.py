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
from typing import BinaryIO


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
