"""Text from dumps, perf maps and symbols made safe to print on a terminal.

A function name in a perf map, a DWARF string or a process title is untrusted: an escape
sequence in it (``\\x1b]0;…``, ``\\x1b[2J``) would act on the user's terminal when a report is
printed. :func:`clean` writes every control character (C0, DEL, C1, line and paragraph
separators, bidirectional marks and overrides) as a visible ``\\xNN``/``\\uNNNN`` escape. So it
does the noncharacters U+FFFE and U+FFFF, which XML forbids (DOT, SVG and HTML output show
text as this function does), and each undecodable byte kept as a lone surrogate, as ``\\xNN``
(:func:`heapscope.safetext.valid`; printing a lone surrogate would raise).
"""

from __future__ import annotations

import re

from heapscope.safetext import valid

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                      "\u2066-\u2069\ufffe\uffff]")


def _escape(m: re.Match[str]) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(text: str) -> str:
    """``text`` with control characters written as visible escapes."""
    return _CONTROL.sub(_escape, valid(text))
