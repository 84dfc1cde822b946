"""Text from dumps, binaries and paths, escaped for each place heapscope writes it.

One group per helper, with expected outputs written out by hand, then for each destination the
real output written from a profile whose function names, file names, module path and dump path
are hostile: escape sequences, control characters, direction overrides, line separators, an
undecodable byte, markup, DOT syntax and quoting characters.

- terminal: :func:`heapscope.terminal.clean` (reports, diagnostics, errors, progress, agent log)
- collapsed stacks: :func:`heapscope.render.collapsed.clean_name`; callgrind lines
- DOT: :func:`heapscope.render.callgraph.escape` and ``escape_tooltip`` (real ``dot``)
- JSON: :func:`heapscope.safetext.json_text` (top, leaks, attach, report.json, export)
- HTML and SVG: :func:`heapscope.web.markup` and :func:`heapscope.web.script_json`
- Prometheus: :func:`heapscope.agent.metrics.label_value` (``promtool check metrics``)
- pprof: :func:`heapscope.safetext.valid` on the string table (``go tool pprof -raw``)
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from heapscope.agent.metrics import AgentCollector, label_value
from heapscope.agent.targets import Target
from heapscope.agent.watch import Watched
from heapscope.analysis.graph import GraphOptions, build_graph
from heapscope.analysis.leaks import Finding, LeakReport, ProcessFinding
from heapscope.analysis.top import View, build_table
from heapscope.analysis.tree import build_tree
from heapscope.capture import attach as capture_attach
from heapscope.capture import session as sess
from heapscope.cli import export
from heapscope.formats.proto import profile_pb2
from heapscope.model import Frame, Location, Mapping, Profile, Sample
from heapscope.render.callgraph import escape, escape_tooltip, write_graph
from heapscope.render.callgrind import render_callgrind
from heapscope.render.collapsed import clean_name
from heapscope.render.flamegraph import default_title, write_flamegraph
from heapscope.render.json import render_json, table_dict
from heapscope.render.pprof import render_pprof
from heapscope.render.text import render_table
from heapscope.render.timeline import Line, Timeline, render_html, render_svg
from heapscope.safetext import json_ready, json_text, valid
from heapscope.terminal import clean
from heapscope.web import markup, script_json

# (as the binary or dump has it, as a terminal/graph/page shows it, as JSON and pprof hold it)
NAMES = (
    ("\x1b[2J", "\\x1b[2J", "\x1b[2J"),
    ("\x1b]52;c;aGk=\x07", "\\x1b]52;c;aGk=\\x07", "\x1b]52;c;aGk=\x07"),
    ("bel\x07bs\x08cr\rnul\x00end", "bel\\x07bs\\x08cr\\x0dnul\\x00end",
     "bel\x07bs\x08cr\rnul\x00end"),
    ("abc\u202etxt.exe", "abc\\u202etxt.exe", "abc\u202etxt.exe"),
    ("ls\u2028ps\u2029", "ls\\u2028ps\\u2029", "ls\u2028ps\u2029"),
    ("lib\udcff.so", "lib\\xff.so", "lib\\xff.so"),
    ("</script><script>alert(1)</script>", "</script><script>alert(1)</script>",
     "</script><script>alert(1)</script>"),
    ("<!--", "<!--", "<!--"),
    ('q"uote\\back', 'q"uote\\back', 'q"uote\\back'),
    ("one\ntwo", "one\\x0atwo", "one\ntwo"),
    ("\\l\\N\\G", "\\l\\N\\G", "\\l\\N\\G"),
    ("{a}|<b>", "{a}|<b>", "{a}|<b>"),
    ("&amp;&#27;", "&amp;&#27;", "&amp;&#27;"),
    ("c1\x85\x9b", "c1\\x85\\x9b", "c1\x85\x9b"),
    ("nonchar\uffff", "nonchar\\uffff", "nonchar\uffff"),
)
MODULE_PATH = "/opt/\x1b]0;owned\x07\u202eapp\udcfe"
MODULE_SHOWN = "\\x1b]0;owned\\x07\\u202eapp\\xfe"  # the base name, as shown
MODULE_PATH_DATA = "/opt/\x1b]0;owned\x07\u202eapp\\xfe"
DUMP = "/data/jeprof.\x1b[1m\u202e\udcfd.heap"
DUMP_SHOWN = "jeprof.\\x1b[1m\\u202e\\xfd.heap"  # the base name, as shown
# Characters that must never reach a terminal, a graph or a page as they are.
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                 "\u2066-\u2069\ufffe\uffff\ud800-\udfff]")
ALL = GraphOptions(nodecount=0, nodefraction=0.0, edgefraction=0.0)
SVG = "{http://www.w3.org/2000/svg}"
XLINK = "{http://www.w3.org/1999/xlink}"


def hostile_profile() -> Profile:
    """One sample per hostile name (``name`` in ``name.c``), called from main, in a module at
    a hostile path; plus one unsymbolized frame, named after the module."""
    exe = Mapping(0x400000, 0x500000, 0, MODULE_PATH, "r-xp")
    main = Location(0x400100, exe, exe.name, 0x100, (Frame("main", "main.c", 1),))
    locs = {main.address: main}
    samples = []
    for k, (raw, _, _) in enumerate(NAMES):
        a = 0x401000 + 0x40 * k
        locs[a] = Location(a, exe, exe.name, a - exe.start, (Frame(raw, raw + ".c", k + 1),))
        n = float(k + 1)
        samples.append(Sample((a, main.address), (n, 1000.0 * n, n, 1000.0 * n)))
    bare = Location(0x402000, exe, exe.name, 0x2000)
    locs[bare.address] = bare
    samples.append(Sample((bare.address, main.address), (1.0, 50.0, 1.0, 50.0)))
    return Profile(tuple(samples), (exe,), period=1, sampling="none", unsampled=True,
                   locations=MappingProxyType(locs), pid=7, source=DUMP)


def hostile_report() -> LeakReport:
    """A leak report naming every hostile function, file and the module's path."""
    proc = ProcessFinding(7, exe=MODULE_PATH, cmdline=[MODULE_PATH, NAMES[0][0]], dumps=3,
                          judged=3, live_bytes=1000.0, unreadable="")
    findings = [Finding(7, raw, raw + ".c", k + 1, "app", (raw, "main"), 1000.0 * (k + 1),
                        k + 1.0, "leak") for k, (raw, _, _) in enumerate(NAMES)]
    return LeakReport([proc], findings, notes=[f"note on {NAMES[1][0]}"])


def strings_in(doc: Any) -> list[str]:
    """Every string of a loaded JSON document, keys included."""
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [*doc.keys(), *(s for v in doc.values() for s in strings_in(v))]
    if isinstance(doc, list):
        return [s for v in doc for s in strings_in(v)]
    return []


# ============================================================================================
# The helpers, against outputs written by hand


def test_valid_writes_lone_surrogates_as_visible_escapes() -> None:
    assert valid("lib\udcff.so") == "lib\\xff.so"  # surrogateescape's byte 0xff
    assert valid("\udc80") == "\\x80"
    assert valid("\ud800x") == "\\ud800x"  # a lone high surrogate: not from a byte
    assert valid("\udc41") == "\\udc41"  # below U+DC80: not surrogateescape's either
    assert valid("\ud83d\ude00") == "\\ud83d\\ude00"  # a pair of lone code points stays two
    assert valid("\x1b\u202e\U0001f600é") == "\x1b\u202e\U0001f600é"  # everything else exact
    assert valid("plain") == "plain"


def test_json_text() -> None:
    assert json_text(["lib\udcff.so", "a\\\udcfe", "\U0001f600", "\x1b\u202e"]) == \
        '["lib\\\\xff.so", "a\\\\\\\\xfe", "\\ud83d\\ude00", "\\u001b\\u202e"]'
    # A name's own backslash before "udcff" is text, not an escape to rewrite.
    assert json_text("a\\udcff") == '"a\\\\udcff"'
    assert json_text({"k\udc80": "\ud800"}, separators=(",", ":")) == \
        '{"k\\\\x80":"\\\\ud800"}'
    assert json_text({"a": [1, 2.5]}, indent=1) == '{\n "a": [\n  1,\n  2.5\n ]\n}'


def test_json_ready_reaches_every_string() -> None:
    doc = {"k\udcff": ["a\udcfe", ("t\udc80",), 1, None, 2.5, True, {"x": "\x1b\u202e"}]}
    assert json_ready(doc) == {"k\\xff": ["a\\xfe", ["t\\x80"], 1, None, 2.5, True,
                                          {"x": "\x1b\u202e"}]}
    assert json_ready(3) == 3 and json_ready("ok") == "ok"


def test_clean() -> None:
    for raw, shown, _ in NAMES:
        assert clean(raw) == shown, raw
    assert clean("\u061c\u200e\u200f\u2066\u2069") == "\\u061c\\u200e\\u200f\\u2066\\u2069"
    assert clean("\t\x7f") == "\\x09\\x7f"
    assert clean("é ü 東京 \U0001f600") == "é ü 東京 \U0001f600"  # text stays text


def test_clean_name_for_collapsed_stacks() -> None:
    assert clean_name("a;b\udcff") == "a:b\\xff"
    assert clean_name("\x1b]52;c;aGk=\x07") == "\\x1b]52:c:aGk=\\x07"
    assert clean_name("one\ntwo\rthree") == "one two three"


def test_dot_escape() -> None:
    assert escape('q"uote\\back') == 'q\\"uote\\\\back'
    assert escape("\x1b[2J") == "\\\\x1b[2J"
    assert escape("{a}|<b>") == "\\{a\\}\\|\\<b\\>"
    assert escape("&amp;&#27;") == "&amp;amp;&amp;#27;"
    assert escape("one\ntwo") == "one\\\\x0atwo"  # a name never breaks its label's line
    assert escape("abc\u202etxt") == "abc\\\\u202etxt"
    assert escape("lib\udcff.so") == "lib\\\\xff.so"
    assert escape("\\l\\N") == "\\\\l\\\\N"


def test_dot_escape_tooltip() -> None:
    # Graphviz reads a tooltip's backslashes twice: one shown backslash is four in DOT.
    assert escape_tooltip('q"uote\\back') == 'q\\"uote\\\\\\\\back'
    assert escape_tooltip("\x1b") == "\\\\\\\\x1b"
    assert escape_tooltip("\\N") == "\\\\\\\\N"
    assert escape_tooltip("a&b<c>") == "a&amp;b\\<c\\>"


def test_markup() -> None:
    assert markup("</script><script>alert(1)</script>") == \
        "&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;"
    assert markup("q\"uote's & co") == "q&quot;uote&#x27;s &amp; co"
    assert markup("\x1b[2J\u202e") == "\\x1b[2J\\u202e"
    assert markup("<!--") == "&lt;!--"
    assert markup("lib\udcff\uffff") == "lib\\xff\\uffff"


def test_script_json() -> None:
    assert script_json({"s": "</script><!--\u2028&"}) == \
        '{"s":"\\u003c/script\\u003e\\u003c!--\\u2028\\u0026"}'
    assert script_json(["\x1b\udcff"]) == '["\\u001b\\\\xff"]'


def test_prometheus_label_value() -> None:
    assert label_value("\x1b[2J") == "\\x1b[2J"
    assert label_value('a"b\\c\nd') == 'a"b\\c\\x0ad'  # the client escapes \\ and "
    assert label_value("lib\udcff") == "lib\\xff"
    assert label_value("std::vector<int>::push_back") == "std::vector<int>::push_back"


# ============================================================================================
# Terminal


def test_top_table_is_printable(capsys: pytest.CaptureFixture[str]) -> None:
    table, rows = build_table([hostile_profile()], View(nodecount=0))
    out = io.StringIO()
    render_table(out, table, rows)
    text = out.getvalue()
    text.encode("utf-8")  # a lone surrogate would not even print
    assert not RAW.search(text), repr(text)
    for _, shown, _ in NAMES:
        assert f" {shown}\n" in text, shown
    assert f" {MODULE_SHOWN}+0x2000\n" in text


def test_run_report_and_commands_show_escapes() -> None:
    from heapscope.capture.launch import RunResult
    from heapscope.capture.runner import SessionResult
    from heapscope.render.report import render_report

    result = RunResult(pid=7, returncode=0, start=0.0, end=1.0, watcher=None)  # type: ignore[arg-type]
    res = SessionResult("/tmp/s\x1b[2J", [MODULE_PATH, "--x"], result, hostile_report(), [],
                        [f"pid 8 ({NAMES[3][0]}) left no dump"], [])
    out = io.StringIO()
    render_report(out, res)
    text = out.getvalue()
    assert not RAW.search(text), repr(text)
    assert f"note: pid 8 ({NAMES[3][1]}) left no dump" in text
    assert "session: /tmp/s\\x1b[2J" in text
    assert "heapscope flamegraph '/tmp/s\\x1b[2J'" in text


def test_errors_name_paths_with_escapes(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from heapscope.cli.main import main

    missing = str(tmp_path / "jeprof.\x1b]0;owned\x07\u202e\udcff.heap")
    assert main(["top", missing, "--no-cache"]) != 0
    err = capsys.readouterr().err
    assert not RAW.search(err), repr(err)
    assert "jeprof.\\x1b]0;owned\\x07\\u202e\\xff.heap" in err, err


def test_top_names_each_dump_with_escapes(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from heapscope.cli.main import main
    from heapscope.formats import symbolized

    paths = []
    for k in range(2):
        path = str(tmp_path / f"jeprof.{k}.\x1b[2J\u202e.heap{symbolized.SUFFIX}")
        symbolized.write(hostile_profile().with_(source=path), path)
        paths.append(path)
    assert main(["top", *paths, "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out), repr(out)
    assert f"==> {tmp_path}/jeprof.0.\\x1b[2J\\u202e.heap{symbolized.SUFFIX}" in out, out


def test_attach_status_shows_the_targets_words_escaped(
        capsys: pytest.CaptureFixture[str]) -> None:
    from heapscope.cli import attach

    st = {"pid": 7, "cmdline": [MODULE_PATH, NAMES[1][0]], "exe": MODULE_PATH,
          "version": "5.3.0\x1b[2J", "symbol": "mallctl", "config_prof": True,
          "opt_prof": True, "prof_active": True, "sample_bytes": 524288, "lg_sample": 19,
          "prof_prefix": "/tmp/\x1b]0;x\x07p", "stats": {"allocated": 1024},
          "attach": {"mode": "helper", "stopped_s": 0.0, "retries": 0}}
    ctl = SimpleNamespace(status=lambda: st)
    assert attach._status(ctl, argparse.Namespace(format="text")) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert not RAW.search(out), repr(out)
    assert "jemalloc   5.3.0\\x1b[2J" in out and "prefix /tmp/\\x1b]0;x\\x07p" in out


def test_agent_log_lines_and_progress_are_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from heapscope.agent.targets import Selection
    from heapscope.agent.watch import Agent, AgentOptions
    from heapscope.progress import DelayedProgress

    agent = Agent(Selection([], [], []), AgentOptions(str(tmp_path / "state")))
    agent.say(f"left out {DUMP}: not a dump")
    err = capsys.readouterr().err
    assert err == "heapscope agent: left out /data/" + DUMP_SHOWN + ": not a dump\n"
    bar = DelayedProgress(enabled=True)
    bar.update(f"symbolizing {MODULE_PATH}", 0, 1)
    assert bar._state[0] == "symbolizing /opt/" + MODULE_SHOWN


def test_shell_echoes_patterns_escaped() -> None:
    from heapscope.cli.shell import Shell

    out = io.StringIO()
    Shell([hostile_profile()], View(), stdin=io.StringIO(), stdout=out).execute(
        "focus \x1b[2Jx")
    assert out.getvalue() == "focus: \\x1b[2Jx\n"


# ============================================================================================
# Collapsed stacks and callgrind


def _export_args() -> argparse.Namespace:
    return argparse.Namespace(sample="inuse_space", thread_labels=False, sysroot=None,
                              binary=[])


def test_collapsed_export_is_one_valid_line_per_stack() -> None:
    data = export.render("collapsed", [hostile_profile()], _export_args())
    text = data.decode("utf-8")  # strict: no undecodable byte written back
    assert not RAW.search(text), repr(text)
    lines = text.splitlines()
    assert len(lines) == len(NAMES) + 1
    assert all(re.fullmatch(r"main;[^;\s]*(?: [^;\s]*)* \d+", line) for line in lines), lines
    assert "main;\\x1b]52:c:aGk=\\x07 2000" in lines
    assert "main;lib\\xff.so 6000" in lines


def test_callgrind_lines_stay_records() -> None:
    out = io.StringIO()
    render_callgrind(out, [hostile_profile()], 1, "inuse_space", cmd=DUMP)
    text = out.getvalue()
    assert not RAW.search(text), repr(text)
    record = re.compile(r"(#.*|[a-z]+: .*|(c?(ob|fl|fn))=\(\d+\)( .*)?|calls=\d+ \d+|\d+ \d+|)")
    bad = [line for line in text.split("\n") if not record.fullmatch(line)]
    assert not bad, bad
    assert "cmd: /data/" + DUMP_SHOWN in text
    assert f"fl=(2) {NAMES[0][1]}.c" in text or f" {NAMES[0][1]}.c\n" in text


# ============================================================================================
# DOT and the SVG graphviz draws


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot not installed")
def test_dot_file_is_accepted_and_its_labels_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "graph.dot"
    write_graph(build_graph([hostile_profile()], ALL), str(path), "dot")
    svg = subprocess.run(["dot", "-Tsvg", str(path)], capture_output=True, check=True,
                         timeout=60).stdout
    assert not RAW.search(svg.decode("utf-8")), svg
    root = ET.fromstring(svg)  # well-formed XML: no entity turned into a raw ESC
    texts = [t.text for t in root.iter(f"{SVG}text")]
    tips = [a.get(f"{XLINK}title") or "" for a in root.iter(f"{SVG}a")]
    assert f"heapscope: {DUMP_SHOWN}" in texts
    for _, shown, _ in NAMES:
        assert shown in texts, (shown, texts)
        head = f"{shown} [{MODULE_SHOWN}] ({shown}.c)\nflat "
        assert any(t.startswith(head) for t in tips), (head, tips)
        assert f"main -> {shown} (" in " ".join(tips)
    assert f"{MODULE_SHOWN}+0x2000" in texts
    assert not [el for el in root.iter() if el.tag.rsplit("}", 1)[-1] in ("script", "img")]


# ============================================================================================
# JSON


def _strict_json(text: str) -> Any:
    """A document as a strict reader sees it: ASCII text (so valid UTF-8, no raw control
    character), and no string holding a lone surrogate."""
    assert text.isascii(), repr(text)
    doc = json.loads(text)
    assert not [s for s in strings_in(doc) if re.search("[\ud800-\udfff]", s)]
    return doc


def test_profile_json_export_keeps_names_exact_and_valid() -> None:
    doc = _strict_json(export.render("json", [hostile_profile()], _export_args()).decode())
    functions = [f["function"] for loc in doc["locations"] for f in loc["frames"]]
    files = [f["file"] for loc in doc["locations"] for f in loc["frames"]]
    for _, _, data in NAMES:
        assert data in functions and data + ".c" in files
    assert doc["mappings"][0]["path"] == MODULE_PATH_DATA
    assert doc["meta"]["sources"] == ["/data/jeprof.\x1b[1m\u202e\\xfd.heap"]


def test_top_and_leaks_json_keep_names_exact_and_valid() -> None:
    table, rows = build_table([hostile_profile()], View(nodecount=0))
    out = io.StringIO()
    render_json(out, table_dict(table, rows))
    doc = _strict_json(out.getvalue())
    assert {r["name"] for r in doc["rows"]} >= {data for _, _, data in NAMES}
    out = io.StringIO()
    render_json(out, hostile_report().as_dict())
    doc = _strict_json(out.getvalue())
    assert [s["function"] for s in doc["suspects"]] == [data for _, _, data in NAMES]
    assert doc["processes"][0]["exe"] == MODULE_PATH_DATA


def test_report_json_of_an_attach_session(tmp_path: Path) -> None:
    capture_attach.write_report(str(tmp_path), os.getpid(), hostile_report(), "dump",
                                capture_attach.AttachLog(), {"session": str(tmp_path)})
    doc = _strict_json((tmp_path / "report.json").read_text(encoding="utf-8"))
    assert [s["file"] for s in doc["suspects"]] == [data + ".c" for _, _, data in NAMES]


def test_manifest_keeps_undecodable_bytes_for_heapscope(tmp_path: Path) -> None:
    """The manifest is read back by heapscope, which opens the paths in it: its lone
    surrogates stay exact (as ``\\udcNN`` escapes in ASCII), never ``\\xNN`` text."""
    path = tmp_path / sess.MANIFEST
    sess.write_json(str(path), {"command": [MODULE_PATH, NAMES[2][0]]})
    text = path.read_text(encoding="utf-8")
    assert text.isascii() and "\\udcfe" in text
    assert json.loads(text) == {"command": [MODULE_PATH, NAMES[2][0]]}


# ============================================================================================
# HTML pages and SVG


class _Page(HTMLParser):
    """Every element of a page, and the text of each script and each title."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.scripts: list[dict[str, str | None]] = []
        self.script_text: list[str] = []
        self.titles: list[str] = []
        self.attr_values: list[str] = []
        self.outside: list[str] = []  # text that is not a script's
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attr_values.extend(v for _, v in attrs if v)
        if tag == "script":
            self.scripts.append(dict(attrs))
            self.script_text.append("")
        if tag == "title":
            self.titles.append("")
        self._in.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._in:
            del self._in[len(self._in) - 1 - self._in[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        where = self._in[-1] if self._in else ""
        if where == "script":
            self.script_text[-1] += data
        else:
            self.outside.append(data)
        if where == "title":
            self.titles[-1] += data

    def handle_comment(self, data: str) -> None:
        self.tags.append("!--")


FLAME_TAGS = {"html", "head", "meta", "link", "title", "style", "body", "header", "h1", "div",
              "label", "select", "input", "button", "span", "main", "canvas", "footer",
              "noscript", "script"}


def test_flame_graph_page(tmp_path: Path) -> None:
    out = tmp_path / "flame.html"
    title = default_title([DUMP])
    write_flamegraph(str(out), build_tree([hostile_profile()]), title=title, sources=[DUMP])
    text = out.read_bytes().decode("utf-8")  # strict
    assert not RAW.search(text), repr(text)
    page = _Page()
    page.feed(text)
    page.close()
    assert set(page.tags) <= FLAME_TAGS, set(page.tags) - FLAME_TAGS
    assert [s.get("type") for s in page.scripts] == ["application/json", None]
    assert page.scripts[0]["id"] == "heapscope-data" and page.scripts[1].get("nonce")
    assert page.titles == [f"heapscope flame graph: {DUMP_SHOWN}"]
    data = json.loads(page.script_text[0])
    assert data["title"] == DUMP_SHOWN
    assert data["sources"] == ["/data/" + DUMP_SHOWN]
    for _, shown, _ in NAMES:
        assert shown in data["strings"] and shown + ".c" in data["strings"]
    assert MODULE_SHOWN in data["strings"]
    # Names are data only: in no other text and no attribute of the page.
    elsewhere = "\n".join(page.outside + page.attr_values)
    for _, shown, _ in NAMES:
        assert shown not in elsewhere, shown


def test_viewer_scripts_never_parse_names_as_markup() -> None:
    """The page's own JavaScript shows names through textContent or canvas text only."""
    from importlib import resources

    assets = resources.files("heapscope.web").joinpath("assets")
    scripts = [a for a in assets.iterdir() if a.name.endswith(".js")]
    assert scripts
    sinks = re.compile(r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\s*\(|"
                       r"new\s+Function|setAttribute\(\s*['\"]on|srcdoc")
    for js in scripts:
        found = sinks.findall(js.read_text(encoding="utf-8"))
        assert not found, (js.name, found)


def _timeline() -> Timeline:
    lines = [Line(f"heap {raw}", "heap", 7, [(0.0, 100.0), (1.0, 200.0)], detail=raw + ".c")
             for raw, _, _ in NAMES]
    findings = hostile_report().findings
    return Timeline(f"{DUMP}: {MODULE_PATH} --serve", lines, findings, [NAMES[4][0]])


def test_timeline_svg_is_xml_and_shows_escapes() -> None:
    svg = render_svg(_timeline())
    assert not RAW.search(svg), repr(svg)
    root = ET.fromstring(svg)  # a raw ESC or U+FFFF would make it no XML at all
    titles = [t.text or "" for t in root.iter(f"{SVG}title")]
    for _, shown, _ in NAMES:
        assert f"heap {shown} {shown}.c" in titles, shown
        assert any(t.startswith(f"heap {shown}\nt = 1.00 s\n") for t in titles), shown


def test_timeline_page() -> None:
    text = render_html(_timeline())
    text.encode("utf-8")
    assert not RAW.search(text), repr(text)
    page = _Page()
    page.feed(text)
    page.close()
    assert page.scripts == [] and "!--" not in page.tags
    assert page.titles[0] == f"heapscope timeline: /data/{DUMP_SHOWN}: /opt/{MODULE_SHOWN} --serve"
    for _, shown, _ in NAMES:
        assert shown in page.outside, shown  # the function column of the suspects' table
    assert NAMES[4][1] in page.outside  # the note


# ============================================================================================
# Prometheus exposition


_SAMPLE = re.compile(
    r'(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(?:\{(?P<labels>[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*")*)?\})? '
    r'(?P<value>[-+]?(?:[0-9.]+(?:e[-+]?[0-9]+)?|Inf|NaN))')


def strict_exposition_problems(text: str) -> list[str]:
    """Lines of a text exposition a strict reader refuses: a sample line must be a metric
    name, optional labels with valid names and escaped values, and a number."""
    bad = []
    for line in text.split("\n")[:-1]:
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            ok = re.fullmatch(r"# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*", line)
        else:
            ok = _SAMPLE.fullmatch(line)
        if not ok or RAW.search(line):
            bad.append(line)
    return bad


def _exposition() -> str:
    findings = [Finding(7, raw, raw + ".c", k + 1, "app", (raw,), 100.0, 1.0, "leak")
                for k, (raw, _, _) in enumerate(NAMES)]
    target = Target(pid=7, start=1, service="svc\x1b[2J\u202e\udcff")
    w = Watched(target, "state", report=LeakReport([ProcessFinding(7)], findings))
    agent = SimpleNamespace(watched={"k": w}, pushers=[])
    reg = CollectorRegistry()
    reg.register(AgentCollector(agent, lambda: len(NAMES)))  # type: ignore[arg-type]
    return generate_latest(reg).decode("utf-8")  # a lone surrogate made this raise


def test_prometheus_exposition_parses_strictly() -> None:
    text = _exposition()
    assert strict_exposition_problems(text) == []
    sites = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "heapscope_site_live_bytes":
                sites[s.labels["function"]] = s.labels
    assert set(sites) == {shown for _, shown, _ in NAMES}
    for _, shown, _ in NAMES:
        assert sites[shown]["file"] == shown + ".c"
        assert sites[shown]["service"] == "svc\\x1b[2J\\u202e\\xff"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_prometheus_exposition_passes_promtool() -> None:
    p = subprocess.run(["promtool", "check", "metrics"], input=_exposition().encode(),
                       capture_output=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


# ============================================================================================
# pprof


def test_pprof_strings_are_utf8_and_exact() -> None:
    data = render_pprof([hostile_profile()])
    prof = profile_pb2.Profile.FromString(gzip.decompress(data))
    strings = [s.decode("utf-8") for s in prof.string_table]  # strict
    for _, _, exact in NAMES:
        assert exact in strings and exact + ".c" in strings
    assert MODULE_PATH_DATA in strings


@pytest.mark.skipif(shutil.which("go") is None, reason="go not installed")
def test_go_tool_pprof_reads_the_export(tmp_path: Path) -> None:
    path = tmp_path / "hostile.pb.gz"
    path.write_bytes(render_pprof([hostile_profile()]))
    env = {**os.environ, "HOME": str(tmp_path), "GOCACHE": str(tmp_path / "gocache"),
           "PPROF_TMPDIR": str(tmp_path)}
    p = subprocess.run(["go", "tool", "pprof", "-raw", "-symbolize=none", str(path)],
                       capture_output=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode("utf-8")  # strict: every name is UTF-8
    assert "lib\\xff.so" in out and "</script><script>alert(1)</script>" in out
