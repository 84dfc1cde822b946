"""The call tree behind the flame graph, its compact form, and safe embedding in HTML."""

from __future__ import annotations

import json
import re
from types import MappingProxyType

from heapscope.analysis.tree import build_tree
from heapscope.model import Frame, Location, Mapping, Profile, Sample
from heapscope.render.flamegraph import render_flamegraph
from heapscope.render.timeline import Line, Timeline, render_html, render_svg
from heapscope.web import script_json

from .builders import Builder

HOSTILE = "</script><img src=x onerror=alert(1)>"
V = (1, 100, 2, 300)  # inuse objects, inuse bytes, alloc objects, alloc bytes


def _embedded(html: str) -> dict[str, object]:
    m = re.search(r'<script type="application/json" id="heapscope-data">(.*?)</script>', html,
                  re.S)
    assert m is not None
    data: dict[str, object] = json.loads(m.group(1))
    return data


def test_merges_stacks_by_name_path() -> None:
    b = Builder()
    p = b.profile(b.sample("alloc_a", "work", "main", values=V),
                  b.sample("alloc_b", "work", "main", values=V),
                  b.sample("alloc_a", "work", "main", values=V))
    t = build_tree([p])
    work = t.find("main", "work")
    assert work is not None
    assert t.value(work, 1) == 300 and t.value(0, 1) == 300
    assert t.value(work, 3) == 900 and t.value(work, 0) == 3
    a = t.find("main", "work", "alloc_a")
    assert a is not None and t.value(a, 1) == 200
    assert sorted(t.label(c) for c in t.children(work)) == ["alloc_a", "alloc_b"]
    assert len(t) == 5  # root, main, work, alloc_a, alloc_b


def test_same_names_from_different_profiles_and_addresses_merge() -> None:
    b1, b2 = Builder(), Builder()
    b2.next["/srv/app"] += 0x5000  # other addresses, same names
    t = build_tree([b1.profile(b1.sample("leaf", "main")),
                    b2.profile(b2.sample("leaf", "main"))])
    leaf = t.find("main", "leaf")
    assert leaf is not None and t.value(leaf, 1) == 200 and len(t) == 3


def test_inlined_frames_are_nodes_and_lines_kept() -> None:
    b = Builder()
    # One location: inlined helper (innermost) inside outer; its caller is main.
    p = b.profile(b.sample("helper@h.c:7;outer@o.c:20", "main@m.c:3"))
    t = build_tree([p])
    helper = t.find("main", "outer", "helper")
    assert helper is not None
    assert t.inlined[helper] and not t.inlined[t.parent[helper]]
    assert t.strings[t.file[helper]] == "h.c" and t.line[helper] == 7
    assert t.strings[t.module[helper]] == "app"


def test_disagreeing_lines_are_not_shown() -> None:
    b = Builder()
    p = b.profile(b.sample("leaf", "work@w.c:10", "main"), b.sample("leaf2", "work@w.c:11",
                                                                     "main"))
    t = build_tree([p])
    work = t.find("main", "work")
    assert work is not None and t.line[work] == 0 and t.strings[t.file[work]] == "w.c"


def test_unsymbolized_frames_use_module_offset() -> None:
    b = Builder()
    p = b.profile(b.sample("?exe", "main"))
    t = build_tree([p])
    (leaf,) = t.children(t.find("main") or 0)
    assert re.fullmatch(r"app\+0x[0-9a-f]+", t.label(leaf))


def test_inverted_tree_starts_at_the_allocating_frame() -> None:
    b = Builder()
    p = b.profile(b.sample("malloc_site", "a", "main", values=V),
                  b.sample("malloc_site", "b", "main", values=V),
                  b.sample("other", "a", "main", values=V))
    t = build_tree([p], invert=True)
    site = t.find("malloc_site")
    assert site is not None and t.value(site, 1) == 200
    assert t.find("malloc_site", "a", "main") is not None
    assert t.find("malloc_site", "b", "main") is not None
    assert t.value(t.find("other", "a") or 0, 1) == 100
    assert t.inverted and t.to_json()["inverted"] is True


def test_diff_is_new_minus_base_by_name() -> None:
    b = Builder()
    base = b.profile(b.sample("grow", "main", values=(1, 100, 1, 100)),
                     b.sample("gone", "main", values=(2, 50, 2, 50)))
    nb = Builder()  # different addresses: matching is by name
    nb.next["/srv/app"] += 0x9000
    new = nb.profile(nb.sample("grow", "main", values=(5, 700, 5, 700)),
                     nb.sample("fresh", "main", values=(1, 10, 1, 10)))
    t = build_tree([new], base=[base])
    assert t.value(t.find("main", "grow") or 0, 1) == 600
    assert t.value(t.find("main", "gone") or 0, 1) == -50
    assert t.value(t.find("main", "fresh") or 0, 1) == 10
    assert t.value(0, 1) == 710 - 150
    data = t.to_json()
    assert "sb" in data and len(data["sb"][1]) == len(t)


def test_compact_json_string_table_and_self_values() -> None:
    b = Builder()
    p = b.profile(*[b.sample("leaf@x.c:1", "mid@x.c:2", "main@x.c:3", values=V)
                    for _ in range(50)], b.sample("mid@x.c:2", "main@x.c:3", values=V))
    t = build_tree([p])
    data = t.to_json()
    strings = t.strings
    assert len(strings) == len(set(strings))  # unique
    assert strings.count("x.c") == 1 and strings.count("leaf") == 1
    n = len(t)
    assert all(len(data[key]) == n for key in ("p", "n", "f", "l", "m"))
    parents = [k - d if k else -1 for k, d in enumerate(data["p"])]
    assert parents == t.parent
    # Self values: only the nodes where stacks end hold them; totals are subtree sums.
    mid, leaf = t.find("main", "mid"), t.find("main", "mid", "leaf")
    assert mid is not None and leaf is not None
    selfb = data["s"][1]
    assert selfb[leaf] == 5000 and selfb[mid] == 100 and selfb[0] == 0
    assert sum(selfb) == t.value(0, 1) == 5100


def test_escaping_a_hostile_symbol_name() -> None:
    b = Builder()
    p = b.profile(b.sample(HOSTILE, "main", values=V))
    html = render_flamegraph(build_tree([p]), title=HOSTILE, sources=[HOSTILE])
    assert "<img" not in html
    assert html.lower().count("</script") == 2  # the data element and the viewer script
    assert "\\u003c/script\\u003e\\u003cimg" in html
    data = _embedded(html)
    assert HOSTILE in data["strings"]  # type: ignore[operator]
    assert data["title"] == HOSTILE
    assert "Content-Security-Policy" in html
    # Offline: no external resource anywhere.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)


def test_script_json_escapes_every_dangerous_character() -> None:
    text = script_json({"s": "a<b>c&d\u2028e\u2029f<!-- x"})
    for ch in "<>&\u2028\u2029":
        assert ch not in text
    assert json.loads(text) == {"s": "a<b>c&d\u2028e\u2029f<!-- x"}
    # An undecodable byte kept as a lone surrogate is written as the text \xff: valid JSON of
    # Unicode characters only, and a page that encodes as UTF-8.
    out = script_json(["bad\udcff"])
    out.encode("utf-8")
    assert json.loads(out) == ["bad\\xff"]


def _wide_profile(copies: int) -> Profile:
    """200 distinct stacks over a fixed set of frames, each stack repeated ``copies`` times
    (the repeats are separate samples, as with per-thread or differently sized stacks)."""
    exe = Mapping(0x1000, 0x900000, 0, "/srv/app", "r-xp")
    locs = {}
    for k in range(60):
        a = 0x2000 + 0x40 * k
        locs[a] = Location(a, exe, "app", a - 0x1000, (Frame(f"func_{k}", "app.c", k + 1),))
    samples = []
    for s in range(200):
        stack = (*(0x2000 + 0x40 * ((s * 7 + d * 13) % 60) for d in range(6)), 0x2000)
        for c in range(copies):
            samples.append(Sample(stack, (1.0, 64.0 + c, 1.0, 64.0 + c)))
    return Profile(tuple(samples), (exe,), period=1, sampling="none", unsampled=True,
                   locations=MappingProxyType(locs))


def test_html_size_follows_unique_frames_not_samples() -> None:
    small = render_flamegraph(build_tree([_wide_profile(1)]), title="t", sources=["a"])
    big = render_flamegraph(build_tree([_wide_profile(10)]), title="t", sources=["a"])
    assert len(_wide_profile(10).samples) == 10 * len(_wide_profile(1).samples)
    assert len(big) < 1.1 * len(small), (len(small), len(big))


def test_timeline_svg_and_html_escape_labels() -> None:
    tl = Timeline(HOSTILE, [Line("RSS pid 1", "rss", 1, [(0.0, 1e6), (1.0, 2e6)]),
                            Line("heap pid 1", "heap", 1, [(0.5, 5e5), (1.0, 9e5)]),
                            Line(HOSTILE, "suspect", 1, [(0.5, 1e5), (1.0, 3e5)], HOSTILE)],
                  notes=[HOSTILE])
    svg = render_svg(tl)
    assert "<img" not in svg and "&lt;img src=x" in svg
    assert svg.count("<polyline") == 3
    html = render_html(tl)
    assert "<img" not in html and "<script" not in html


def test_timeline_empty() -> None:
    svg = render_svg(Timeline("empty", []))
    assert "no data" in svg
