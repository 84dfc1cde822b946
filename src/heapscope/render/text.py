"""The ``top`` table as text, in jeprof's ``--text`` layout so reading habits carry over.

Columns: flat, flat%, sum%, cum, cum%, name. Bytes print as MiB with one decimal (jeprof's
"MB") unless ``show_bytes``; object counts print as integers (truncated, like jeprof).
"""

from __future__ import annotations

from typing import TextIO

from heapscope.analysis.aggregate import Key, Row, Table
from heapscope.model import ViaFrame
from heapscope.terminal import clean
from heapscope.units import percent

VIA_WIDTH = 60  # longest via name printed whole; longer ones lose inner template arguments


def short_name(name: str, width: int = VIA_WIDTH) -> str:
    """``name`` with template arguments below the outermost level elided when too long."""
    if len(name) <= width:
        return name
    out = []
    depth = 0
    for c in name:
        if c == "<":
            depth += 1
            if depth == 1:
                out.append("<")
            elif depth == 2:
                out.append("…")
            continue
        if c == ">":
            depth -= 1
            if depth == 0:
                out.append(">")
            continue
        if depth <= 1:
            out.append(c)
    return "".join(out)


def via_label(via: tuple[ViaFrame, ...]) -> str:
    """`` via X``: the outermost frame folded into a site (what the program's code called),
    or '' when nothing was folded."""
    if not via:
        return ""
    return f" via {clean(short_name(via[-1].function))}"


def row_name(key: Key, granularity: str) -> str:
    """How a row's key is written in the name column (control characters escaped)."""
    return clean(_row_name(key, granularity))


def _row_name(key: Key, granularity: str) -> str:
    if granularity == "lines":
        where = f"{key.file}:{key.line}" if key.file else "??:?"
        inline = " (inline)" if key.inlined else ""
        return f"{key.name}{inline} {where}"
    if granularity == "functions" and key.file:
        return key.name
    return key.name


def _value(v: float, unit: str, show_bytes: bool) -> str:
    if unit == "bytes" and not show_bytes:
        return f"{v / 1048576.0:.1f}"
    return str(int(v))


def _total(v: float, unit: str, show_bytes: bool) -> str:
    if unit == "bytes":
        return f"{int(v)} B" if show_bytes else f"{v / 1048576.0:.1f} MB"
    return f"{int(v)} objects"


def render_table(
    out: TextIO,
    table: Table,
    rows: tuple[Row, ...],
    *,
    granularity: str = "functions",
    show_bytes: bool = False,
    title: str = "",
    diff: bool = False,
) -> None:
    """Write the total line and the rows in jeprof's column layout."""
    unit = table.unit
    total = table.total
    head = "Total"
    if title:
        head += f" ({title})"
    sign = "+" if diff and total > 0 else ""
    out.write(f"{head}: {sign}{_total(total, unit, show_bytes)}\n")
    running = 0.0
    denom = abs(total) if total else sum(abs(r.flat) for r in rows)
    for r in rows:
        running += r.flat
        out.write(
            f"{_value(r.flat, unit, show_bytes):>8} {percent(r.flat, denom):>6} "
            f"{percent(running, denom):>6} {_value(r.cum, unit, show_bytes):>8} "
            f"{percent(r.cum, denom):>6} {row_name(r.key, granularity)}"
            f"{via_label(r.via) if r.flat else ''}\n"
        )
