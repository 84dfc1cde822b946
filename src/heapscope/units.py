"""Numbers and names in reports: sizes in IEC units (KiB, MiB, GiB), counts with their noun,
texts shortened with a visible ellipsis; parsing sizes users type."""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from heapscope.errors import UsageError

_MIB = 1024.0 * 1024.0


def mib(value: float) -> str:
    """Format bytes as MiB with one decimal, the number jeprof's default text output prints
    (jeprof divides by 1048576 too, but calls it "MB")."""
    return f"{value / _MIB:.1f}"


def signed(text: str, value: float) -> str:
    """``text`` (a formatted ``value``) with a ``+`` in front when ``value`` is above zero; a
    negative value's text already starts with ``-``, and zero stays unsigned."""
    return "+" + text if value > 0 else text


def human_bytes(value: float) -> str:
    """Format bytes with a binary unit suffix (B, KiB, MiB, GiB, TiB)."""
    sign = "-" if value < 0 else ""
    v = abs(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if v < 1024.0:
            return f"{sign}{v:.0f} {unit}" if unit == "B" else f"{sign}{v:.1f} {unit}"
        v /= 1024.0
    return f"{sign}{v:.1f} TiB"


def count(value: float) -> str:
    """Format an object count as an integer, truncated like jeprof (%d of a float)."""
    return str(int(value))


def plural(n: float, noun: str, many: str = "", *, grouped: bool = True) -> str:
    """A count with its noun in agreement: ``1 object``, ``2 objects``, ``1,234 objects``.

    ``many`` is the plural when adding ``s`` (``es`` after s, x, ch, sh; ``ies`` for a
    consonant's ``y``) is wrong; ``grouped`` writes thousands separators. A float count is
    truncated first, as :func:`count` does."""
    whole = int(n)
    number = f"{whole:,}" if grouped else str(whole)
    if abs(whole) == 1:
        return f"{number} {noun}"
    if not many:
        if noun.endswith(("s", "x", "ch", "sh")):
            many = noun + "es"
        elif noun.endswith("y") and noun[-2:-1] not in ("a", "e", "i", "o", "u", ""):
            many = noun[:-1] + "ies"
        else:
            many = noun + "s"
    return f"{number} {many}"


ELLIPSIS = "…"


def shorten(text: str, width: int, *, keep: str = "start") -> str:
    """``text`` whole when it fits in ``width`` characters, else cut to ``width`` with ``…``
    marking the cut. ``keep`` says which part matters: ``start`` (cut the end), ``end`` (cut
    the start: a path's file name) or ``middle`` (cut the middle: a long symbol keeps its
    namespace and its last name)."""
    if len(text) <= width:
        return text
    room = max(width - 1, 0)
    if keep == "end":
        return ELLIPSIS + text[len(text) - room:] if room else ELLIPSIS
    if keep == "middle":
        head = room // 2
        tail = room - head
        return text[:head] + ELLIPSIS + (text[len(text) - tail:] if tail else "")
    return text[:room] + ELLIPSIS


def shorten_command(words: Sequence[str], width: int) -> str:
    """A command line quoted as a shell reads it, at most ``width`` characters when it can
    be: the program name always whole, then as many whole arguments as fit, then ``…`` for
    the ones left out (never a cut argument that reads like a different value)."""
    if not words:
        return ""
    parts = [shlex.quote(w) for w in words]
    out = parts[0]
    for k, part in enumerate(parts[1:], 1):
        last = k == len(parts) - 1
        # Room for this argument, and for " …" unless it is the last one.
        need = len(out) + 1 + len(part) + (0 if last else 2)
        if need > width:
            return out + " " + ELLIPSIS
        out += " " + part
    return out


def percent(part: float, total: float) -> str:
    """Format part/total as a percentage with one decimal; 0 total gives 0.0%."""
    if total == 0:
        return "0.0%"
    return f"{100.0 * part / total:.1f}%"


def short_number(value: float, *, hexadecimal: bool = False) -> str:
    """A number for a one-line message: whole when it has at most 80 bits; a damaged dump's
    wider one (thousands of digits, past what ``str()`` even converts) as its first hex
    digits and its width."""
    if isinstance(value, int) and value.bit_length() > 80:
        return f"{value:#x}"[:22] + f"… ({value.bit_length()} bits)"
    if hexadecimal and isinstance(value, int):
        return f"{value:#x}"
    return str(value)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str, option: str = "size") -> int:
    """Bytes from ``4096``, ``512k``, ``512KiB``, ``1M``, ``2GB`` (binary units)."""
    m = _SIZE.match(text)
    if m is None:
        raise UsageError(f"{option} {text!r}: not a size (examples: 4096, 512k, 1MiB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1:
        raise UsageError(f"{option} {text!r}: must be at least 1 byte")
    return int(value)
