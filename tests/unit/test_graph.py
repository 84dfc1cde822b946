"""The call graph: node and edge values, pruning, diffs, DOT escaping and writing files."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from heapscope.analysis.graph import Graph, GraphOptions, build_graph
from heapscope.errors import InputError, ToolError, UsageError
from heapscope.model import Profile
from heapscope.render import callgraph
from heapscope.render.callgraph import escape, output_format, shorten, to_dot, write_graph

from .builders import Builder

HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="Graphviz dot not installed")


def v(n: float) -> tuple[float, ...]:
    """Sample values: n objects of 100 bytes each (inuse and alloc alike)."""
    return (n, 100 * n, n, 100 * n)


def nodes(g: Graph) -> dict[str, tuple[float, float]]:
    return {n.key.name: (n.flat, n.cum) for n in g.nodes}


def edges(g: Graph) -> dict[tuple[str, str], float]:
    return {(e.caller.name, e.callee.name): e.value for e in g.edges}


def simple() -> Profile:
    b = Builder()
    return b.profile(
        b.sample("leak_big", "main", "_start", values=v(60)),
        b.sample("leak_small", "helper", "main", "_start", values=v(30)),
        b.sample("helper", "main", "_start", values=v(10)),
    )


ALL = GraphOptions(nodecount=0, nodefraction=0.0, edgefraction=0.0)


# --------------------------------------------------------------------------------------
# Values


def test_node_and_edge_values() -> None:
    g = build_graph([simple()], ALL)
    assert g.total == 10_000
    assert nodes(g) == {
        "_start": (0, 10_000), "main": (0, 10_000), "leak_big": (6000, 6000),
        "helper": (1000, 4000), "leak_small": (3000, 3000),
    }
    assert edges(g) == {
        ("_start", "main"): 10_000, ("main", "leak_big"): 6000,
        ("main", "helper"): 4000, ("helper", "leak_small"): 3000,
    }
    # Nodes by |cum| then name; edges by |value|.
    assert [n.key.name for n in g.nodes] == ["_start", "main", "leak_big", "helper",
                                             "leak_small"]
    assert g.edges[0].value == 10_000
    assert g.dropped_nodes == g.dropped_edges == 0


def test_objects_sample_type() -> None:
    g = build_graph([simple()], GraphOptions(sample="inuse_objects", nodecount=0))
    assert g.unit == "count" and g.sample_type == "inuse_objects"
    assert nodes(g)["leak_big"] == (60, 60)
    assert "\\n60 (60.0%)" in to_dot(g)


def test_recursion_counts_each_stack_once_per_edge() -> None:
    b = Builder()
    p = b.profile(
        # main → r → x → r → x → alloc: the calls r→x and x→r each appear twice.
        b.sample("alloc", "x", "r", "x", "r", "main", values=v(5)),
        # direct recursion r → r → r: no self-edge, main→r once.
        b.sample("alloc", "r", "r", "r", "main", values=v(2)),
    )
    g = build_graph([p], ALL)
    assert nodes(g)["r"] == (0, 700)
    assert nodes(g)["x"] == (0, 500)
    assert edges(g) == {
        ("main", "r"): 700, ("r", "x"): 500, ("x", "r"): 500, ("x", "alloc"): 500,
        ("r", "alloc"): 200,
    }
    assert not [e for e in g.edges if e.caller == e.callee]


def test_inlined_frames_are_nodes_and_edges() -> None:
    b = Builder()
    p = b.profile(b.sample("inline_alloc;via_inline", "main", values=v(1)))
    g = build_graph([p], ALL)
    assert edges(g) == {("main", "via_inline"): 100, ("via_inline", "inline_alloc"): 100}
    gl = build_graph([p], GraphOptions(granularity="lines", nodecount=0))
    inl = next(n for n in gl.nodes if n.key.name == "inline_alloc")
    assert inl.key.inlined
    dot = to_dot(gl)
    assert "(inline)" in dot and 'style="dashed"' in dot


def test_files_granularity_and_no_stack() -> None:
    b = Builder()
    p = b.profile(b.sample("a@x.c:1", "b@y.c:2", values=v(1)), b.sample(values=v(1)))
    g = build_graph([p], GraphOptions(granularity="files", nodecount=0))
    assert set(nodes(g)) == {"x.c", "y.c", "[no stack]"}
    assert edges(g) == {("y.c", "x.c"): 100}


def test_several_profiles_add_up() -> None:
    g = build_graph([simple(), simple()], ALL)
    assert g.total == 20_000
    assert nodes(g)["leak_big"] == (12_000, 12_000)
    assert edges(g)[("main", "helper")] == 8000
    assert g.sources == ("built.heap", "built.heap")


def test_focus_and_ignore() -> None:
    g = build_graph([simple()], GraphOptions(focus="helper", nodecount=0))
    assert "leak_big" not in nodes(g) and g.total == 4000
    g = build_graph([simple()], GraphOptions(ignore="leak_small", nodecount=0))
    assert "leak_small" not in nodes(g) and g.total == 7000
    assert "Focusing on: helper" in to_dot(build_graph([simple()],
                                                       GraphOptions(focus="helper")))
    with pytest.raises(UsageError):
        build_graph([simple()], GraphOptions(focus="("))


# --------------------------------------------------------------------------------------
# Pruning


def wide(n: int = 10) -> Profile:
    b = Builder()
    return b.profile(*(b.sample(f"leaf{i:02d}", "main", values=v(i + 1)) for i in range(n)))


def test_nodecount_keeps_top_nodes_by_cum() -> None:
    g = build_graph([wide()], GraphOptions(nodecount=4, nodefraction=0, edgefraction=0))
    assert [n.key.name for n in g.nodes] == ["main", "leaf09", "leaf08", "leaf07"]
    assert g.all_nodes == 11 and g.dropped_nodes == 7 and g.dropped_by_count == 7
    assert set(edges(g)) == {("main", "leaf09"), ("main", "leaf08"), ("main", "leaf07")}
    assert g.dropped_edges == 7
    assert "Dropped 7 nodes" in to_dot(g) and "Showing 4 of 11 nodes" in to_dot(g)


def test_nodefraction_drops_small_nodes() -> None:
    # total 55 objects × 100 B; 10% = 550 B: leaves with cum <= 550 B (1..5 objects) go.
    g = build_graph([wide()], GraphOptions(nodefraction=0.1, edgefraction=0))
    assert g.node_cutoff == pytest.approx(550)
    assert sorted(nodes(g)) == ["leaf05", "leaf06", "leaf07", "leaf08", "leaf09", "main"]
    assert g.dropped_nodes == 5


def test_edgefraction_drops_light_edges_but_keeps_a_caller() -> None:
    b = Builder()
    p = b.profile(
        b.sample("leaf", "a", "main", values=v(90)),
        b.sample("leaf", "b", "main", values=v(1)),  # b→leaf is light: dropped
        b.sample("b", "main", values=v(9)),
    )
    g = build_graph([p], GraphOptions(nodefraction=0, edgefraction=0.05))
    assert g.edge_cutoff == pytest.approx(500)
    assert ("b", "leaf") not in edges(g)
    assert edges(g)[("a", "leaf")] == 9000
    assert g.dropped_edges == 1
    # A node's only incoming edge is kept however light (jeprof keeps it for reachability).
    p2 = b.profile(b.sample("leaf", "main", values=v(99)), b.sample("tiny", "main",
                                                                    values=v(1)))
    g2 = build_graph([p2], GraphOptions(nodefraction=0, edgefraction=0.5))
    assert edges(g2) == {("main", "leaf"): 9900, ("main", "tiny"): 100}


def test_bad_limits_are_usage_errors() -> None:
    for opts in (GraphOptions(nodecount=-1), GraphOptions(nodefraction=1.5),
                 GraphOptions(edgefraction=-0.1)):
        with pytest.raises(UsageError):
            build_graph([simple()], opts)


# --------------------------------------------------------------------------------------
# Diffs


def grown() -> tuple[Profile, Profile]:
    b = Builder()
    base = b.profile(
        b.sample("leak_big", "main", values=v(10)),
        b.sample("cache_fill", "main", values=v(50)),
    )
    new = b.profile(
        b.sample("leak_big", "main", values=v(40)),
        b.sample("cache_fill", "main", values=v(20)),
        b.sample("fresh", "main", values=v(5)),
    )
    return new, base


def test_base_diff_values() -> None:
    new, base = grown()
    g = build_graph([new], ALL, [base])
    assert g.diff
    assert g.total == 500
    assert g.denominator == 6000  # a share of the base total, like pprof -diff_base
    assert nodes(g) == {"main": (0, 500), "leak_big": (3000, 3000),
                        "cache_fill": (-3000, -3000), "fresh": (500, 500)}
    assert edges(g) == {("main", "leak_big"): 3000, ("main", "cache_fill"): -3000,
                        ("main", "fresh"): 500}


def test_base_diff_drops_unchanged() -> None:
    g = build_graph([simple()], ALL, [simple()])
    assert g.nodes == () and g.edges == () and g.total == 0


def test_base_diff_colours_and_legend() -> None:
    new, base = grown()
    dot = to_dot(build_graph([new], ALL, [base]))
    line = {m.group(1): m.group(0) for m in re.finditer(r'N\d+ \[label="(\w+).*', dot)}
    assert callgraph.GROW[0] in line["leak_big"] and "+2.9 KiB" in line["leak_big"]
    assert callgraph.SHRINK[0] in line["cache_fill"] and "-2.9 KiB" in line["cache_fill"]
    assert "Red: grew since the base; green: shrank" in dot
    assert "minus base: built.heap" in dot
    plain = to_dot(build_graph([new], ALL))
    assert callgraph.GROW[0] not in plain and callgraph.SHRINK[0] not in plain


# --------------------------------------------------------------------------------------
# DOT text


HOSTILE = ("operator<<", "<img src=x onerror=alert(1)>", 'a"b\\c', "x{y}|z", "two\nlines",
           "back\\", "bell\x07", "\\N\\G\\l")


def hostile() -> Profile:
    b = Builder()
    return b.profile(*(b.sample(name, "main", values=v(k + 1))
                       for k, name in enumerate(HOSTILE)))


def test_escape() -> None:
    assert escape('a"b\\c') == 'a\\"b\\\\c'
    assert escape("operator<<") == "operator\\<\\<"
    assert escape("x{y}|z") == "x\\{y\\}\\|z"
    assert escape("two\nlines") == "two\\\\x0alines"  # a name never breaks its line
    assert escape("bell\x07") == "bell\\\\x07"


def test_hostile_names_golden(golden) -> None:  # type: ignore[no-untyped-def]
    golden("graph_hostile.dot", to_dot(build_graph([hostile()], ALL)))


def dot_strings_are_closed(dot: str) -> None:
    """Every line is one statement whose quoted strings all close (no injected quote)."""
    for line in dot.splitlines():
        unescaped = re.sub(r'\\.', "", line)
        assert unescaped.count('"') % 2 == 0, line


def test_hostile_names_stay_inside_their_strings() -> None:
    dot = to_dot(build_graph([hostile()], ALL))
    dot_strings_are_closed(dot)
    for quoted in re.findall(r'"((?:[^"\\]|\\.)*)"', dot):
        bare = re.sub(r"\\.", "", quoted)  # what is left once escape pairs are removed
        assert not set(bare) & set("<>{}|\n"), quoted
    assert 'label="a\\"b\\\\c\\n' in dot
    assert len([ln for ln in dot.splitlines() if re.match(r"  N\d+ \[", ln)]) == len(HOSTILE) + 1


@needs_dot
def test_hostile_names_render_as_text_in_svg() -> None:
    dot = to_dot(build_graph([hostile()], ALL))
    svg = subprocess.run(["dot", "-Tsvg"], input=dot.encode(), capture_output=True,
                         check=True).stdout
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    assert all(el.tag != f"{ns}img" and el.tag != "img" for el in root.iter())
    texts = " ".join(t.text or "" for t in root.iter(f"{ns}text"))
    for name in ("operator<<", "<img src=x onerror=alert(1)>", 'a"b\\c', "x{y}|z",
                 "back\\", "\\N\\G\\l"):
        assert name in texts, (name, texts)
    assert "two" in texts and "lines" in texts


def test_long_names_shortened_with_full_tooltip() -> None:
    name = "std::vector<std::unique_ptr<Widget, std::default_delete<Widget> >, " \
           "std::allocator<std::unique_ptr<Widget, std::default_delete<Widget> > > >" \
           "::_M_realloc_insert"
    assert len(shorten(name)) == callgraph.MAX_LABEL
    assert shorten(name).startswith("std::vector<") and shorten(name).endswith("insert")
    assert "…" in shorten(name) and shorten("short") == "short"
    b = Builder()
    dot = to_dot(build_graph([b.profile(b.sample(name, "main", values=v(1)))], ALL))
    assert f'label="{escape(shorten(name))}\\n' in dot
    assert f'tooltip="{escape(name)}' in dot


def test_font_size_grows_with_flat() -> None:
    dot = to_dot(build_graph([simple()], ALL))
    size = {m.group(1): int(m.group(2))
            for m in re.finditer(r'N\d+ \[label="(\w+)\\n.*?fontsize="(\d+)"', dot)}
    assert size["leak_big"] == 24 and size["main"] == 8
    assert 8 < size["leak_small"] < size["leak_big"]


def test_simple_golden(golden) -> None:  # type: ignore[no-untyped-def]
    golden("graph_simple.dot", to_dot(build_graph([simple()], GraphOptions())))


def test_diff_golden(golden) -> None:  # type: ignore[no-untyped-def]
    new, base = grown()
    golden("graph_diff.dot", to_dot(build_graph([new], GraphOptions(), [base])))


def test_empty_graph_still_has_a_title() -> None:
    dot = to_dot(build_graph([Builder().profile()], GraphOptions()))
    assert "Total: 0 B" in dot and "Showing 0 of 0 nodes" in dot


# --------------------------------------------------------------------------------------
# Files


def test_output_format() -> None:
    assert output_format("g.svg") == "svg"
    assert output_format("G.PNG") == "png"
    assert output_format("g.txt", "pdf") == "pdf"
    assert output_format("-") == "dot"
    for bad in ("g.txt", "graph"):
        with pytest.raises(UsageError, match="give --format"):
            output_format(bad)


def test_dot_output_needs_no_graphviz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    g = build_graph([simple()], GraphOptions())
    out = tmp_path / "g.dot"
    write_graph(g, str(out), "dot")
    assert out.read_text() == to_dot(g)
    with pytest.raises(ToolError) as e:
        write_graph(g, str(tmp_path / "g.svg"), "svg")
    assert e.value.exit_code == 4
    msg = str(e.value)
    assert "\n" not in msg
    for hint in ("apt-get install graphviz", "dnf install graphviz", "apk add graphviz"):
        assert hint in msg
    assert not (tmp_path / "g.svg").exists()


def test_never_overwrites_without_force(tmp_path: Path) -> None:
    g = build_graph([simple()], GraphOptions())
    out = tmp_path / "g.dot"
    out.write_text("precious")
    with pytest.raises(InputError, match="exists: add --force to replace it") as e:
        write_graph(g, str(out), "dot")
    assert e.value.exit_code == 3
    assert out.read_text() == "precious"
    write_graph(g, str(out), "dot", force=True)
    assert out.read_text() == to_dot(g)
    assert sorted(os.listdir(tmp_path)) == ["g.dot"]  # no temporary files left


def test_unwritable_outputs(tmp_path: Path) -> None:
    g = build_graph([simple()], GraphOptions())
    with pytest.raises(InputError, match="no such folder"):
        write_graph(g, str(tmp_path / "missing" / "g.dot"), "dot")
    with pytest.raises(InputError, match="is a folder"):
        write_graph(g, str(tmp_path), "dot")
    if os.geteuid() != 0:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        try:
            with pytest.raises(InputError, match="permission denied"):
                write_graph(g, str(ro / "g.dot"), "dot")
        finally:
            ro.chmod(0o700)


@needs_dot
@pytest.mark.parametrize(("fmt", "magic"), [("svg", b"<?xml"), ("png", b"\x89PNG\r\n\x1a\n"),
                                            ("pdf", b"%PDF"), ("gif", b"GIF8")])
def test_images(tmp_path: Path, fmt: str, magic: bytes) -> None:
    out = tmp_path / f"g.{fmt}"
    write_graph(build_graph([simple()], GraphOptions()), str(out), fmt)
    assert out.read_bytes().startswith(magic)
    mask = os.umask(0o022)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~mask  # not mkstemp's 0600


def test_dot_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\necho 'Error: something broke' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(fake))
    with pytest.raises(ToolError, match="something broke") as e:
        write_graph(build_graph([simple()], GraphOptions()), str(tmp_path / "g.svg"), "svg")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "g.svg").exists()


def test_hide_and_show_shape_the_graph_and_its_title() -> None:
    g = build_graph([simple()], GraphOptions(nodecount=0, nodefraction=0.0, edgefraction=0.0,
                                             hide="^helper$"))
    # helper's own 10 objects are main's now; leak_small is called by main.
    assert nodes(g)["main"] == (1000, 10_000) and "helper" not in nodes(g)
    assert edges(g)[("main", "leak_small")] == 3000
    assert "Hiding frames: ^helper$" in to_dot(g)
    shown = build_graph([simple()], GraphOptions(nodecount=0, nodefraction=0.0,
                                                 edgefraction=0.0, show="^leak"))
    assert nodes(shown) == {"leak_big": (6000, 6000), "leak_small": (3000, 3000),
                            "[no stack]": (1000, 1000)}
    assert "Showing only frames: ^leak" in to_dot(shown)
