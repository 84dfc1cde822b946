"""``heapscope serve`` in a real browser (headless Chromium driven by selenium), over HTTP.

The session is ``leakprog/series.c cache`` run under ``heapscope run`` (a dump every 40 ms
step): ``leak_linear`` leaks (line ``LEAK:linear``), ``cache_fill`` fills and stops. The
server is the real command (``heapscope serve``, uvicorn, a free port), started as a
subprocess; the page is clicked through as a user would: the overview, a process, a dump on
the timeline and its flame graph, a search, a focus pattern, a diff of two dumps, the
source line of the leak, and a live session gaining a dump. The token and path refusals are
checked over plain HTTP. Then the call graph (a node clicked sets the focus), hide and show
patterns, ``--alloc-fn`` set from the page, the flame graph drawn as icicle or flame and
inverted, and a merged set of three dumps. Screenshots go to ``artifacts/serve-*.png``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jemalloc as je
import pytest
from browser import chromium, console_errors, screenshot

pytestmark = pytest.mark.e2e

WAIT = 60.0  # seconds a step may take on a slow, loaded machine before the test gives up


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory, gcc: Path, libjemalloc: Path
             ) -> tuple[Path, dict[str, str]]:
    """A finished session of series.c and the environment its commands ran with."""
    return je.series_session(tmp_path_factory.mktemp("heapscope-serve").resolve(), gcc)


class Server:
    """``heapscope serve ARGS`` as a subprocess: its URL, and its stderr once stopped."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "heapscope.cli.main", "serve", *args],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("http://"):
            self.proc.kill()
            raise AssertionError(f"no URL printed: {self.url!r} {self.proc.stderr.read()}")
        self.base = self.url.split("/?", 1)[0]
        self.token = self.url.split("token=", 1)[1]

    def stop(self) -> str:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return str(err)


@pytest.fixture(scope="module")
def server(recorded: tuple[Path, dict[str, str]]) -> Iterator[Server]:
    session, env = recorded
    srv = Server(env, str(session))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium() as drv:
        yield drv


def wait_for(what: str, check: Callable[[], Any], timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def settled(driver: Any) -> None:
    """Wait until the page has no request in flight (twice, a moment apart)."""
    def idle() -> bool:
        return bool(driver.execute_script(
            "return !!window.heapscopeViewer && window.heapscopeViewer.idle()"))
    wait_for("the page to load", idle)
    time.sleep(0.2)
    wait_for("the page to load", idle)


def fragment(driver: Any) -> dict[str, str]:
    url = driver.current_url
    from urllib.parse import parse_qsl

    return dict(parse_qsl(url.split("#", 1)[1])) if "#" in url else {}


def texts(driver: Any, css: str) -> list[str]:
    return [str(e.get_attribute("textContent")) for e in driver.find_elements("css selector",
                                                                             css)]


def top_names(driver: Any) -> list[str]:
    return texts(driver, "#top-table tbody tr td.name a.row-peek")


def flame_names(driver: Any) -> set[str]:
    frames = driver.execute_script("return window.heapscopeViewer.flame().frames(0)")
    return {f["name"] for f in frames}


def graph_names(driver: Any) -> list[str]:
    """The names of the call graph's nodes, from the boxes laid over its image."""
    return [str(e.get_attribute("data-name"))
            for e in driver.find_elements("css selector", "#graph-hits .graph-node")]


def type_into(driver: Any, element_id: str, text: str) -> None:
    box = driver.find_element("id", element_id)
    box.clear()
    box.send_keys(text + "\n")


def click(driver: Any, element: Any) -> None:
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def test_clicking_through_a_session(server: Server, driver: Any) -> None:
    driver.get_log("browser")
    driver.get(server.url)
    settled(driver)
    assert "token" not in driver.current_url  # traded for a cookie
    procs = driver.find_elements("css selector", "tr.proc-row")
    assert len(procs) == 1
    pid = procs[0].get_attribute("data-pid")
    suspects = {r.find_element("css selector", "td.name").text.split("\n")[0]:
                r.find_element("css selector", "td").text
                for r in driver.find_elements("css selector", "tr.suspect")}
    assert suspects.get("leak_linear") == "leak", suspects
    assert suspects.get("cache_fill") == "bounded", suspects
    evidence = texts(driver, "tr.suspect .evidence")
    assert any("drift z" in e and "dumps" in e for e in evidence), evidence
    points = driver.find_elements("css selector", "circle.pt")
    assert len(points) >= 20
    screenshot(driver, "serve-overview.png")

    # A process: everything shows only it (here the one process), and the URL says so.
    click(driver, procs[0])
    settled(driver)
    assert fragment(driver).get("pid") == pid
    assert driver.find_element("css selector", "tr.proc-row").get_attribute(
        "class").endswith("chosen")
    assert {r.get_attribute("data-pid") for r in driver.find_elements(
        "css selector", "tr.suspect")} == {pid}

    # A dump on the timeline: its heap dot opens it.
    heap_dots = driver.find_elements("css selector", "g.heap circle.pt")
    last = heap_dots[-2]  # the last running dump (the final one follows at exit)
    dump = last.get_attribute("data-dump")
    from selenium.webdriver.common.action_chains import ActionChains

    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", last)
    ActionChains(driver).move_to_element(last).click().perform()
    settled(driver)
    assert fragment(driver).get("view") == "dump" and fragment(driver).get("id") == dump
    names = top_names(driver)
    assert "leak_linear" in names and "cache_fill" in names, names
    screenshot(driver, "serve-dump.png")

    # Its flame graph, with the leaking function in it; a search reports what it matched.
    click(driver, driver.find_element("id", "tab-flame"))
    settled(driver)
    wait_for("the flame graph", lambda: driver.execute_script(
        "return !!window.heapscopeViewer.flame()"))
    assert {"leak_linear", "cache_fill", "main"} <= flame_names(driver)
    type_into(driver, "fg-search", "leak_")
    match = wait_for("the search", lambda: driver.find_element("id", "fg-match").text)
    assert match.startswith("Matched: ") and "of total" in match, match
    screenshot(driver, "serve-flame.png")

    # A focus pattern: every view shows only stacks through cache_fill, and the URL keeps it.
    type_into(driver, "focus", "cache_fill")
    settled(driver)
    assert fragment(driver).get("focus") == "cache_fill"
    wait_for("the focused flame graph", lambda: "leak_linear" not in flame_names(driver))
    assert "cache_fill" in flame_names(driver)
    click(driver, driver.find_element("id", "tab-top"))
    settled(driver)
    names = top_names(driver)
    assert "cache_fill" in names and "leak_linear" not in names, names
    assert "focus cache_fill" in driver.find_element("id", "top-total").text
    driver.refresh()  # the view is in the URL: a reload shows the same
    settled(driver)
    assert "leak_linear" not in top_names(driver) and "cache_fill" in top_names(driver)
    assert driver.find_element("id", "focus").get_attribute("value") == "cache_fill"
    click(driver, driver.find_element("id", "clear"))
    settled(driver)
    assert "leak_linear" in top_names(driver)

    # Callers and callees of the leaking function.
    link = next(a for a in driver.find_elements("css selector", "a.row-peek")
                if a.text == "leak_linear")
    click(driver, link)
    settled(driver)
    assert driver.find_element("id", "peek-function").text == "leak_linear"
    assert "run_cache" in texts(driver, "table.callers td.name")
    assert console_errors(driver) == []


def test_diff_and_source(server: Server, driver: Any) -> None:
    driver.get_log("browser")
    driver.get(server.base + "/#view=overview")
    settled(driver)
    picks = driver.find_elements("css selector", "input.pick")
    assert len(picks) >= 20
    first, later = picks[0].get_attribute("data-dump"), picks[15].get_attribute("data-dump")
    click(driver, picks[0])
    click(driver, picks[15])
    click(driver, driver.find_element("css selector", "button.diff-picked"))
    settled(driver)
    frag = fragment(driver)
    assert (frag.get("view"), frag.get("a"), frag.get("b")) == ("diff", first, later)
    assert "minus" in driver.find_element("id", "dump-title").text
    assert driver.find_element("id", "top-total").text.startswith("Change: +")
    rows = driver.find_elements("css selector", "#top-table tbody tr")
    growth = {r.find_element("css selector", "a.row-peek").text:
              r.find_elements("css selector", "td")[0].text for r in rows}
    assert not growth["leak_linear"].startswith("-") and growth["leak_linear"] != "0 B"
    screenshot(driver, "serve-diff.png")

    # The source of the leak: its line marked, with its bytes.
    driver.get(server.base + "/#view=overview")
    settled(driver)
    row = next(r for r in driver.find_elements("css selector", "tr.suspect")
               if "leak_linear" in r.text)
    click(driver, row.find_element("css selector", "a.src-link"))
    settled(driver)
    marked = wait_for("the marked line", lambda: driver.find_elements(
        "css selector", "#source-table tr.marked"))
    text = marked[0].find_element("css selector", "td.text").text
    assert "LEAK:linear" in text, text
    assert re.match(r"^\d[\d.]* (KiB|MiB|B)$", marked[0].find_element(
        "css selector", "td.flat").text)
    screenshot(driver, "serve-source.png")
    assert console_errors(driver) == []


def open_dump_tab(driver: Any, server: Server, dump: str, tab: str) -> None:
    """From the overview: open a dump from the dumps list, then one of its tabs."""
    driver.get(server.base + "/#view=overview")
    settled(driver)
    link = next(a for a in driver.find_elements("css selector", "a.open-dump")
                if a.get_attribute("data-dump") == dump)
    click(driver, link)
    settled(driver)
    click(driver, driver.find_element("id", "tab-" + tab))
    settled(driver)


def later_dump(driver: Any, server: Server) -> str:
    """The id of a dump late in the run (everything allocated by then)."""
    driver.get(server.base + "/#view=overview")
    settled(driver)
    picks = driver.find_elements("css selector", "input.pick")
    return str(picks[15].get_attribute("data-dump"))


def test_call_graph_focus_hide_and_frames(server: Server, driver: Any) -> None:
    driver.get_log("browser")
    driver.get(server.url)
    settled(driver)
    dump = later_dump(driver, server)
    open_dump_tab(driver, server, dump, "graph")
    assert fragment(driver).get("tab") == "graph"
    names = wait_for("the call graph", lambda: graph_names(driver))
    assert {"leak_linear", "cache_fill", "main"} <= set(names), names
    img = driver.find_element("id", "graph-img")
    assert str(img.get_attribute("src")).startswith("data:image/svg+xml")
    assert driver.execute_script("return arguments[0].naturalWidth", img) > 100
    # The SVG is an image: none of its elements is part of the page.
    assert driver.execute_script("return document.querySelectorAll('svg g.node').length") == 0
    assert "nodes" in driver.find_element("id", "graph-status").text
    screenshot(driver, "serve-graph.png")

    # A click on a node focuses every view on its function.
    box = next(e for e in driver.find_elements("css selector", "#graph-hits .graph-node")
               if e.get_attribute("data-name") == "leak_linear")
    click(driver, box)
    settled(driver)
    assert fragment(driver).get("focus") == "^leak_linear$"
    wait_for("the focused graph", lambda: "cache_fill" not in graph_names(driver)
             and "leak_linear" in graph_names(driver))
    click(driver, driver.find_element("id", "tab-top"))
    settled(driver)
    names = top_names(driver)
    assert "leak_linear" in names and "cache_fill" not in names, names
    click(driver, driver.find_element("id", "tab-flame"))
    settled(driver)
    wait_for("the focused flame graph", lambda: "cache_fill" not in flame_names(driver))
    click(driver, driver.find_element("id", "clear"))
    settled(driver)

    # Hide: run_cache leaves the stacks, leak_linear's caller is now run_cache's caller.
    type_into(driver, "hide", "^run_cache$")
    settled(driver)
    assert fragment(driver).get("hide") == "^run_cache$"
    wait_for("the flame graph without run_cache", lambda: "run_cache" not in
             flame_names(driver) and "leak_linear" in flame_names(driver))
    click(driver, driver.find_element("id", "tab-graph"))
    settled(driver)
    wait_for("the graph without run_cache", lambda: "run_cache" not in graph_names(driver)
             and "leak_linear" in graph_names(driver))
    driver.get(server.base + "/#" + urllib.parse.urlencode(
        {"view": "dump", "id": dump, "tab": "peek", "fn": "leak_linear",
         "hide": "^run_cache$"}))
    settled(driver)
    callers = texts(driver, "table.callers td.name")
    assert callers and "run_cache" not in callers, callers
    # Show: only the frames asked for are left.
    click(driver, driver.find_element("id", "clear"))
    settled(driver)
    type_into(driver, "show", "^(leak_linear|main)$")
    settled(driver)
    click(driver, driver.find_element("id", "tab-top"))
    settled(driver)
    names = top_names(driver)
    assert "leak_linear" in names and not {"run_cache", "cache_fill"} & set(names), names
    click(driver, driver.find_element("id", "clear"))
    settled(driver)

    # --alloc-fn from the page: leak_linear folds into its caller like malloc.
    type_into(driver, "alloc_fn", "^leak_linear$")
    settled(driver)
    assert fragment(driver).get("alloc_fn") == "^leak_linear$"
    names = top_names(driver)
    assert "leak_linear" not in names and "run_cache" in names, names
    via = driver.find_elements("css selector", "#top-table .evidence")
    assert any("leak_linear" in e.text for e in via)
    assert console_errors(driver) == []
    type_into(driver, "alloc_fn", "(")  # a bad pattern: one line, and nothing else breaks
    error = wait_for("the error", lambda: driver.find_element("id", "error").text)
    assert error.startswith("alloc_fn '(': invalid regular expression"), error
    click(driver, driver.find_element("id", "clear"))
    settled(driver)
    assert "leak_linear" in top_names(driver)
    # The 400 answer is the one thing the browser logs.
    logged = console_errors(driver)
    assert [e for e in logged if e.get("source") != "network"] == [], logged
    assert all("400" in e["message"] for e in logged), logged


def test_icicle_flame_and_inverted(server: Server, driver: Any) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.support.ui import Select

    driver.get_log("browser")
    driver.get(server.url)
    settled(driver)
    open_dump_tab(driver, server, later_dump(driver, server), "flame")
    wait_for("the flame graph", lambda: driver.execute_script(
        "return !!window.heapscopeViewer.flame()"))

    def frames() -> list[dict[str, Any]]:
        return list(driver.execute_script("return window.heapscopeViewer.flame().frames(0)"))

    def depth_y(depth: int) -> float:
        return float(next(f["y"] for f in frames() if f["depth"] == depth))

    assert driver.find_element("id", "fg-orient").get_attribute("value") == "icicle"
    assert depth_y(0) < depth_y(1)  # the root on top
    Select(driver.find_element("id", "fg-orient")).select_by_value("flame")
    settled(driver)
    assert fragment(driver).get("draw") == "flame"
    assert depth_y(0) > depth_y(1)  # the root at the bottom
    # A hover finds the frame drawn under the pointer, also upside down.
    leak = next(f for f in frames() if f["name"] == "leak_linear")
    canvas = driver.find_element("id", "fg-flame")
    size = canvas.size
    ActionChains(driver).move_to_element_with_offset(
        canvas, int(leak["x"] + leak["w"] / 2 - size["width"] / 2),
        int(leak["y"] + leak["h"] / 2 - size["height"] / 2)).perform()
    wait_for("the tooltip", lambda: "leak_linear" in driver.find_element(
        "id", "fg-details").text)
    screenshot(driver, "serve-flame-upward.png")

    # Inverted: the allocating functions first, their callers above (or below) them.
    click(driver, driver.find_element("id", "fg-invert"))
    settled(driver)
    assert fragment(driver).get("invert") == "1"
    first = {f["name"] for f in frames() if f["depth"] == 1}
    assert "leak_linear" in first and "main" not in first, first
    driver.refresh()  # both are in the URL
    settled(driver)
    wait_for("the flame graph", lambda: driver.execute_script(
        "return !!window.heapscopeViewer.flame()"))
    assert driver.find_element("id", "fg-orient").get_attribute("value") == "flame"
    assert driver.find_element("id", "fg-invert").is_selected()
    assert "leak_linear" in {f["name"] for f in frames() if f["depth"] == 1}
    assert depth_y(0) > depth_y(1)
    click(driver, driver.find_element("id", "fg-invert"))
    settled(driver)
    outermost = {f["name"] for f in frames() if f["depth"] == 1}  # _start and the like
    assert "leak_linear" not in outermost and outermost != first, outermost
    assert console_errors(driver) == []


def test_a_merged_set(server: Server, driver: Any) -> None:
    driver.get_log("browser")
    driver.get(server.url)
    settled(driver)
    picks = driver.find_elements("css selector", "input.pick")
    chosen = [str(picks[k].get_attribute("data-dump")) for k in (5, 10, 15)]
    merge = driver.find_element("css selector", "button.merge-picked")
    assert not merge.is_enabled()
    for k in (5, 10, 15):
        click(driver, picks[k])
    assert not driver.find_element("css selector", "button.diff-picked").is_enabled()
    assert merge.text == "Open merged (3)"
    click(driver, merge)
    settled(driver)
    frag = fragment(driver)
    assert frag.get("view") == "merged" and frag.get("ids") == ",".join(chosen)
    assert driver.find_element("id", "dump-title").text.startswith("merged: 3 dumps")
    names = top_names(driver)
    assert "leak_linear" in names and "cache_fill" in names, names
    # The total is the three dumps' totals added up.
    auth = {"X-Heapscope-Token": server.token}
    each = [json.loads(_get(f"{server.base}/api/dump/{i}/top", auth)[1])["total"]
            for i in chosen]
    merged = json.loads(_get(f"{server.base}/api/merged/top?ids={','.join(chosen)}",
                             auth)[1])
    assert merged["total"] == sum(each)
    assert driver.find_element("id", "top-total").text.startswith("Total: ")
    screenshot(driver, "serve-merged.png")
    click(driver, driver.find_element("id", "tab-graph"))
    settled(driver)
    assert "leak_linear" in wait_for("the merged graph", lambda: graph_names(driver))
    click(driver, driver.find_element("id", "tab-flame"))
    settled(driver)
    wait_for("the merged flame graph", lambda: "leak_linear" in flame_names(driver))
    assert console_errors(driver) == []


def test_a_live_session_gains_a_dump(recorded: tuple[Path, dict[str, str]], driver: Any,
                                     tmp_path: Path) -> None:
    session, env = recorded
    live = tmp_path / "live"
    shutil.copytree(session, live)
    dumps = sorted((live / "dumps").glob("*.m*.heap"), key=lambda p: int(p.name.split(".")[2]))
    held = dumps[-1]
    kept = tmp_path / held.name
    held.rename(kept)
    (live / "symbolized" / (held.name + ".json.gz")).unlink()
    srv = Server(env, str(live))
    try:
        driver.get_log("browser")  # drop what earlier pages logged
        driver.get(srv.url)
        settled(driver)
        before = len(driver.find_elements("css selector", "input.pick"))
        dots = len(driver.find_elements("css selector", "g.heap circle.pt"))
        # The program writes another dump: it appears without a reload.
        arriving = live / "dumps" / ("." + held.name + ".tmp")
        shutil.copy(kept, arriving)
        arriving.rename(live / "dumps" / held.name)
        wait_for("the new dump", lambda: len(driver.find_elements(
            "css selector", "input.pick")) == before + 1)
        settled(driver)
        assert len(driver.find_elements("css selector", "g.heap circle.pt")) == dots + 1
        assert held.name in texts(driver, "a.open-dump")
        assert driver.find_element("id", "live").text.startswith("updated")
        screenshot(driver, "serve-live.png")
        assert console_errors(driver) == []
    finally:
        driver.get("about:blank")  # no page left polling a server that is gone
        srv.stop()


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


def test_refusals_over_http(server: Server, recorded: tuple[Path, dict[str, str]],
                            tmp_path: Path) -> None:
    base, token = server.base, server.token
    assert base.startswith("http://127.0.0.1:")
    for path in ("/", "/api/inputs", "/api/dump/0/top", "/api/session/0/leaks", "/x"):
        status, body, headers = _get(base + path)
        assert status == 403, path
        assert "Access-Control-Allow-Origin" not in headers
        assert _get(base + path, {"X-Heapscope-Token": token + "x"})[0] == 403
    auth = {"X-Heapscope-Token": token}
    status, body, headers = _get(base + "/api/inputs", auth)
    assert status == 200 and "Access-Control-Allow-Origin" not in headers
    assert _get(base + "/api/inputs?token=" + token)[0] == 200
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the browser")
    session, _ = recorded
    for path in ("/api/dump/0/source?file=" + str(secret),
                 "/api/dump/0/source?file=/etc/passwd",
                 "/api/dump/0/source?file=../../../../etc/passwd",
                 "/api/dump/999999/top",
                 "/api/dump/..%2F..%2Fetc%2Fpasswd/top",
                 "/api/session/7/leaks",
                 "/api/diff?a=0&b=999999"):
        status, body, _ = _get(base + path, auth)
        assert status in (400, 404), (path, status)
        assert "not for the browser" not in body and "root:" not in body
    for path in ("/../../etc/passwd", "/%2e%2e/%2e%2e/etc/passwd", "/session/manifest.json",
                 "/" + str(session / "manifest.json")):
        status, body, _ = _get(base + path, auth)
        assert status == 404 and "root:" not in body and "heapscope_pid" not in body, path
    # A known file is served, and only one the profile names.
    status, body, _ = _get(base + "/api/dump/0/top?granularity=lines&n=1", auth)
    file = json.loads(body)["rows"][0]["file"]
    status, body, _ = _get(base + "/api/dump/0/source?" + urllib.parse.urlencode(
        {"file": file}), auth)
    assert status == 200 and json.loads(body)["found"]


def test_other_hosts_are_warned_about(recorded: tuple[Path, dict[str, str]]) -> None:
    session, env = recorded
    srv = Server(env, str(session), "--host", "0.0.0.0")
    err = srv.stop()
    assert srv.url.startswith("http://0.0.0.0:")
    assert "warning: serving on 0.0.0.0" in err and "source files" in err, err
    quiet = Server(env, str(session))
    assert "warning" not in quiet.stop()


def test_hostile_names_stay_text(leaky_c: Any, driver: Any, tmp_path: Path,
                                 recorded: tuple[Path, dict[str, str]]) -> None:
    """A JIT frame named ``<img src=x onerror=…>`` shows as text in the table, the callers
    view and the flame graph, and runs nothing."""
    from test_flamegraph_browser import HOSTILE, _hostile_dump

    _, env = recorded
    dump = _hostile_dump(leaky_c.dump, tmp_path)
    srv = Server(env, str(dump))
    try:
        driver.get_log("browser")  # drop what earlier pages logged
        driver.get(srv.url)
        settled(driver)
        driver.get(srv.base + "/#view=dump&id=0&n=0")
        settled(driver)
        assert HOSTILE in top_names(driver)
        driver.get(srv.base + "/#" + urllib.parse.urlencode(
            {"view": "dump", "id": 0, "tab": "peek", "fn": HOSTILE}))
        settled(driver)
        assert driver.find_element("id", "peek-function").text == HOSTILE
        click(driver, driver.find_element("id", "tab-flame"))
        settled(driver)
        wait_for("the flame graph", lambda: HOSTILE in flame_names(driver))
        # The call graph: the name is text in an image, and the title of the box over it.
        click(driver, driver.find_element("id", "tab-graph"))
        settled(driver)
        assert HOSTILE in graph_names(driver)
        assert driver.execute_script(
            "return document.querySelectorAll('img:not(#graph-img), svg g.node').length") == 0
        assert driver.execute_script("return typeof window.__xss") == "undefined"
        assert console_errors(driver) == []
    finally:
        driver.get("about:blank")  # no page left polling a server that is gone
        srv.stop()
