"""Opening files a dump or a user names: regular files only, never blocking on a FIFO.

A memory map, a dump folder or a command line can name a FIFO, a device or a socket;
opening one of those with a plain ``open()`` can block forever (a FIFO without a writer) or
read without end (/dev/zero). :func:`open_regular` opens without blocking, checks that the
descriptor is a regular file, and only then hands back a normal file object.

Writing goes the other way round: :func:`create_new` never follows a link, and
:func:`replace_atomically` / :func:`create_atomically` publish a finished file under an
unpredictable temporary name, so a symlink another user planted at a predictable name
(``out.html.tmp1234``) is never written through.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from typing import BinaryIO, TextIO

from heapscope.errors import InputError


class NotRegularFile(OSError):
    """The path names something other than a regular file."""


def open_regular(path: str) -> BinaryIO:
    """``open(path, "rb")`` for a regular file; :class:`NotRegularFile` for anything else
    (a FIFO, device, socket or folder), raised without waiting on it."""
    if "\0" in path:
        # No file has such a name (a damaged memory map gives one): an OSError like any
        # other missing file, not the ValueError os.open() raises.
        raise FileNotFoundError(errno.ENOENT, "no such file (a NUL byte in the name)", path)
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


IGNORED: list[str] = []  # "path: why" of cache files refused by open_private (for a note)


def open_private(path: str) -> BinaryIO | None:
    """A cache file only this user could have written, opened; None when it is missing or
    when it is not: a regular file owned by the effective user that group and others cannot
    write, in a folder owned by this user (or root) that group and others cannot write. A
    file refused for its owner or mode is listed in :data:`IGNORED`. Nothing read from a
    cache is ever trusted otherwise (marshal data can crash the reader; a planted symbol
    entry would name functions wrongly)."""
    me = os.geteuid()
    try:
        folder = os.stat(os.path.dirname(path) or ".")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        why = ""
        if not stat.S_ISREG(st.st_mode):
            why = "not a regular file"
        elif st.st_uid != me:
            why = f"owned by uid {st.st_uid}, not by uid {me}"
        elif st.st_mode & 0o022:
            why = "others may write it"
        elif folder.st_uid not in (me, 0) or folder.st_mode & 0o022:
            why = "its folder is another user's, or others may write it"
        if why:
            os.close(fd)
            IGNORED.append(f"{path}: {why}")
            return None
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        with contextlib.suppress(OSError):
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


def current_umask() -> int:
    """The process's file-creation mask (``umask``)."""
    # /proc reports it without changing it; os.umask() can only read the mask by setting
    # another, and a file another thread creates meanwhile would get that one.
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8) & 0o777
    except (OSError, ValueError, IndexError):
        pass
    # No /proc (or a kernel before 4.7): set the strictest mask for that instant, so a file
    # created meanwhile is at worst too private, never too open.
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _temp_beside(path: str, data: bytes) -> str:
    """A new file in ``path``'s folder holding ``data``, mode ``0o666 & ~umask``; its name."""
    folder = os.path.dirname(path) or "."
    # mkstemp: O_EXCL and a random name, so nothing planted in the folder is written through.
    # The base name is cut so the temporary name stays within NAME_MAX (255).
    prefix = "." + os.path.basename(path)[:200] + "."
    import tempfile  # only when writing: start-up time

    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            # mkstemp makes 0600; the result should look like any file this process creates.
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def replace_atomically(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file and a rename: readers see the old
    file or the whole new one, never a part. Whatever is at ``path`` (a file, a symlink) is
    replaced, never written through."""
    tmp = _temp_beside(path, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def create_atomically(path: str, data: bytes) -> None:
    """Like :func:`replace_atomically`, but only if nothing is at ``path``:
    :class:`FileExistsError` otherwise (also when something appears there meanwhile)."""
    tmp = _temp_beside(path, data)
    try:
        try:
            os.link(tmp, path, follow_symlinks=False)  # atomic; fails if path exists
        except FileExistsError:
            raise
        except OSError:
            # A file system without hard links: the check and the rename are two steps there.
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, "File exists", path) from None
            os.rename(tmp, path)
            return
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.unlink(tmp)


def keep_newest(folder: str, suffix: str, keep: int) -> None:
    """Delete all but the ``keep`` most recently written files ending in ``suffix`` in
    ``folder`` (a cache's entries); files that vanish meanwhile are skipped."""
    entries = []
    with os.scandir(folder) as it:
        for e in it:
            if e.name.endswith(suffix):
                with contextlib.suppress(OSError):
                    entries.append((e.stat().st_mtime_ns, e.path))
    entries.sort(reverse=True)
    for _, old in entries[keep:]:
        with contextlib.suppress(OSError):
            os.unlink(old)


#: What a cached result remembers of a file it was computed from: size, mtime and inode,
#: or None when nothing (or no regular file) was there.
Stamp = tuple[int, int, int] | None


def stamp(path: str) -> Stamp:
    """The :data:`Stamp` of ``path`` now (symlinks followed, as reading it would)."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def check_output(path: str, force: bool) -> None:
    """Fail before any work when the file a command was told to write (``-o``) cannot or
    must not be written: a folder, a missing or unwritable folder, or a file that exists and
    ``force`` (``--force``) is not given. ``-`` (standard output) always passes."""
    if path == "-":
        return
    if os.path.isdir(path):
        raise InputError(path, "is a folder: name the file to write")
    if os.path.lexists(path) and not force:
        raise InputError(path, "exists: add --force to replace it")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(path, f"cannot write: no such folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(path, f"cannot write: permission denied in {folder}")


def write_output(path: str, data: bytes, force: bool) -> None:
    """Write a command's output file: a new file, or with ``force`` a replacement; either
    appears whole (written beside it and renamed). A file that appeared since
    :func:`check_output` is not replaced without ``force``."""
    try:
        if force:
            replace_atomically(path, data)
        else:
            create_atomically(path, data)
    except FileExistsError:
        raise InputError(path, "exists: add --force to replace it") from None
    except OSError as e:
        raise InputError(path, f"cannot write: {e.strerror or e}") from None
