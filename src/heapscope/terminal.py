"""Text from dumps, perf maps and symbols made safe to print on a terminal.

A function name in a perf map, a DWARF string or a process title is untrusted: an escape
sequence in it (``\\x1b]0;…``, ``\\x1b[2J``) would act on the user's terminal when a report is
printed. :func:`clean` writes every control character (C0, DEL, C1, line and paragraph
separators, bidirectional overrides) as a visible ``\\xNN``/``\\uNNNN`` escape.
"""

from __future__ import annotations

import re

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(text: str) -> str:
    """``text`` with control characters written as visible escapes."""
    return _CONTROL.sub(_escape, text)
