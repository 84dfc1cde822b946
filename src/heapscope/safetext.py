"""Text from dumps, binaries and paths made valid Unicode, and JSON written from it.

Names reach heapscope as bytes: the paths of a memory map, ELF and DWARF strings, a process's
argv. Bytes that are not UTF-8 are kept as lone surrogates (Python's ``surrogateescape``,
U+DC80-U+DCFF for bytes 0x80-0xFF), which no UTF-8 file can hold: encoding one raises, a
protobuf ``string`` must be UTF-8, and a ``\\udcff`` escape in JSON is refused or replaced by
parsers other than Python's (RFC 8259, section 8.2). :func:`valid` writes each such byte as
the four characters ``\\xNN`` (the spelling of Python's ``backslashreplace``, so the byte can
still be told) and keeps every other character exactly; :func:`json_text` writes JSON for
other programs by that rule.

Documents heapscope writes for itself and reads back (a session's manifest, caches) keep
their lone surrogates as Python's ``\\udcNN`` escapes instead: a path that is not UTF-8 must
still open the same file.
"""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
# In ASCII JSON every backslash starts an escape. Scanned from the left, an escaped backslash
# is passed over whole (a name's own backslash before "udcff" is left alone), a surrogate pair
# (a character beyond U+FFFF) is kept whole, and only a lone surrogate's escape is captured.
_ESCAPE = re.compile(r"\\\\|\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}|\\u(d[89a-f][0-9a-f]{2})")


def _byte(m: re.Match[str]) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # surrogateescape's stand-in for the byte c - 0xDC00
        return f"\\x{c - 0xDC00:02x}"
    return f"\\u{c:04x}"


def valid(text: str) -> str:
    """``text`` with each lone surrogate written as a visible escape: valid Unicode."""
    if text.isascii():
        return text
    return _SURROGATE.sub(_byte, text)


def _json_escape(m: re.Match[str]) -> str:
    lone = m.group(1)
    if lone is None:
        return m.group()
    # The visible escape as JSON: its backslash doubled.
    return _SURROGATE.sub(_byte, chr(int(lone, 16))).replace("\\", "\\\\")


def json_text(data: Any, *, indent: int | None = None,
              separators: tuple[str, str] | None = None, allow_nan: bool = True) -> str:
    """``data`` as JSON text for other programs: ASCII (so valid UTF-8, every control and
    non-ASCII character a ``\\uXXXX`` escape), each string exactly as it is except that a
    lone surrogate becomes the text :func:`valid` writes for it."""
    text = json.dumps(data, ensure_ascii=True, indent=indent, separators=separators,
                      allow_nan=allow_nan)
    if "\\ud" not in text:  # nothing to look at (the usual case: no scan at all)
        return text
    return _ESCAPE.sub(_json_escape, text)


def json_ready(data: Any) -> Any:
    """``data`` as :func:`json_text` writes it, read back: for a writer that takes data (lists
    for tuples, string keys, every string valid Unicode)."""
    return json.loads(json_text(data))
