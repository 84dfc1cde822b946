"""Byte and object counts: formatting for reports, parsing sizes users type."""

from __future__ import annotations

import re

from heapscope.errors import UsageError

_MIB = 1024.0 * 1024.0


def mib(value: float) -> str:
    """Format bytes as MiB with one decimal, like jeprof's default text output."""
    return f"{value / _MIB:.1f}"


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
