"""The top view as a library function: what the ``top`` command and the shell both print."""

from __future__ import annotations

from typing import NamedTuple

from heapscope.analysis.aggregate import Row, Table, aggregate, sort_rows, subtract
from heapscope.analysis.filter import compile_re, focus, hide, ignore, show
from heapscope.model import ALLOC_OBJECTS, ALLOC_SPACE, INUSE_OBJECTS, INUSE_SPACE, Profile

SAMPLE_INDEX = {
    "inuse_space": INUSE_SPACE,
    "inuse_objects": INUSE_OBJECTS,
    "alloc_space": ALLOC_SPACE,
    "alloc_objects": ALLOC_OBJECTS,
}


# A NamedTuple, not a dataclass: `heapscope top` must not import dataclasses (start-up time).
class View(NamedTuple):
    """Everything that shapes one table: sample type, granularity, order, size, filters."""

    sample: str = "inuse_space"
    granularity: str = "functions"
    cum: bool = False
    nodecount: int = 20
    focus: str | None = None
    ignore: str | None = None
    show_bytes: bool = False
    hide: str | None = None
    show: str | None = None


def filtered(profile: Profile, view: View) -> Profile:
    """Apply the view's focus and ignore patterns (which stacks), then its hide and show
    patterns (which frames of them) to a profile."""
    # Stacks are chosen by the frames they had, as pprof does: hiding a frame never
    # changes which stacks a focus keeps.
    if view.focus:
        profile = focus(profile, compile_re(view.focus, "--focus"))
    if view.ignore:
        profile = ignore(profile, compile_re(view.ignore, "--ignore"))
    if view.hide:
        profile = hide(profile, compile_re(view.hide, "--hide"))
    if view.show:
        profile = show(profile, compile_re(view.show, "--show"))
    return profile


class Diff(NamedTuple):
    """A top view of NEW minus BASE: the per-row changes, both sides' totals, and the sums the
    shares are parts of (every row's rise, every row's fall: ``growth - shrinkage`` is the
    change of the total)."""

    table: Table
    rows: tuple[Row, ...]
    base_total: float
    new_total: float
    growth: float  # sum of the positive flat changes
    shrinkage: float  # sum of the negative flat changes, as a positive number


def _shown(table: Table, view: View) -> tuple[Row, ...]:
    rows = sort_rows(table, view.cum)
    if view.nodecount > 0:
        rows = rows[: view.nodecount]
    return rows


def build_table(profiles: list[Profile], view: View,
                base: list[Profile] | None = None) -> tuple[Table, tuple[Row, ...]]:
    """Aggregate profiles (minus base ones) and return the table and its displayed rows."""
    if base:
        d = build_diff(profiles, view, base)
        return d.table, d.rows
    index = SAMPLE_INDEX[view.sample]
    table = aggregate([filtered(p, view) for p in profiles], index, view.granularity)
    return table, _shown(table, view)


def build_diff(profiles: list[Profile], view: View, base: list[Profile]) -> Diff:
    """The change from ``base`` to ``profiles`` under one view, rows matched by name."""
    index = SAMPLE_INDEX[view.sample]
    new = aggregate([filtered(p, view) for p in profiles], index, view.granularity)
    old = aggregate([filtered(p, view) for p in base], index, view.granularity)
    table = subtract(new, old)
    # Over every row, not only the displayed ones: a share is of all the growth.
    growth = sum(r.flat for r in table.rows if r.flat > 0)
    shrinkage = -sum(r.flat for r in table.rows if r.flat < 0)
    return Diff(table, _shown(table, view), old.total, new.total, growth, shrinkage)
