"""``heapscope serve``'s endpoints through Starlette's TestClient, against the commands.

A session is written by hand: a manifest and self-contained (symbolized) dumps of one
process built from names, twelve dumps one minute apart in which ``leaky_insert`` gains
objects at every dump and ``load_table`` stays put, plus the program's source file. Every
number the viewer shows must be the one ``heapscope top --format json``, ``heapscope leaks
--format json`` and ``heapscope diff --format json`` print for the same input: one path from
dump to view.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
try:  # starlette's TestClient runs on httpx2 (dev extras), or on httpx before starlette 1.10
    import httpx2  # noqa: F401
except ImportError:
    pytest.importorskip("httpx", reason="starlette's TestClient needs httpx2 (dev extras)")

from starlette.testclient import TestClient

from heapscope.analysis.fold import FramePolicy
from heapscope.cli.main import parser
from heapscope.formats.symbolized import write
from heapscope.serve.app import cookie_name, create_app
from heapscope.serve.catalog import Catalog
from heapscope.serve.views import Settings, Workbench
from heapscope.symbols import SymbolOptions
from tests.unit.builders import Builder

PID = 4242
TOKEN = "test-token"
SOURCE = """#include <stdlib.h>
/* app.c: the test session's program */
void *table;
void load_table(void) { table = malloc(4096); }
void leaky_insert(void) { malloc(1024); }
int main(void) { load_table(); for (;;) leaky_insert(); }
"""


def _session(root: Path, dumps: int = 12) -> Path:
    """A session of one process: the table allocated once, a leak growing every dump."""
    session = root / "session"
    (session / "symbolized").mkdir(parents=True)
    (session / "dumps").mkdir()
    src = root / "src" / "app.c"
    src.parent.mkdir()
    src.write_text(SOURCE)
    (session / "manifest.json").write_text(json.dumps({
        "command": ["./app"], "pid": PID, "start_time": 1_800_000_000.0,
        "end_time": 1_800_001_000.0,
        "processes": [{"pid": PID, "ppid": 1, "exe": "/srv/app", "cmdline": ["./app"]}]}))
    for k in range(dumps):
        write_dump(session, k, dumps)
    return session


def write_dump(session: Path, k: int, total: int, folder: str = "symbolized") -> Path:
    """Dump ``k`` of the series (the last one is the final dump)."""
    b = Builder()
    leak = 10 + 8 * k  # objects
    table = b.sample("je:malloc", f"load_table@{session.parent}/src/app.c:4",
                     f"main@{session.parent}/src/app.c:6", values=(1, 4096, 1, 4096))
    grow = b.sample("je:malloc", f"leaky_insert@{session.parent}/src/app.c:5",
                    f"main@{session.parent}/src/app.c:6",
                    values=(leak, 1024 * leak, leak, 1024 * leak))
    kind = "f" if k == total - 1 else f"m{k}"
    name = f"jeprof.{PID}.{k}.{kind}.heap"
    profile = b.profile(table, grow, pid=PID, seq=k, kind=kind[0], source=name,
                        time=1_800_000_000.0 + 60 * k)
    path = session / folder / (name + ".json.gz")
    write(profile, str(path))
    os.utime(path, (1_800_000_000 + 60 * k, 1_800_000_000 + 60 * k))
    return path


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HEAPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HEAPSCOPE_OWN", raising=False)
    monkeypatch.delenv("HEAPSCOPE_ALLOC_FN", raising=False)
    return _session(tmp_path)


def make_client(*paths: str, source_paths: tuple[str, ...] = ()) -> TestClient:
    settings = Settings(SymbolOptions(cache_dir=None), FramePolicy.from_env(), source_paths)
    bench = Workbench(Catalog(list(paths)), settings)
    client = TestClient(create_app(bench, TOKEN))
    client.headers["X-Heapscope-Token"] = TOKEN
    return client


def cli_json(*argv: str) -> Any:
    """What ``heapscope ARGV`` prints, parsed."""
    args = parser(list(argv)).parse_args([*argv, "--no-cache"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        args.func(args)
    return json.loads(out.getvalue())


def dump_id(client: TestClient, name: str) -> int:
    for inp in client.get("/api/inputs").json()["inputs"]:
        for d in inp["dumps"]:
            if d["name"] == name:
                return int(d["id"])
    raise AssertionError(name)


def test_inputs_list_every_dump_by_number(session: Path) -> None:
    doc = make_client(str(session)).get("/api/inputs").json()
    (inp,) = doc["inputs"]
    assert inp["kind"] == "session" and inp["title"] == "session"
    assert [d["id"] for d in inp["dumps"]] == list(range(12))
    assert [d["kind"] for d in inp["dumps"]][-2:] == ["m10", "f"]
    assert all(d["pid"] == PID and d["symbolized"] for d in inp["dumps"])


@pytest.mark.parametrize("query", [
    "", "&granularity=lines", "&cum=1", "&sample=inuse_objects", "&focus=leaky",
    "&ignore=leaky", "&granularity=files&sample=alloc_space"])
def test_top_is_heapscope_top(session: Path, query: str) -> None:
    client = make_client(str(session))
    last = session / "symbolized" / f"jeprof.{PID}.11.f.heap.json.gz"
    got = client.get(f"/api/dump/{dump_id(client, last.name[:-8])}/top?n=20{query}").json()
    argv = ["top", str(last), "--format", "json", "-n", "20"]
    options = dict(x.split("=") for x in query.split("&") if x)
    if "granularity" in options:
        argv.append("--" + options["granularity"])
    if "sample" in options:
        argv.append("--" + options["sample"].replace("_", "-"))
    if "cum" in options:
        argv.append("--cum")
    for key in ("focus", "ignore"):
        if key in options:
            argv += [f"--{key}", options[key]]
    want = cli_json(*argv)
    assert {k: got[k] for k in want} == want
    assert got["rows"], got


def test_leaks_is_heapscope_leaks(session: Path) -> None:
    got = make_client(str(session)).get("/api/session/0/leaks").json()
    want = cli_json("leaks", str(session), "--format", "json")
    assert {k: got[k] for k in want} == want
    leak = next(s for s in got["suspects"] if s["function"] == "leaky_insert")
    assert leak["verdict"] == "leak"
    words = got["evidence"][got["suspects"].index(leak)]
    assert "dumps" in words and "drift z" in words, words
    assert got["titles"] == {str(PID): "app"}
    assert got["dumps"] == {str(PID): list(range(12))}


def test_diff_is_heapscope_diff(session: Path) -> None:
    client = make_client(str(session))
    first = session / "symbolized" / f"jeprof.{PID}.0.m0.heap.json.gz"
    last = session / "symbolized" / f"jeprof.{PID}.11.f.heap.json.gz"
    got = client.get("/api/diff?a=0&b=11&n=20").json()
    want = cli_json("diff", str(first), str(last), "--format", "json", "-n", "20")
    for key in ("sample_type", "unit", "total", "rows"):
        assert got[key] == want[key], key
    assert got["diff"] is True
    assert got["rows"][0]["name"] == "leaky_insert" and got["rows"][0]["flat"] == 88 * 1024
    # The same through the dump's own endpoint with a base.
    assert client.get("/api/dump/11/top?n=20&base=0").json()["rows"] == got["rows"]


def test_flame_is_the_flame_graph_data(session: Path) -> None:
    client = make_client(str(session))
    doc = client.get("/api/dump/11/flame").json()
    assert doc["format"] == "heapscope-flamegraph" and not doc["diff"]
    names = set(doc["strings"])
    assert {"main", "leaky_insert", "load_table"} <= names
    kept = client.get("/api/dump/11/flame?focus=load_table").json()
    assert "leaky_insert" not in kept["strings"]
    diff = client.get("/api/dump/11/flame?base=0").json()
    assert diff["diff"] and "sb" in diff["tree"]


def test_peek_callers_and_callees(session: Path) -> None:
    client = make_client(str(session))
    doc = client.get("/api/dump/11/peek?function=main").json()
    callees = {c["name"]: c["value"] for c in doc["callees"]}
    assert callees["leaky_insert"] == 98 * 1024 and callees["load_table"] == 4096
    assert doc["cum"] == doc["total"] == 98 * 1024 + 4096
    leaf = client.get("/api/dump/11/peek?function=leaky_insert").json()
    assert [c["name"] for c in leaf["callers"]] == ["main"]
    assert leaf["files"] == [str(session.parent / "src" / "app.c")]


def test_source_marks_the_lines_of_the_profile(session: Path) -> None:
    client = make_client(str(session))
    file = str(session.parent / "src" / "app.c")
    doc = client.get("/api/dump/11/source", params={"file": file}).json()
    assert doc["found"] and doc["lines"][4].startswith("void leaky_insert")
    assert doc["values"]["5"]["flat"] == 98 * 1024
    assert doc["values"]["5"]["flat_objects"] == 98
    assert doc["values"]["6"]["cum"] == 98 * 1024 + 4096 and doc["values"]["6"]["flat"] == 0


def test_source_elsewhere_and_missing(session: Path, tmp_path: Path) -> None:
    file = str(session.parent / "src" / "app.c")
    moved = tmp_path / "checkout" / "src"
    moved.mkdir(parents=True)
    (moved / "app.c").write_text(SOURCE.replace("app.c:", "app.c (moved):"))
    os.unlink(file)
    gone = make_client(str(session)).get("/api/dump/11/source", params={"file": file}).json()
    assert not gone["found"] and "not on this machine" in gone["message"]
    assert gone["values"]["5"]["flat"] == 98 * 1024  # the numbers, without the text
    found = make_client(str(session), source_paths=(str(tmp_path / "checkout"),)).get(
        "/api/dump/11/source", params={"file": file}).json()
    assert found["found"] and found["path"] == str(moved / "app.c")
    assert "(moved)" in found["lines"][1]


def test_no_path_from_a_request_is_opened(session: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("do not show")
    client = make_client(str(session))
    for name in (str(secret), "/etc/passwd", "../../secret.txt", "app.c"):
        r = client.get("/api/dump/11/source", params={"file": name})
        assert r.status_code == 404, (name, r.text)
        assert "do not show" not in r.text
    for url in ("/api/dump/99/top", "/api/dump/-1/top", "/api/dump/..%2Fsecret.txt/top",
                "/api/session/5/leaks", "/api/diff?a=0&b=12"):
        assert client.get(url).status_code == 404, url
    assert client.get("/api/dump/abc/top").status_code == 400
    assert client.get("/api/dump/11/top?focus=(").status_code == 400


def test_the_source_view_reads_only_regular_files(session: Path) -> None:
    fifo = session.parent / "src" / "fifo.c"
    os.mkfifo(fifo)
    b = Builder()
    s = b.sample("je:malloc", f"waits@{fifo}:1", values=(1, 64, 1, 64))
    write(b.profile(s, pid=PID, seq=99, kind="m", source="x"),
          str(session / "symbolized" / f"jeprof.{PID}.99.m99.heap.json.gz"))
    client = make_client(str(session))
    doc = client.get(f"/api/dump/{dump_id(client, f'jeprof.{PID}.99.m99.heap')}/source",
                     params={"file": str(fifo)}).json()
    assert doc["found"] is False  # refused at once, never waited on


def test_token_is_required_everywhere(session: Path) -> None:
    client = make_client(str(session))
    del client.headers["X-Heapscope-Token"]
    for url in ("/", "/api/inputs", "/api/dump/0/top", "/api/session/0/leaks", "/nowhere"):
        r = client.get(url)
        assert r.status_code == 403, url
        assert "access-control-allow-origin" not in r.headers
    assert client.get("/api/inputs", headers={"X-Heapscope-Token": "wrong"}).status_code == 403
    assert client.get("/api/inputs?token=wrong").status_code == 403
    # The printed URL: its token is traded for a cookie, and the page then works without it.
    r = client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"
    assert cookie_name(TOKEN) in r.headers["set-cookie"]
    assert "httponly" in r.headers["set-cookie"].lower()
    assert "samesite=strict" in r.headers["set-cookie"].lower()
    page = client.get("/")
    assert page.status_code == 200 and "heapscope" in page.text
    assert client.get("/api/inputs").status_code == 200


def test_headers_forbid_what_the_page_does_not_need(session: Path) -> None:
    client = make_client(str(session))
    page = client.get("/", headers={"Origin": "http://evil.example"})
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp
    nonce = csp.split("'nonce-", 1)[1].split("'", 1)[0]
    assert page.text.count(f'nonce="{nonce}"') == 3  # the style and the two scripts
    assert "http://" not in page.text.replace("http://www.w3.org/2000/svg", "")
    assert "access-control-allow-origin" not in page.headers
    api = client.get("/api/inputs", headers={"Origin": "http://evil.example"})
    assert "access-control-allow-origin" not in api.headers
    assert api.headers["x-content-type-options"] == "nosniff"
    assert api.headers["cache-control"] == "no-store"
    assert client.options("/api/inputs").status_code in (405, 400)


def test_a_session_that_gains_dumps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEAPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    session = _session(tmp_path, dumps=8)
    client = make_client(str(session))
    before = client.get("/api/version").json()["version"]
    leaks = client.get("/api/session/0/leaks").json()
    assert leaks["processes"][0]["dumps"] == 8
    # A raw dump arrives (a running session), numbered next.
    raw = write_dump(session, 8, 12, folder="dumps")
    os.rename(raw, str(raw)[: -len(".json.gz")])
    monkeypatch.setattr("heapscope.serve.catalog.RESCAN_SECONDS", 0.0)
    after = client.get("/api/version").json()["version"]
    assert after > before
    doc = client.get("/api/inputs").json()
    assert [d["id"] for d in doc["inputs"][0]["dumps"]] == list(range(9))
    assert client.get("/api/session/0/leaks").json()["processes"][0]["dumps"] == 9
    timeline = client.get("/api/session/0/timeline").json()
    heap = next(line for line in timeline["lines"] if line["kind"] == "heap")
    assert [p[2] for p in heap["points"]] == list(range(9))


def test_folder_and_file_inputs(session: Path) -> None:
    one = session / "symbolized" / f"jeprof.{PID}.3.m3.heap.json.gz"
    client = make_client(str(session / "symbolized"), str(one))
    doc = client.get("/api/inputs").json()
    assert [i["kind"] for i in doc["inputs"]] == ["folder", "file"]
    assert len(doc["inputs"][0]["dumps"]) == 12 and len(doc["inputs"][1]["dumps"]) == 1
    assert client.get("/api/session/1/timeline").json()["lines"] == []
    assert client.get("/api/session/1/leaks").json()["processes"][0]["verdict"] == "unjudged"


def test_serve_command_is_registered() -> None:
    args = parser(["serve", "x"]).parse_args(["serve", "x", "--source-path", "/src"])
    assert args.host == "127.0.0.1" and args.port == 0 and not args.open
    assert args.source_path == ["/src"]


def test_loopback_and_warning() -> None:
    from heapscope.netaddr import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


def test_view_parsing_refuses_nonsense(session: Path) -> None:
    client = make_client(str(session))
    for q in ("sample=bytes", "granularity=modules", "n=-1", "n=x"):
        assert client.get(f"/api/dump/0/top?{q}").status_code == 400, q
    assert client.get("/api/dump/0/peek").status_code == 400
    assert client.get("/api/dump/0/source").status_code == 400


def test_argparse_free(session: Path) -> None:
    """The serve package never imports the command line (imports point down)."""
    import ast

    root = Path(__file__).resolve().parents[2] / "src" / "heapscope" / "serve"
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("heapscope.cli"), (path, node.module)
    assert argparse  # the command side is tested above through the parser


def test_other_commands_never_load_the_server() -> None:
    from tests.unit.test_startup import _imported

    for argv in (("top", "--help"), ("serve", "--help")):
        mods = _imported(*argv)
        assert not [m for m in mods if m.split(".")[0] in ("starlette", "uvicorn")], argv
    assert "heapscope.cli.serve" in _imported("serve", "--help")
