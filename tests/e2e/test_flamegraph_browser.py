"""The flame graph HTML in a real browser (headless Chromium driven by selenium).

Opens the flame graph of a real dump (``leaky_c``) and of a dump whose JIT frame is named by a
perf map line ``<img src=x onerror=window.__xss=1>``, and checks: it renders (canvas not
blank, title and total shown), search highlights and reports a matched total, clicking a
frame zooms, the console stays clean, and the hostile name shows as text without creating
an element or running code. A screenshot goes to ``artifacts/flamegraph.png``.
"""

from __future__ import annotations

import argparse
import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import chromium, console_errors

from heapscope.cli import flamegraph

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "<img src=x onerror=window.__xss=1>"
JIT_START = 0x7E0000000000
JIT_MAP = f"{JIT_START:x}-{JIT_START + 0x100000:x} r-xp 00000000 00:00 0\n"


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    with chromium() as drv:
        yield drv


def make_flamegraph(out: Path, *dumps: str, extra: tuple[str, ...] = ()) -> None:
    p = argparse.ArgumentParser()
    flamegraph.register(p.add_subparsers())
    args = p.parse_args(["flamegraph", *dumps, "-o", str(out), "--no-cache", *extra])
    assert args.func(args) == 0


def open_page(driver: Any, path: Path) -> None:
    driver.get_log("browser")  # drop what earlier pages logged
    driver.get(path.as_uri())
    deadline = time.time() + 20
    while time.time() < deadline:
        if driver.execute_script("return !!window.heapscopeFlamegraph"):
            return
        time.sleep(0.05)
    raise AssertionError(f"viewer did not start; console: {driver.get_log('browser')}")


def canvas_png(driver: Any) -> bytes:
    url = driver.execute_script("return document.getElementById('flame').toDataURL()")
    return base64.b64decode(url.split(",", 1)[1])


def canvas_blank(driver: Any) -> bool:
    return bool(driver.execute_script("""
        var c = document.getElementById('flame'), g = c.getContext('2d');
        var d = g.getImageData(0, 0, c.width, c.height).data;
        for (var i = 3; i < d.length; i += 4) if (d[i] !== 0) return false;
        return true;"""))


def search(driver: Any, text: str) -> str:
    box = driver.find_element("id", "search")
    box.clear()
    box.send_keys(text)
    box.send_keys("\n")
    return str(driver.find_element("id", "match").text)


def frames(driver: Any, min_width: float = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = driver.execute_script(
        "return window.heapscopeFlamegraph.frames(arguments[0])", min_width)
    return out


def point_at(driver: Any, x: float, y: float, click: bool = True) -> None:
    """Move the mouse to canvas coordinates (x, y) (CSS pixels from its corner); click."""
    from selenium.webdriver.common.actions.action_builder import ActionBuilder

    box = driver.execute_script("""var c = document.getElementById('flame');
        c.scrollIntoView({block: 'nearest'});
        var r = c.getBoundingClientRect(); return [r.left, r.top];""")
    vx, vy = int(box[0] + x), int(box[1] + y)
    assert 0 <= vy < driver.execute_script("return window.innerHeight"), (x, y, box)
    actions = ActionBuilder(driver)
    actions.pointer_action.move_to_location(vx, vy)
    if click:
        actions.pointer_action.click()
    actions.perform()


def test_flamegraph_of_a_real_dump(driver: Any, leaky_c: Any, tmp_path: Path) -> None:
    out = tmp_path / "leaky.html"
    make_flamegraph(out, str(leaky_c.dump))
    open_page(driver, out)
    assert driver.find_element("id", "title").text.startswith(leaky_c.dump.name)
    assert driver.find_element("id", "total").text.startswith("Total: ")
    assert driver.title.startswith("heapscope flame graph")
    assert not canvas_blank(driver)
    names = {f["name"] for f in frames(driver)}
    assert "main" in names and "all" in names

    before = canvas_png(driver)
    match = search(driver, "^main$")
    assert match.startswith("Matched: ") and "of total" in match, match
    assert canvas_png(driver) != before  # matches are highlighted
    # Substring (an invalid regex falls back to text).
    assert search(driver, "main(").startswith("Matched (text): ")

    search(driver, "")
    # Zoom into a frame below main that is narrower than the whole width.
    full = max(f["w"] for f in frames(driver))
    cands = [f for f in frames(driver, 30) if f["depth"] >= 2 and f["w"] < 0.9 * full]
    assert cands, frames(driver, 30)
    target = max(cands, key=lambda f: f["w"])
    before = canvas_png(driver)
    point_at(driver, target["x"] + target["w"] / 2, target["y"] + target["h"] / 2)
    assert driver.execute_script("return window.heapscopeFlamegraph.zoomName()") == \
        target["name"]
    assert canvas_png(driver) != before
    zoomed = [f for f in frames(driver) if f["name"] == target["name"]]
    assert zoomed and zoomed[0]["w"] > 0.95 * full
    assert target["name"] in driver.find_element("id", "crumbs").text

    # Invert, switch the sample type, reset: no errors along the way.
    driver.find_element("id", "invert").click()
    assert not canvas_blank(driver)
    driver.find_element("id", "invert").click()
    driver.execute_script("""var s = document.getElementById('type'); s.value = '3';
                             s.dispatchEvent(new Event('change'));""")
    assert "alloc space" in driver.find_element("id", "total").text
    driver.find_element("id", "reset").click()
    assert driver.execute_script("return window.heapscopeFlamegraph.zoomName()") == "all"
    search(driver, "^main$")
    driver.execute_script("window.scrollTo(0, 0)")
    artifacts = REPO / "artifacts"
    artifacts.mkdir(exist_ok=True)
    driver.save_screenshot(str(artifacts / "flamegraph.png"))
    assert console_errors(driver) == []


def _hostile_dump(src: Path, folder: Path) -> Path:
    """A copy of a real dump plus one stack through JIT code, and the perf map naming it."""
    text = src.read_text()
    head, sep, maps = text.partition("\nMAPPED_LIBRARIES:\n")
    assert sep, "dump without MAPPED_LIBRARIES"
    stacks = [line for line in head.splitlines() if line.startswith("@ ")]
    stack = max(stacks, key=len).split()[1:]
    jit = f"{JIT_START + 0x1010:#x}"
    new_stack = [*stack[:-2], jit, *stack[-2:]]
    extra = f"\n@ {' '.join(new_stack)}\n  t*: 1: 104857600 [1: 104857600]"
    out = folder / src.name
    out.write_text(head + extra + sep + JIT_MAP + maps)
    pid = src.name.split(".")[1]
    (folder / f"perf-{pid}.map").write_text(f"{JIT_START + 0x1000:x} 100 {HOSTILE}\n")
    return out


def test_hostile_jit_name_is_text(driver: Any, leaky_c: Any, tmp_path: Path) -> None:
    dump = _hostile_dump(leaky_c.dump, tmp_path)
    out = tmp_path / "hostile.html"
    make_flamegraph(out, str(dump))
    html = out.read_text()
    assert "<img" not in html
    open_page(driver, out)
    hostile = [f for f in frames(driver) if f["name"] == HOSTILE]
    assert hostile, "the JIT frame is not drawn"
    match = search(driver, "onerror")
    assert match.startswith("Matched: ") and "100.0 MiB" in match, match
    f = hostile[0]
    point_at(driver, f["x"] + min(f["w"] / 2, 40), f["y"] + f["h"] / 2, click=False)
    tip = driver.find_element("id", "tooltip")
    assert HOSTILE in tip.get_attribute("textContent")
    assert "[jit]" in tip.get_attribute("textContent")
    point_at(driver, f["x"] + min(f["w"] / 2, 40), f["y"] + f["h"] / 2)
    assert HOSTILE in driver.find_element("id", "crumbs").get_attribute("textContent")
    assert driver.execute_script("return document.getElementsByTagName('img').length") == 0
    assert driver.execute_script("return typeof window.__xss") == "undefined"
    assert console_errors(driver) == []


def test_frames_say_whose_code(driver: Any, leaky_cpp: Any, tmp_path: Path) -> None:
    """Every frame is drawn; library frames are told apart from the program's own."""
    out = tmp_path / "cpp.html"
    make_flamegraph(out, str(leaky_cpp.dump))
    open_page(driver, out)
    drawn = frames(driver)
    kinds = {f["name"]: f["kind"] for f in drawn}
    assert kinds.get("app::make_widgets") == "own", kinds
    std = [n for n in kinds if n.startswith("std::")]
    assert std and all(kinds[n] == "library" for n in std), kinds
    own = next(f for f in drawn if f["name"] == "app::make_widgets")
    lib = next(f for f in drawn if f["kind"] == "library" and f["w"] > 4)
    # Own code in warm colours, libraries grey-blue: the pixels at their centres differ in hue.
    png = driver.execute_script("""
        var c = document.getElementById('flame'), g = c.getContext('2d');
        var r = window.devicePixelRatio || 1;
        function px(f) { var d = g.getImageData(Math.round((f.x + 2) * r),
                                                 Math.round((f.y + f.h / 2) * r), 1, 1).data;
                         return [d[0], d[1], d[2]]; }
        return [px(arguments[0]), px(arguments[1])];""", own, lib)
    (r1, _, b1), (r2, _, b2) = png
    assert r1 > b1 + 40, png  # warm
    assert b2 >= r2, png  # cool
    assert console_errors(driver) == []
    raw = tmp_path / "raw.html"
    make_flamegraph(raw, str(leaky_cpp.dump), extra=("--frames", "raw"))
    open_page(driver, raw)
    assert {f["kind"] for f in frames(driver)} == {""}
