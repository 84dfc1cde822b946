"""The viewer's call graph, hide/show, per-view --own/--alloc-fn and merged sets, through
Starlette's TestClient, against the commands on the same input.

The session is the one of ``test_serve``: twelve dumps of one process in which
``leaky_insert`` holds ``10 + 8k`` objects of 1 KiB at dump ``k`` and ``load_table`` one
4 KiB table. The call graph's DOT must be the text ``heapscope graph --format dot`` writes,
a merged set's numbers those of ``heapscope top --merge --format json``, and a hide, show,
own or alloc-fn the view ``heapscope top`` prints with the same option.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.unit import test_serve
from tests.unit.test_serve import PID, cli_json, make_client

pytest.importorskip("starlette")

from heapscope.cli.main import parser
from heapscope.errors import ToolError
from heapscope.formats.symbolized import write
from heapscope.serve.callgraph import check_svg, node_boxes
from tests.unit.builders import Builder

session = test_serve.session  # the same session fixture: its dumps, its numbers
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="Graphviz dot not installed")
SVG = "{http://www.w3.org/2000/svg}"


def dump_path(session: Path, k: int) -> str:
    kind = "f" if k == 11 else f"m{k}"
    return str(session / "symbolized" / f"jeprof.{PID}.{k}.{kind}.heap.json.gz")


def cli_dot(tmp_path: Path, *argv: str) -> str:
    """The DOT text ``heapscope graph ARGV -o FILE.dot`` writes."""
    out = tmp_path / f"graph-{len(list(tmp_path.glob('graph-*')))}.dot"
    full = ["graph", *argv, "-o", str(out), "--no-cache"]
    args: argparse.Namespace = parser(full).parse_args(full)
    with contextlib.redirect_stderr(io.StringIO()):
        args.func(args)
    return out.read_text()


def cli_options(query: str) -> list[str]:
    """``heapscope`` options for a viewer query such as ``sample=inuse_objects&hide=main``."""
    argv: list[str] = []
    for part in filter(None, query.split("&")):
        key, _, value = part.partition("=")
        if key == "granularity":
            argv.append("--" + value)
        elif key == "sample":
            argv.append("--" + value.replace("_", "-"))
        elif key == "base":
            continue
        else:
            argv += ["--" + key.replace("_", "-"), value]
    return argv


# ----------------------------------------------------------------------------- hide, show


@pytest.mark.parametrize("query", ["hide=main", "show=leaky", "show=^main$",
                                   "hide=app.c:5&granularity=lines", "focus=leaky&hide=leaky"])
def test_hide_and_show_are_heapscope_tops(session: Path, query: str) -> None:
    client = make_client(str(session))
    got = client.get(f"/api/dump/11/top?n=20&{query}").json()
    want = cli_json("top", dump_path(session, 11), "--format", "json", "-n", "20",
                    *cli_options(query))
    assert {k: got[k] for k in want} == want
    # Stacks keep their values: only a focus chooses fewer.
    assert got["total"] == 98 * 1024 + (0 if "focus" in query else 4096)


def test_hide_and_show_reach_every_view(session: Path) -> None:
    client = make_client(str(session))
    flame = client.get("/api/dump/11/flame?hide=main").json()
    assert "main" not in flame["strings"] and "leaky_insert" in flame["strings"]
    peek = client.get("/api/dump/11/peek?function=leaky_insert&hide=main").json()
    assert peek["callers"] == [] and peek["cum"] == 98 * 1024
    shown = client.get("/api/dump/11/peek?function=main&show=main").json()
    assert shown["flat"] == shown["cum"] == 98 * 1024 + 4096  # main is every stack's leaf
    assert client.get("/api/dump/11/top?hide=(").status_code == 400
    assert client.get("/api/dump/11/graph?show=[").json()["error"].startswith("show '['")


# ----------------------------------------------------------------------------- call graph


@needs_dot
@pytest.mark.parametrize("query", ["", "focus=leaky", "hide=main", "sample=inuse_objects",
                                   "granularity=lines", "nodecount=2", "edgefraction=0.5",
                                   "base=0", "base=0&sample=alloc_objects"])
def test_graph_is_heapscope_graph(session: Path, tmp_path: Path, query: str) -> None:
    client = make_client(str(session))
    got = client.get(f"/api/dump/11/graph?{query}").json()
    argv = [dump_path(session, 11), *cli_options(query)]
    if "base=0" in query:
        argv += ["--base", dump_path(session, 0)]
    assert got["dot"] == cli_dot(tmp_path, *argv)
    assert got["diff"] == ("base=0" in query)


@needs_dot
def test_graph_svg_and_node_boxes(session: Path) -> None:
    client = make_client(str(session))
    doc = client.get("/api/dump/11/graph").json()
    root = ET.fromstring(doc["svg"])
    assert root.tag == f"{SVG}svg" and not doc["message"]
    assert [n["name"] for n in doc["nodes"]] == ["main", "leaky_insert", "load_table"]
    assert doc["nodes"][1]["flat"] == 98 * 1024 and doc["nodes"][0]["cum"] == doc["total"]
    for n in doc["nodes"]:
        x, y, w, h = n["box"]
        assert 0 <= x < x + w <= 1 and 0 <= y < y + h <= 1, n
    # main calls both: its box is above theirs (graphviz draws callers first).
    boxes = {n["name"]: n["box"] for n in doc["nodes"]}
    assert boxes["main"][1] + boxes["main"][3] <= boxes["leaky_insert"][1]
    assert (doc["shown_nodes"], doc["all_nodes"], doc["shown_edges"]) == (3, 3, 2)


@needs_dot
def test_clicking_a_node_focuses_every_view(session: Path) -> None:
    client = make_client(str(session))
    node = next(n for n in client.get("/api/dump/11/graph").json()["nodes"]
                if n["name"] == "load_table")
    assert node["focus"] == "^load_table$"
    got = client.get("/api/dump/11/top", params={"focus": node["focus"], "n": 20}).json()
    want = cli_json("top", dump_path(session, 11), "--format", "json", "-n", "20",
                    "--focus", node["focus"])
    assert {k: got[k] for k in want} == want and got["total"] == 4096
    graph = client.get("/api/dump/11/graph", params={"focus": node["focus"]}).json()
    assert {n["name"] for n in graph["nodes"]} == {"main", "load_table"}


def test_without_graphviz_the_graph_is_its_dot_and_a_message(
        session: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("heapscope.render.callgraph.shutil.which", lambda name: None)
    doc = make_client(str(session)).get("/api/dump/11/graph").json()
    assert doc["svg"] is None and "Graphviz" in doc["message"]
    assert doc["dot"].startswith('digraph "heapscope"')
    assert [n["box"] for n in doc["nodes"]] == [None, None, None]
    assert doc["nodes"][0]["focus"] == "^main$"


def test_focus_patterns_per_granularity() -> None:
    from heapscope.analysis.aggregate import Key
    from heapscope.serve.callgraph import focus_pattern

    assert focus_pattern(Key("operator new[](unsigned long)"), "functions") == \
        r"^operator\ new\[\]\(unsigned\ long\)$"
    assert re.search(focus_pattern(Key("/src/a.c", module="app"), "files"), "/src/a.c:12")
    assert re.search(focus_pattern(Key("app", module="app"), "files"), "app+0x1f")
    assert focus_pattern(Key("app+0x10 f"), "addresses") == r"^app\+0x10$"


@needs_dot
def test_hostile_names_stay_text_in_the_svg(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEAPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    hostile = ['<script>alert(1)</script>', 'x" onload="alert(1)',
               ']]><foreignObject><body onload=alert(1)/></foreignObject>',
               '&#27&lt[31m', 'a\\lb\\N', '<a xlink:href="javascript:alert(1)">']
    b = Builder()
    samples = [b.sample("je:malloc", name, "main", values=(1, 1000 * (k + 1), 1, 1000))
               for k, name in enumerate(hostile)]
    dump = tmp_path / "jeprof.7.0.f.heap.json.gz"
    write(b.profile(*samples, pid=7, source=dump.name), str(dump))
    doc = make_client(str(dump)).get("/api/dump/0/graph").json()
    root = check_svg(doc["svg"])
    tags = {el.tag.rsplit("}", 1)[-1] for el in root.iter()}
    assert tags <= {"svg", "g", "title", "a", "polygon", "path", "text"}, tags
    attrs = {a.rsplit("}", 1)[-1] for el in root.iter() for a in el.attrib}
    assert not [a for a in attrs if a.startswith("on") or a == "href"], attrs
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    for name in hostile[:3]:
        assert any(name in t for t in texts), (name, texts)
    assert {n["name"] for n in doc["nodes"]} >= set(hostile)


@pytest.mark.parametrize("bad", [
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1 1"><script>x()</script></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1 1" onload="x()"></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1 1"><foreignObject/></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink" '
    'viewBox="0 0 1 1"><a xlink:href="javascript:x()"><text>t</text></a></svg>',
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 1 1"><g style="x"/></svg>',
    '<?xml-stylesheet href="http://x/a.css"?><svg xmlns="http://www.w3.org/2000/svg"/>',
    '<!DOCTYPE svg [<!ENTITY a "b">]><svg xmlns="http://www.w3.org/2000/svg"/>',
    '<svg viewBox="0 0 1 1"><g/></svg>',
    'not xml'])
def test_an_svg_with_more_than_a_graph_is_refused(bad: str) -> None:
    with pytest.raises(ToolError):
        check_svg(bad)


def test_node_boxes_follow_the_graph_transform() -> None:
    svg = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0.00 0.00 200.00 100.00">'
           '<g id="graph0" class="graph" transform="scale(1 1) rotate(0) translate(4 96)">'
           '<g class="node"><title>N1</title><polygon points="46,-86 6,-86 6,-66 46,-66 '
           '46,-86"/></g><g class="node"><title>title</title><text>t</text></g></g></svg>')
    width, height, boxes = node_boxes(check_svg(svg))
    assert (width, height) == (200, 100)
    assert boxes == {"N1": (0.05, 0.1, 0.2, 0.2)}


def test_graph_parameters_are_checked(session: Path) -> None:
    client = make_client(str(session))
    for q in ("nodecount=-1", "nodecount=x", "nodefraction=1", "edgefraction=-0.1",
              "edgefraction=y"):
        assert client.get(f"/api/dump/11/graph?{q}").status_code == 400, q
    assert client.get("/api/dump/11/nothing").status_code == 404


# ----------------------------------------------------------------------------- merged sets


def test_merged_top_is_heapscope_top_merge(session: Path) -> None:
    client = make_client(str(session))
    got = client.get("/api/merged/top?ids=3,7,11&n=20").json()
    want = cli_json("top", *(dump_path(session, k) for k in (3, 7, 11)), "--merge",
                    "--format", "json", "-n", "20")
    assert {k: got[k] for k in want} == want
    # By hand: 34 + 66 + 98 objects of 1 KiB, and three 4 KiB tables.
    assert got["total"] == (34 + 66 + 98) * 1024 + 3 * 4096
    assert got["rows"][0]["name"] == "leaky_insert" and not got["diff"]
    objects = client.get("/api/merged/top?ids=3,7,11&sample=inuse_objects").json()
    assert objects["total"] == 34 + 66 + 98 + 3
    grown = client.get("/api/merged/top?ids=3,7,11&base=0&n=20").json()
    want = cli_json("top", *(dump_path(session, k) for k in (3, 7, 11)), "--merge",
                    "--base", dump_path(session, 0), "--format", "json", "-n", "20")
    assert {k: grown[k] for k in ("total", "rows")} == {k: want[k] for k in ("total", "rows")}


@needs_dot
def test_merged_graph_flame_and_peek(session: Path, tmp_path: Path) -> None:
    client = make_client(str(session))
    graph = client.get("/api/merged/graph?ids=3,7,11").json()
    assert graph["dot"] == cli_dot(tmp_path, *(dump_path(session, k) for k in (3, 7, 11)))
    peek = client.get("/api/merged/peek?ids=3,7,11&function=main").json()
    callees = {c["name"]: c["value"] for c in peek["callees"]}
    assert callees == {"leaky_insert": (34 + 66 + 98) * 1024, "load_table": 3 * 4096}
    flame = client.get("/api/merged/flame?ids=3,7,11").json()
    assert flame["sources"] == [Path(dump_path(session, k)).name[:-8] for k in (3, 7, 11)]
    assert sum(flame["tree"]["s"][1]) == (34 + 66 + 98) * 1024 + 3 * 4096
    src = client.get("/api/merged/source", params={
        "ids": "3,7,11", "file": str(session.parent / "src" / "app.c")}).json()
    assert src["values"]["5"]["flat_objects"] == 34 + 66 + 98


def test_merged_sets_are_checked(session: Path) -> None:
    client = make_client(str(session))
    assert client.get("/api/merged/top").status_code == 400
    assert client.get("/api/merged/top?ids=").status_code == 400
    assert client.get("/api/merged/top?ids=1,x").status_code == 400
    assert client.get("/api/merged/top?ids=1,99").status_code == 404
    assert client.get("/api/merged/sideways?ids=1,2").status_code == 404
    # The same dump twice is counted once.
    assert client.get("/api/merged/top?ids=11,11").json()["total"] == \
        client.get("/api/dump/11/top").json()["total"]


# ----------------------------------------------------------------------------- --own, --alloc-fn


def test_alloc_fn_per_view_is_heapscope_top_alloc_fn(session: Path) -> None:
    client = make_client(str(session))
    got = client.get("/api/dump/11/top?n=20&alloc_fn=leaky_insert").json()
    want = cli_json("top", dump_path(session, 11), "--format", "json", "-n", "20",
                    "--alloc-fn", "leaky_insert")
    assert {k: got[k] for k in want} == want
    assert got["rows"][0]["name"] == "main"  # the wrapper folded into its caller
    assert got["wrappers"] == [{"function": "leaky_insert", "why": "--alloc-fn"}]
    # Without it, the server's own policy again (a fold of its own, kept apart).
    assert client.get("/api/dump/11/top").json()["rows"][0]["name"] == "leaky_insert"
    both = client.get("/api/dump/11/top?alloc_fn=leaky_insert&alloc_fn=load_table").json()
    assert [r["name"] for r in both["rows"]] == ["main"]


def _library_dump(root: Path) -> Path:
    """One dump whose allocation goes through libxml2 (a dependency) from parse_config."""
    b = Builder()
    s = b.sample("je:malloc", "xml:xmlStrdup", "parse_config@/src/cfg.c:7", "main@/src/m.c:3",
                 values=(4, 4096, 4, 4096))
    path = root / "xml" / "jeprof.9.0.f.heap.json.gz"
    path.parent.mkdir()
    write(b.profile(s, pid=9, source=path.name), str(path))
    return path


def test_own_per_view_is_heapscope_top_own(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEAPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HEAPSCOPE_OWN", raising=False)
    dump = _library_dump(tmp_path)
    client = make_client(str(dump))
    default = client.get("/api/dump/0/top").json()
    assert default["rows"][0]["name"] == "parse_config"
    got = client.get("/api/dump/0/top?own=libxml2").json()
    want = cli_json("top", str(dump), "--format", "json", "--own", "libxml2")
    assert {k: got[k] for k in want} == want
    assert got["rows"][0]["name"] == "xmlStrdup"
    flame = client.get("/api/dump/0/flame?own=libxml2").json()
    kinds = dict(zip(flame["tree"]["n"], flame["tree"]["k"], strict=True))
    assert flame["kinds"][kinds[flame["strings"].index("xmlStrdup")]] == "own"


def test_frame_patterns_are_checked(session: Path) -> None:
    client = make_client(str(session))
    for q in ("own=(", "alloc_fn=[", "own=ok&own=*"):
        r = client.get(f"/api/dump/11/top?{q}")
        assert r.status_code == 400, q
        error = r.json()["error"]
        assert "\n" not in error and error.startswith(q.split("=")[0]), error
    assert client.get("/api/session/0/leaks?own=(").status_code == 400
    doc = client.get("/api/inputs").json()
    assert doc["frames"] == {"own": [], "alloc_fn": []}


def test_leaks_follow_alloc_fn(session: Path) -> None:
    client = make_client(str(session))
    got = client.get("/api/session/0/leaks?alloc_fn=leaky_insert").json()
    want = cli_json("leaks", str(session), "--format", "json", "--alloc-fn", "leaky_insert")
    assert {k: got[k] for k in want} == want
    assert "leaky_insert" not in {s["function"] for s in got["suspects"]}
