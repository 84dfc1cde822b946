"""Callers and callees of one function: pprof's ``peek``, from the call graph's sums.

The numbers are those of :mod:`heapscope.analysis.graph`: the function's flat and cum value
as in ``top``, and for each caller (callee) the value allocated through that call, each stack
counted once per call even under recursion. Several functions may share a name (one per
module or file): they are taken together, as the flame graph does.
"""

from __future__ import annotations

from typing import NamedTuple

from heapscope.analysis.graph import Sums, accumulate, subtract
from heapscope.analysis.top import SAMPLE_INDEX, View, filtered
from heapscope.model import Profile


class Call(NamedTuple):
    """A caller or callee by name, and what was allocated through the call."""

    name: str
    value: float


class Peek(NamedTuple):
    """One function's own values and its calls, biggest first."""

    name: str
    flat: float
    cum: float
    total: float
    sample_type: str
    unit: str
    callers: tuple[Call, ...]
    callees: tuple[Call, ...]
    files: tuple[str, ...]  # the source files its frames name


def _ranked(values: dict[str, float]) -> tuple[Call, ...]:
    return tuple(Call(n, v) for n, v in sorted(values.items(), key=lambda kv: (-abs(kv[1]),
                                                                                 kv[0])) if v)


def peek_sums(sums: Sums, name: str) -> Peek:
    """The peek of ``name`` in sums already accumulated (by function)."""
    flat = sum(v for k, v in sums.flat.items() if k.name == name)
    cum = sum(v for k, v in sums.cum.items() if k.name == name)
    callers: dict[str, float] = {}
    callees: dict[str, float] = {}
    for (caller, callee), v in sums.edges.items():
        if callee.name == name and caller.name != name:
            callers[caller.name] = callers.get(caller.name, 0.0) + v
        if caller.name == name and callee.name != name:
            callees[callee.name] = callees.get(callee.name, 0.0) + v
    files = sorted({k.file for k in sums.cum if k.name == name and k.file})
    return Peek(name, flat, cum, sums.total, sums.sample_type, sums.unit, _ranked(callers),
                _ranked(callees), tuple(files))


def function_sums(profiles: list[Profile], view: View,
                  base: list[Profile] | None = None) -> Sums:
    """Flat, cum and call sums by function of ``profiles`` (minus ``base``), with the view's
    sample type, focus and ignore."""
    index = SAMPLE_INDEX[view.sample]
    sums = accumulate([filtered(p, view) for p in profiles], index, "functions")
    if base:
        sums = subtract(sums, accumulate([filtered(p, view) for p in base], index,
                                         "functions"))
    return sums


def peek(profiles: list[Profile], view: View, name: str,
         base: list[Profile] | None = None) -> Peek:
    """Callers and callees of the function ``name``."""
    return peek_sums(function_sums(profiles, view, base), name)
