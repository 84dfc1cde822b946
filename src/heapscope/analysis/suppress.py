"""Suppressions in LeakSanitizer's format, plus heapscope's built-in list of runtime noise.

A file holds lines ``leak:PATTERN`` (``#`` starts a comment; other kinds such as ``race:`` are
ignored). As in LSan, a pattern matches when it occurs in the function name, the source file
or the module of any frame of the stack; ``*`` matches anything, a leading ``^`` or trailing
``$`` anchors it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from heapscope.errors import InputError
from heapscope.files import open_regular

# Allocations runtimes make once as they start and keep for the life of the process.
BUILTIN = (
    "_IO_file_doallocate",  # stdio buffers
    "__libc_setlocale",
    "_nl_find_locale",
    "_dl_allocate_tls",  # thread-local storage of new threads
    "allocate_dtv",
    "__new_exitfn",  # atexit() registrations
    "__cxa_thread_atexit_impl",
)


@dataclass(frozen=True)
class Suppression:
    """One ``leak:`` pattern and where it came from."""

    pattern: str
    origin: str
    regex: re.Pattern[str]

    def matches(self, texts: Iterable[str]) -> bool:
        """True when any of the stack's function/file/module texts matches."""
        return any(self.regex.search(t) for t in texts if t)


def compile_pattern(pattern: str, origin: str) -> Suppression:
    """Turn an LSan pattern into a matcher."""
    anchored_start = pattern.startswith("^")
    anchored_end = pattern.endswith("$")
    core = pattern[1 if anchored_start else 0: -1 if anchored_end else None]
    body = ".*".join(re.escape(part) for part in core.split("*"))
    rx = ("^" if anchored_start else "") + body + ("$" if anchored_end else "")
    return Suppression(pattern, origin, re.compile(rx))


_NOT_BLANK = re.compile(r"[^\n]*\S[^\n]*")
MAX_SUPPRESSIONS = 16 << 20  # bytes of a suppressions file read (they are a few lines)


def read_file(path: str) -> list[Suppression]:
    """Read an LSan-style suppressions file."""
    try:
        with open_regular(path) as f:
            text = f.read(MAX_SUPPRESSIONS).decode("utf-8")
    except FileNotFoundError:
        raise InputError(path, "no such suppressions file") from None
    except OSError as e:
        raise InputError(path, f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise InputError(path, "not a text file") from None
    out = []
    n, at = 1, 0
    # Only the lines that hold something, found at C speed: a file of blank lines costs no
    # list of them.
    for m in _NOT_BLANK.finditer(text):
        n += text.count("\n", at, m.start())
        at = m.start()
        raw = m.group()
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, sep, pattern = line.partition(":")
        if not sep or not pattern.strip():
            raise InputError(path, f"line {n}: expected 'leak:PATTERN', got {raw.strip()!r}")
        if kind.strip() == "leak":
            out.append(compile_pattern(pattern.strip(), f"{path}:{n}"))
    return out


def builtin() -> list[Suppression]:
    """heapscope's own list, for allocations every runtime makes once."""
    return [compile_pattern(p, "built-in") for p in BUILTIN]
