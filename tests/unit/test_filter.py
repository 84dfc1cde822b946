"""``--hide`` and ``--show`` (pprof's): frames leave stacks, stacks keep their values.

Expected values are counted by hand from the profiles built here: three stacks of 60, 30 and
10 objects of 100 bytes, one of them with an inlined frame, and one unsymbolized leaf.
"""

from __future__ import annotations

import re

from heapscope.analysis.aggregate import NO_STACK, aggregate
from heapscope.analysis.filter import focus, hide, kept_frames, show
from heapscope.analysis.top import View, build_table, filtered
from heapscope.model import INUSE_SPACE, Profile, Sample, ViaFrame

from .builders import Builder


def v(n: float) -> tuple[float, ...]:
    return (n, 100 * n, n, 100 * n)


def profile() -> Profile:
    b = Builder()
    return b.profile(
        b.sample("leak@a.c:10", "helper@a.c:20", "main@a.c:30", values=v(60)),
        b.sample("helper@a.c:20", "main@a.c:30", values=v(30)),
        b.sample("inl@a.c:5;outer@a.c:6", "main@a.c:30", values=v(10)),
    )


def flat_cum(p: Profile) -> dict[str, tuple[float, float]]:
    t = aggregate([p], INUSE_SPACE)
    return {r.key.name: (r.flat, r.cum) for r in t.rows}


def names(p: Profile, s: Sample) -> list[str]:
    return [f.function for loc in p.stack_locations(s) for f in loc.frames]


def test_hide_drops_frames_and_keeps_values() -> None:
    p = hide(profile(), re.compile("^helper$"))
    assert [names(p, s) for s in p.samples] == [
        ["leak", "main"], ["main"], ["inl", "outer", "main"]]
    assert p.total(INUSE_SPACE) == 10_000
    # helper's 30 objects are now main's own; leak's 60 stay leak's.
    assert flat_cum(p) == {"leak": (6000, 6000), "main": (3000, 10_000),
                           "inl": (1000, 1000), "outer": (0, 1000)}


def test_show_keeps_only_matching_frames() -> None:
    p = show(profile(), re.compile("^(main|helper)$"))
    assert [names(p, s) for s in p.samples] == [["helper", "main"], ["helper", "main"],
                                                ["main"]]
    assert flat_cum(p) == {"helper": (9000, 9000), "main": (1000, 10_000)}


def test_a_stack_with_nothing_left_keeps_its_value_as_no_stack() -> None:
    p = show(profile(), re.compile("^leak$"))
    assert p.total(INUSE_SPACE) == 10_000
    assert flat_cum(p) == {"leak": (6000, 6000), NO_STACK: (4000, 4000)}


def test_an_inlined_frame_goes_alone() -> None:
    p = hide(profile(), re.compile("^inl$"))
    assert names(p, p.samples[2]) == ["outer", "main"]
    assert flat_cum(p)["outer"] == (1000, 1000)
    kept = show(profile(), re.compile("^inl$"))
    assert names(kept, kept.samples[2]) == ["inl"]


def test_frames_match_by_file_and_line_and_locations_by_module() -> None:
    by_line = hide(profile(), re.compile(r"a\.c:20$"))
    assert "helper" not in flat_cum(by_line)
    b = Builder()
    p = b.profile(b.sample("?exe", "libc:start", values=v(5)),
                  b.sample("work", "libc:start", values=v(7)))
    # module+0xoffset stands for every frame of a location, symbolized or not.
    assert flat_cum(hide(p, re.compile(r"^app\+0x"))) == {"start": (1200, 1200)}
    assert flat_cum(show(p, re.compile(r"^app\+0x"))) == {"app+0x1000": (500, 500),
                                                          "work": (700, 700)}


def test_kept_frames_says_when_a_location_goes() -> None:
    b = Builder()
    loc = b.locations[b.loc("inl@a.c:5;outer@a.c:6")]
    assert kept_frames(loc, re.compile("inl|outer"), show=False) is None
    assert kept_frames(loc, re.compile("nothing"), show=False) == loc.frames
    assert kept_frames(loc, re.compile("nothing"), show=True) is None


def test_nothing_matching_changes_nothing() -> None:
    p = profile()
    assert hide(p, re.compile("^nowhere$")) is p


def test_the_via_chain_leaves_with_its_site() -> None:
    b = Builder()
    via = (ViaFrame("std::vector", "", 0, "libstdc++", "library"),)
    site = b.sample("insert@a.c:3", "main@a.c:9", values=v(4))
    p = b.profile(Sample(site.stack, site.values, (), via))
    kept = hide(p, re.compile("^main$"))
    assert kept.samples[0].via == via
    gone = hide(p, re.compile("^insert$"))
    assert gone.samples[0].via == () and names(gone, gone.samples[0]) == ["main"]


def test_focus_chooses_stacks_before_frames_are_hidden() -> None:
    view = View(focus="helper", hide="helper", nodecount=0)
    table, _ = build_table([profile()], view)
    assert table.total == 9000
    assert {r.key.name for r in table.rows} == {"leak", "main"}
    assert filtered(profile(), view).samples == hide(
        focus(profile(), re.compile("helper")), re.compile("helper")).samples
