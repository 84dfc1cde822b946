"""Collapsed ("folded") stacks: ``root;caller;…;leaf value``, one line per distinct stack.

The format flamegraph.pl, inferno and speedscope read: frames are separated by ``;``, the last
space separates the integer value. Inlined frames are frames of their own; an address no
symbol covers is ``module+0xoffset``. Identical stacks (by name, so several dumps merge) are
added up and the lines sorted, so the output is deterministic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TextIO

from heapscope.analysis.aggregate import NO_STACK
from heapscope.model import Location, Profile
from heapscope.terminal import clean


def clean_name(name: str) -> str:
    """A frame name safe for one collapsed line: no separators, no line breaks, and no
    other control or direction-changing character (written as a visible escape: whatever
    shows the file, a terminal or a flame graph, must not obey it)."""
    if ";" in name or "\n" in name or "\r" in name:
        name = name.replace(";", ":").replace("\n", " ").replace("\r", " ")
    return clean(name)


def frame_names(loc: Location) -> tuple[str, ...]:
    """The names of a location's frames, innermost (inlined) first."""
    if not loc.frames:
        return (loc.fallback_name,)
    return tuple(f.function or loc.fallback_name for f in loc.frames)


def stack_names(profile: Profile) -> dict[int, tuple[str, ...]]:
    """Frame names per address of the profile, innermost first."""
    return {a: frame_names(profile.location(a)) for a in profile.addresses()}


def collapse(profiles: Iterable[Profile], index: int) -> dict[str, float]:
    """Summed values per root-first ``;``-joined stack for one sample value."""
    out: dict[str, float] = {}
    for p in profiles:
        names = {a: ";".join(clean_name(n) for n in reversed(v))
                 for a, v in stack_names(p).items()}
        memo: dict[tuple[int, ...], str] = {}
        for s in p.samples:
            v = s.values[index]
            if v == 0:
                continue
            line = memo.get(s.stack)
            if line is None:
                line = memo[s.stack] = (
                    ";".join([names[a] for a in reversed(s.stack)]) or NO_STACK
                )
            out[line] = out.get(line, 0.0) + v
    return out


def render_collapsed(out: TextIO, profiles: Iterable[Profile], index: int) -> None:
    """Write sorted ``stack value`` lines; stacks whose estimate rounds to 0 are left out."""
    for line, value in sorted(collapse(profiles, index).items()):
        n = round(value)
        if n != 0:
            out.write(f"{line} {n}\n")
