"""The viewer beside a command (heapscope.cli.beside), the shell's ``web``, and the catalog
following a folder the agent writes sessions into (heapscope.serve.catalog)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from heapscope.analysis.fold import FramePolicy
from heapscope.analysis.top import View
from heapscope.cli.beside import SideViewer, ViewerInputs, inputs_of, look_again
from heapscope.cli.shell import Shell
from heapscope.serve.catalog import Catalog
from heapscope.symbols import SymbolOptions

from .builders import Builder

DUMPS = Path(__file__).resolve().parent.parent / "data" / "dumps"
PID = 4242


def _session(folder: Path, dumps: int) -> Path:
    """A session folder as heapscope run leaves it: a manifest and ``dumps`` raw dumps."""
    (folder / "dumps").mkdir(parents=True)
    (folder / "manifest.json").write_text(json.dumps({"command": ["./app"], "pid": PID}))
    for k in range(dumps):
        _dump(folder, k)
    return folder


def _dump(folder: Path, k: int) -> Path:
    path = folder / "dumps" / f"jeprof.{PID}.{k}.m{k}.heap"
    shutil.copy(DUMPS / "dialects.heap", path)
    return path


def _names(catalog: Catalog) -> list[tuple[str, list[str]]]:
    doc = catalog.as_dict()
    return [(i["title"], [d["name"] for d in i["dumps"]]) for i in doc["inputs"]]


def _get(url: str, token: str) -> Any:
    req = urllib.request.Request(url, headers={"X-Heapscope-Token": token})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _closed(base: str) -> bool:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


@pytest.fixture
def quick_rescan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each refresh lists the folders again (no once-a-second limit)."""
    monkeypatch.setattr("heapscope.serve.catalog.RESCAN_SECONDS", 0.0)


# -- the catalog and the agent's state folder -------------------------------------------------


def test_a_deleted_dump_leaves_the_list(tmp_path: Path, quick_rescan: None) -> None:
    session = _session(tmp_path / "s", 3)
    catalog = Catalog([str(session)])
    before = catalog.refresh()
    (session / "dumps" / f"jeprof.{PID}.0.m0.heap").unlink()  # the agent's window moved on
    _dump(session, 3)
    assert catalog.refresh() > before
    assert _names(catalog) == [("s", [f"jeprof.{PID}.{k}.m{k}.heap" for k in (1, 2, 3)])]
    # Numbers are never reused: the new dump has the next one.
    assert [d["id"] for d in catalog.as_dict()["inputs"][0]["dumps"]] == [1, 2, 3]


def test_a_folder_of_sessions_shows_each_session(tmp_path: Path, quick_rescan: None) -> None:
    state = tmp_path / "state"
    state.mkdir()
    catalog = Catalog([str(state)])
    assert [i["kind"] for i in catalog.as_dict()["inputs"]] == ["folder"]  # empty so far
    _session(state / "app-10-77", 2)
    catalog.refresh()
    # The folder stands for its sessions: each one an input with its manifest.
    doc = catalog.as_dict()
    assert [(i["kind"], i["title"], i["parent"]) for i in doc["inputs"]] == [
        ("session", "app-10-77", 0)]
    assert len(doc["inputs"][0]["dumps"]) == 2
    # A target the agent starts watching later appears as a session of its own.
    _session(state / "db-11-78", 1)
    catalog.refresh()
    assert [t for t, _ in _names(catalog)] == ["app-10-77", "db-11-78"]
    # A session's dumps are never listed a second time as the folder's.
    assert sum(len(d) for _, d in _names(catalog)) == 3


def test_loose_dumps_beside_sessions_and_links(tmp_path: Path, quick_rescan: None) -> None:
    root = tmp_path / "root"
    _session(root / "run-1", 1)
    shutil.copy(DUMPS / "dialects.heap", root / f"jeprof.{PID}.9.m9.heap")
    elsewhere = _session(tmp_path / "elsewhere", 1)
    os.symlink(elsewhere, root / "link")
    catalog = Catalog([str(root), str(root / "run-1")])
    # The folder keeps its own dumps; the session named twice is listed once; a link to a
    # session elsewhere is not followed into an input.
    assert _names(catalog) == [("root", [f"jeprof.{PID}.9.m9.heap"]),
                               ("run-1", [f"jeprof.{PID}.0.m0.heap"])]


# -- a viewer beside a command ----------------------------------------------------------------


def _inputs(*paths: Path) -> ViewerInputs:
    return inputs_of([str(p) for p in paths], SymbolOptions(cache_dir=None))


def test_side_viewer_serves_until_stopped(tmp_path: Path) -> None:
    session = _session(tmp_path / "s", 2)
    err = io.StringIO()
    viewer = SideViewer(_inputs(session), err=err)
    assert viewer.start() and viewer.running
    assert viewer.viewer is not None
    base, token = viewer.viewer.base, viewer.viewer.token
    assert err.getvalue() == f"heapscope: viewer at {base}/?token={token}\n"
    doc = _get(base + "/api/inputs", token)
    assert [len(i["dumps"]) for i in doc["inputs"]] == [2]
    viewer.stop(str(session))
    assert not viewer.running and _closed(base)
    assert err.getvalue().splitlines()[-1] == \
        f"heapscope: viewer stopped; to look again: {look_again(str(session))}"
    viewer.stop(str(session))  # stopping again does nothing, says nothing
    assert len(err.getvalue().splitlines()) == 2


def test_a_viewer_that_cannot_start_is_a_warning(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object, timeout: float = 30.0) -> None:
        raise RuntimeError("the server ended as it started")

    monkeypatch.setattr("heapscope.serve.server.Viewer.start", refuse)
    err = io.StringIO()
    viewer = SideViewer(_inputs(_session(tmp_path / "s", 1)), err=err)
    assert not viewer.start() and not viewer.running and viewer.url is None
    assert err.getvalue() == ("heapscope: warning: no viewer: the server ended as it started; "
                              "going on without it\n")
    viewer.stop("s")  # nothing to stop, nothing said
    assert err.getvalue().count("\n") == 1


def test_stay_ends_on_sigterm(tmp_path: Path) -> None:
    err = io.StringIO()
    viewer = SideViewer(_inputs(_session(tmp_path / "s", 1)), err=err)
    assert viewer.start() and viewer.viewer is not None
    base = viewer.viewer.base
    before = signal.getsignal(signal.SIGTERM)

    def terminate_once_handled() -> None:
        deadline = time.monotonic() + 30
        while signal.getsignal(signal.SIGTERM) is before and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_once_handled, daemon=True).start()
    viewer.stay()
    assert signal.getsignal(signal.SIGTERM) is before  # put back as it was
    assert not viewer.running and _closed(base)
    assert "goes on showing the finished session" in err.getvalue()


# -- the shell's web --------------------------------------------------------------------------


def _shell(commands: str, web: ViewerInputs | None, source: str = "") -> tuple[Shell, str]:
    b = Builder()
    profile = b.profile(b.sample("je:malloc", "leaky@app.c:5", "main@app.c:9"), source=source)
    out = io.StringIO()
    shell = Shell([profile], View("inuse_space", "functions", False, 10, None, None),
                  stdin=io.StringIO(commands), stdout=out, web=web)
    shell.loop()
    return shell, out.getvalue()


def test_shell_web_start_again_stop(tmp_path: Path) -> None:
    session = _session(tmp_path / "s", 1)
    shell, out = _shell("web\nweb\nweb now\nweb stop\nweb stop\nquit\n", _inputs(session))
    lines = out.splitlines()
    assert lines[0].startswith("heapscope: viewer at http://127.0.0.1:")
    assert lines[1] == lines[0]  # asked again: the same viewer
    assert lines[2:] == ["usage: web | web stop", "heapscope: viewer stopped",
                         "no viewer is running"]
    assert shell.viewer is not None and not shell.viewer.running


def test_leaving_the_shell_stops_the_viewer(tmp_path: Path) -> None:
    session = _session(tmp_path / "s", 1)
    shell, out = _shell("web\n", _inputs(session))  # end of input, no quit
    assert shell.viewer is not None and not shell.viewer.running
    base = out.split("viewer at ", 1)[1].split("/?", 1)[0]
    assert _closed(base)


def test_shell_web_without_paths_serves_the_profiles_files(tmp_path: Path) -> None:
    # heapscope top -i gives the shell its profiles only: web serves the files they came from.
    dump = _dump(_session(tmp_path / "s", 0), 0)
    shell, _ = _shell("", None, source=str(dump))
    assert shell.web.paths == (str(dump),)
    assert shell.web.frames == FramePolicy.from_env()
    _, out = _shell("web\n", None, source="")
    assert out.startswith("error: these profiles were not read from files")


def test_help_names_web() -> None:
    from heapscope.cli.shell import HELP

    assert "web stop" in HELP


def test_a_dump_deleted_before_the_next_listing_is_not_judged(tmp_path: Path) -> None:
    session = _session(tmp_path / "s", 3)
    catalog = Catalog([str(session)])
    (session / "dumps" / f"jeprof.{PID}.0.m0.heap").unlink()
    # Still listed until the folder is listed again, but never handed to a report.
    assert len(catalog.as_dict()["inputs"][0]["dumps"]) == 3
    assert [d.key for d in catalog.input_dumps(0)] == [f"jeprof.{PID}.{k}.m{k}.heap"
                                                      for k in (1, 2)]
