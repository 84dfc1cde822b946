"""The shell's ``list RE``: each matching function's source lines with the memory allocated
at them (flat: the line allocated itself; cum: the line was on the stack), as jeprof's and
pprof's ``list`` show.

The values come from the ``--lines`` table of the same view, so they add up with what
``top --lines`` prints; the source text is whatever file the caller could read for the
function (none: only the lines that hold memory are listed, without their text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from heapscope.analysis.aggregate import Row, Table
from heapscope.terminal import clean
from heapscope.units import human_bytes

CONTEXT = 2  # source lines shown around the listed ones


@dataclass
class Routine:
    """One function's lines that hold memory, in one source file."""

    name: str
    file: str
    rows: list[Row]
    flat: float = 0.0  # the function's own values (its row in the functions table)
    cum: float = 0.0


def routines(lines: Table, functions: Table, matches: Callable[[str], bool]
             ) -> list[Routine]:
    """The functions whose names ``matches``, with their rows of a ``--lines`` table and
    their totals from the ``--functions`` table of the same view; largest first."""
    found: dict[tuple[str, str], Routine] = {}
    for row in lines.rows:
        if row.key.file and matches(row.key.name):
            key = (row.key.name, row.key.file)
            found.setdefault(key, Routine(row.key.name, row.key.file, [])).rows.append(row)
    for row in functions.rows:
        for routine in found.values():
            if routine.name == row.key.name:
                routine.flat += row.flat
                routine.cum = max(routine.cum, row.cum)
    return sorted(found.values(), key=lambda r: -abs(r.cum))


def _value(v: float, unit: str, show_bytes: bool, zero: str = "0") -> str:
    if not v:
        return zero
    if unit != "bytes":
        return f"{int(v):,}"
    return f"{int(v):,}" if show_bytes else human_bytes(v)


def render_listing(out: TextIO, routine: Routine, source: Sequence[str] | None,
                   table: Table, *, show_bytes: bool = False, path: str = "") -> None:
    """Write one routine: a header with its totals, then its lines (with ``CONTEXT``
    lines around them when ``source`` holds the file's text, read from ``path``)."""
    by_line: dict[int, Row] = {}
    for r in routine.rows:
        got = by_line.get(r.key.line)
        # Inlined copies of one line are added up: the listing is per source line.
        by_line[r.key.line] = r if got is None else got._replace(
            flat=got.flat + r.flat, cum=max(got.cum, r.cum))
    out.write(f"ROUTINE {clean(routine.name)} in {clean(routine.file)}\n")
    out.write(f"  {_value(routine.flat, table.unit, show_bytes)} flat, "
              f"{_value(routine.cum, table.unit, show_bytes)} cum of "
              f"{_value(table.total, table.unit, show_bytes)} total ({table.sample_type})\n")
    shown = sorted(by_line)
    if source is None:
        out.write("  (source not found on this machine: only the lines holding memory)\n")
        wanted = shown
    else:
        if path and path != routine.file:
            out.write(f"  (source read from {clean(path)})\n")
        wanted = sorted({n for line in shown
                         for n in range(line - CONTEXT, line + CONTEXT + 1)
                         if 1 <= n <= len(source)} | set(shown))
    out.write(f"  {'flat':>10} {'cum':>10}\n")
    last = 0
    for n in wanted:
        if last and n > last + 1:
            out.write(f"  {'':>10} {'':>10}   ...\n")
        last = n
        row = by_line.get(n)
        f = _value(row.flat, table.unit, show_bytes, ".") if row else ""
        c = _value(row.cum, table.unit, show_bytes, ".") if row else ""
        text = source[n - 1] if source is not None and 0 < n <= len(source) else ""
        out.write(f"  {f:>10} {c:>10} {n:>6}: {clean(text.rstrip())}\n")
