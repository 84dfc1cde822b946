"""Formatting of byte and object counts for reports."""

from __future__ import annotations

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
