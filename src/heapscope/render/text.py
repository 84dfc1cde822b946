"""The ``top`` table as text, in jeprof's ``--text`` layout so reading habits carry over, and
the ``diff`` table (signed changes, shares of growth or of shrinkage).

Columns: flat, flat%, sum%, cum, cum%, name. Bytes print as MiB with one decimal (the numbers
jeprof prints, which it labels "MB"; heapscope writes the unit it means, MiB) unless
``show_bytes``; object counts print as integers (truncated, like jeprof).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TextIO

from heapscope.analysis.aggregate import Key, Row, Table
from heapscope.analysis.top import Diff
from heapscope.inputs import dump_name
from heapscope.model import Profile, ViaFrame
from heapscope.terminal import clean
from heapscope.units import human_bytes, percent, plural, signed

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
        return f"{int(v)} B" if show_bytes else f"{v / 1048576.0:.1f} MiB"
    # No thousands separators: the line reads as jeprof's ``Total: N objects``.
    return plural(v, "object", grouped=False)


def render_table(
    out: TextIO,
    table: Table,
    rows: tuple[Row, ...],
    *,
    granularity: str = "functions",
    show_bytes: bool = False,
    title: str = "",
) -> None:
    """Write the total line and the rows in jeprof's column layout (a diff is written by
    :func:`render_diff`)."""
    unit = table.unit
    total = table.total
    head = "Total"
    if title:
        head += f" ({title})"
    out.write(f"{head}: {_total(total, unit, show_bytes)}\n")
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


def _change(v: float, unit: str, show_bytes: bool) -> str:
    """A signed column value: ``+5.4``, ``-0.1``, and ``0.0`` (no sign, never ``-0.0``) for
    a change too small to show at this precision."""
    text = _value(v, unit, show_bytes)
    if not text.strip("-0."):
        return text.lstrip("-")
    return signed(text, v)


def _amount(v: float, unit: str, show_bytes: bool) -> str:
    """A total in the header: a human size (or exact bytes), or an object count."""
    if unit != "bytes":
        return plural(v, "object")
    return f"{int(v):,} B" if show_bytes else human_bytes(v)


def side_label(profiles: Sequence[Profile]) -> str:
    """How one side of a diff is named: its dump's file name and pid, or, for several dumps,
    how many with the first names and their pids."""
    if not profiles:
        return "(no dump)"
    # A session's symbolized copy is named by the dump jemalloc wrote.
    names = [dump_name(p.source) or p.source for p in profiles]
    if len(set(names)) < len(names):
        names = [p.source for p in profiles]  # equal file names: the paths tell them apart
    shown = ", ".join(names[:2])
    if len(names) > 2:
        shown = f"{plural(len(names), 'dump')}: {shown}, … {len(names) - 2} more"
    pids = sorted({p.pid for p in profiles if p.pid is not None})
    if len(pids) == 1:
        shown += f" (pid {pids[0]})"
    elif pids:
        listed = ", ".join(str(x) for x in pids[:3]) + (", …" if len(pids) > 3 else "")
        shown += f" (pids {listed})"
    return clean(shown)


def render_diff(
    out: TextIO,
    diff: Diff,
    base: Sequence[Profile],
    new: Sequence[Profile],
    *,
    granularity: str = "functions",
    show_bytes: bool = False,
    title: str = "",
) -> None:
    """Write a diff: both sides with their totals, the change, then one row per site with its
    signed flat change, its share, the running sum of shares, and its signed cum change.

    A growing row's share is of all growth (the positive flat changes), a shrinking row's of
    all shrinkage, so no share passes 100% and the growing rows' shares add up to 100%; the
    running sum restarts where the shrinking rows begin. Cum changes get no share: a caller's
    change can hold one callee's growth and another's shrinkage, a sum no total bounds."""
    table = diff.table
    unit = table.unit
    labels = [side_label(base), side_label(new)]
    width = max(len(x) for x in labels)
    amounts = [_amount(diff.base_total, unit, show_bytes),
               _amount(diff.new_total, unit, show_bytes)]
    right = max(len(x) for x in amounts)
    out.write(f"base    {labels[0]:<{width}}  {amounts[0]:>{right}}\n")
    out.write(f"new     {labels[1]:<{width}}  {amounts[1]:>{right}}\n")
    change = signed(_amount(table.total, unit, show_bytes), table.total)
    if diff.base_total > 0 and table.total:
        ratio = diff.new_total / diff.base_total
        # Past doubling a percentage reads badly (+413%): say how many times the base it is.
        change += (f" ({table.total / diff.base_total:+.0%})" if ratio < 2
                   else f" (×{ratio:.1f} the base)")
    out.write(f"change  {change}{f'  ({title})' if title else ''}\n")
    head = "MiB" if unit == "bytes" and not show_bytes else "B" if unit == "bytes" else ""
    out.write(f"{('flat ' + head).rstrip():>8} {'share':>6} {'sum':>6} "
              f"{('cum ' + head).rstrip():>8} name\n")
    grew = fell = 0.0
    for r in diff.rows:
        if r.flat > 0:
            grew += r.flat
            share, running = percent(r.flat, diff.growth), percent(grew, diff.growth)
        elif r.flat < 0:
            fell -= r.flat
            share, running = percent(-r.flat, diff.shrinkage), percent(fell, diff.shrinkage)
        else:
            share, running = "0.0%", ""
        out.write(
            f"{_change(r.flat, unit, show_bytes):>8} {share:>6} {running:>6} "
            f"{_change(r.cum, unit, show_bytes):>8} {row_name(r.key, granularity)}"
            f"{via_label(r.via) if r.flat else ''}\n"
        )
    if diff.rows:
        rise = signed(_amount(diff.growth, unit, show_bytes), diff.growth)
        fall = _amount(-diff.shrinkage, unit, show_bytes) if diff.shrinkage else "none"
        out.write(f"share: of all growth ({rise}) for a growing row, of all shrinkage ({fall}) "
                  "for a shrinking one; sum runs per kind\n")
