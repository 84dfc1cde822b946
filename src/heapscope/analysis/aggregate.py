"""Flat and cumulative totals per function, line, file or address: the ``top`` view.

A row's flat value is what was allocated with it as the first (non-allocator) frame; its cum
value is what was allocated with it anywhere on the stack, counted once per stack even under
recursion (as jeprof and pprof do). Rows come from frames, so inlined functions get their own
rows. Several profiles can be aggregated together (``--merge``) because keys are names, never
raw addresses, which differ between processes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import NamedTuple

from heapscope.model import Location, Profile, ViaFrame
from heapscope.native import core

GRANULARITIES = ("functions", "lines", "files", "addresses")
NO_STACK = "[no stack]"


class Key(NamedTuple):
    """What a row stands for at the chosen granularity (a tuple: hashed in C, fast)."""

    name: str
    file: str = ""
    line: int = 0
    module: str = ""
    inlined: bool = False


# Row and Table are NamedTuples, not dataclasses: `heapscope top` must not import
# dataclasses (start-up time).
class Row(NamedTuple):
    """One line of a top table."""

    key: Key
    flat: float
    cum: float
    via: tuple[ViaFrame, ...] = ()  # the frames folded into it, of its heaviest stacks


class Table(NamedTuple):
    """A complete top view: rows plus the total they are percentages of."""

    rows: tuple[Row, ...]
    total: float
    sample_type: str
    unit: str


def location_keys(loc: Location, granularity: str) -> tuple[Key, ...]:
    """The keys a location contributes, innermost (inlined) first."""
    if granularity == "addresses":
        f = loc.frames[0] if loc.frames else None
        label = f"{loc.fallback_name}"
        if f is not None:
            label += f" {f.function}"
        return (Key(label, f.file if f else "", f.line if f else 0, loc.module),)
    if not loc.frames:
        name = loc.fallback_name
        if granularity == "files":
            return (Key(loc.module or name, module=loc.module),)
        return (Key(name, module=loc.module),)
    out = []
    # tuple.__new__ with every field: without the NamedTuple's Python-level __new__ (a table
    # keys each of a dump's ~8,000 addresses).
    new = tuple.__new__
    for f in loc.frames:
        if granularity == "functions":
            out.append(new(Key, (f.function, f.file, 0, loc.module, False)))
        elif granularity == "lines":
            out.append(new(Key, (f.function, f.file, f.line, loc.module, f.inlined)))
        else:
            out.append(Key(f.file or loc.module, module=loc.module))
    return tuple(out)


class KeyTable:
    """Dense integer ids for keys, each with a running flat and cumulative sum."""

    def __init__(self) -> None:
        self.ids: dict[Key, int] = {}
        self.keys: list[Key] = []
        self.flat: list[float] = []
        self.cum: list[float] = []
        # Per key: flat value by via chain. Chains are counted by identity (a fold gives equal
        # chains one tuple), which spares hashing a tuple of frames per sample.
        self.via: dict[int, dict[int, float]] = {}
        self.chains: dict[int, tuple[ViaFrame, ...]] = {}

    def add_via(self, i: int, via: tuple[ViaFrame, ...], v: float) -> None:
        """Count ``v`` of key ``i``'s flat value as folded through ``via``."""
        per = self.via.get(i)
        if per is None:
            per = self.via[i] = {}
        c = id(via)
        if c not in self.chains:
            self.chains[c] = via
        per[c] = per.get(c, 0.0) + v

    def heaviest_via(self, i: int) -> tuple[ViaFrame, ...]:
        """The chain most of key ``i``'s flat value went through (empty: none folded)."""
        per = self.via.get(i)
        if not per:
            return ()
        chains = self.chains
        if len(per) == 1:  # most keys: one chain, no comparison to make
            return chains[next(iter(per))]
        return chains[max(per.items(), key=lambda kv: (abs(kv[1]), len(chains[kv[0]])))[0]]

    def id(self, k: Key) -> int:
        """The id of ``k``, assigned on first sight."""
        i = self.ids.get(k)
        if i is None:
            i = self.ids[k] = len(self.keys)
            self.keys.append(k)
            self.flat.append(0.0)
            self.cum.append(0.0)
        return i


def _accumulate(p: Profile, index: int, granularity: str, table: KeyTable) -> float:
    """The compiled loop of :func:`aggregate` over one profile: adds to the table's sums and
    returns the profile's total. Addresses are keyed as the loop reaches them, so those only
    in stacks without this value are never looked at."""
    assert core is not None
    key_id = table.id

    def ids(a: int) -> tuple[int, ...]:
        return tuple(map(key_id, location_keys(p.location(a), granularity)))

    no_stack = key_id(Key(NO_STACK))
    flat, cum, total, leaf = core.accumulate(p.samples, index, {}, ids, no_stack)
    # Sums in the samples' order, as the Python loop adds them: equal to the bit for one
    # profile (merged profiles are summed per profile first, a rounding apart).
    for k in range(len(flat)):
        table.flat[k] += flat[k]
        table.cum[k] += cum[k]
    if any(s.via for s in p.samples):
        # add_via per sample, compiled: the same dicts filled in the same order.
        core.via_sums(p.samples, leaf, index, table.via, table.chains)
    return total


def aggregate(profiles: Iterable[Profile], index: int, granularity: str = "functions") -> Table:
    """Sum one sample value per key over the given (symbolized, pruned) profiles."""
    table = KeyTable()
    key_id, keys, flat, cum = table.id, table.keys, table.flat, table.cum
    total = 0.0
    sample_type = unit = ""

    for p in profiles:
        vt = p.sample_types[index]
        sample_type, unit = vt.type, vt.unit
        if core is not None:
            total += _accumulate(p, index, granularity, table)
            continue
        # Key ids per address, innermost first; computed once per distinct address.
        per_addr: dict[int, tuple[int, ...]] = {
            a: tuple(key_id(k) for k in location_keys(p.location(a), granularity))
            for a in p.addresses()
        }
        no_stack = (key_id(Key(NO_STACK)),)
        folded = any(s.via for s in p.samples)
        chain = itertools.chain.from_iterable
        for s in p.samples:
            v = s.values[index]
            if v == 0:
                continue
            total += v
            stack_ids = tuple(chain(map(per_addr.__getitem__, s.stack))) or no_stack
            flat[stack_ids[0]] += v
            if folded:
                table.add_via(stack_ids[0], s.via, v)
            for k in set(stack_ids):
                cum[k] += v
    new, heaviest_via = tuple.__new__, table.heaviest_via  # Row(...) without its __new__
    rows = tuple(
        new(Row, (k, flat[i], cum[i], heaviest_via(i)))
        for i, k in enumerate(keys) if flat[i] != 0 or cum[i] != 0
    )
    return Table(rows, total, sample_type, unit)


def subtract(new: Table, base: Table) -> Table:
    """Per-key difference new − base (a ``--base`` diff, made after symbolization)."""
    rows: dict[Key, list[float]] = {r.key: [r.flat, r.cum] for r in new.rows}
    via = {r.key: r.via for r in base.rows if r.via}
    via.update((r.key, r.via) for r in new.rows if r.via)
    for r in base.rows:
        cur = rows.setdefault(r.key, [0.0, 0.0])
        cur[0] -= r.flat
        cur[1] -= r.cum
    out = tuple(Row(k, v[0], v[1], via.get(k, ())) for k, v in rows.items()
                if v[0] != 0 or v[1] != 0)
    return Table(out, new.total - base.total, new.sample_type, new.unit)


def sort_rows(table: Table, by_cum: bool = False) -> tuple[Row, ...]:
    """Rows in display order: by flat (or cum) descending, then by name; zero rows dropped."""
    rows = [r for r in table.rows if r.flat != 0 or r.cum != 0]
    if by_cum:
        rows.sort(key=lambda r: (-r.cum, -r.flat, r.key.name, r.key.file, r.key.line))
    else:
        rows.sort(key=lambda r: (-r.flat, -r.cum, r.key.name, r.key.file, r.key.line))
    return tuple(rows)
