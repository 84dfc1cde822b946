"""``heapscope graph`` on real programs run under Debian's jemalloc: images made by Graphviz
that name the leaks, with their values and percentages."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e

SVG = "{http://www.w3.org/2000/svg}"
CMD = [sys.executable, "-m", "heapscope.cli.main"]


@pytest.fixture(scope="session")
def dot() -> str:
    path = shutil.which("dot")
    if path is None:
        pytest.skip("Graphviz dot not installed: apt-get install graphviz")
    return path


def heapscope(*args: str, cache: Path | None = None, env: dict[str, str] | None = None,
              check: bool = True) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope("graph", *args, cache=cache, env=env, check=check)


def svg_texts(path: Path) -> tuple[ET.Element, str]:
    root = ET.parse(path).getroot()  # valid XML or this raises
    assert root.tag == f"{SVG}svg"
    return root, "\n".join(t.text or "" for t in root.iter(f"{SVG}text"))


def node_fills(root: ET.Element) -> dict[str, str]:
    """The fill colour of each node's box, by the first line of its label."""
    out = {}
    for g in root.iter(f"{SVG}g"):
        if g.get("class") != "node":
            continue
        texts = [t.text or "" for t in g.iter(f"{SVG}text")]
        shape = next((s for s in g.iter() if s.tag in (f"{SVG}polygon", f"{SVG}path")), None)
        if texts and shape is not None:
            out[texts[0]] = shape.get("fill", "")
    return out


def test_svg_names_the_leaks_with_percentages(leaky_c: Any, dot: str, cache_dir: Path,
                                              tmp_path: Path) -> None:
    out = tmp_path / "leaky.svg"
    heapscope(str(leaky_c.dump), "-o", str(out), cache=cache_dir)
    root, text = svg_texts(out)
    for name in ("leak_big", "leak_small", "main", "worker_alloc"):
        assert name in text, f"{name} missing from the graph"
    # leak_big holds 8 MiB of the ~19 MiB: a node label "8.0 MiB (42.x%)".
    assert re.search(r"8\.0 MiB \(4\d\.\d%\)", text), text
    assert re.search(r"of \d+\.\d MiB \(\d+\.\d%\)", text)  # cumulative values on callers
    assert "Type: inuse_space" in text and "Total: 19." in text
    assert "jemalloc" not in text and "je_" not in text  # allocator frames pruned
    # Edges are drawn (with their weights as labels).
    assert sum(1 for g in root.iter(f"{SVG}g") if g.get("class") == "edge") >= 5


def test_png_pdf_gif_and_dot(leaky_c: Any, dot: str, cache_dir: Path, tmp_path: Path) -> None:
    magic = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF", "gif": b"GIF8"}
    for fmt, head in magic.items():
        out = tmp_path / f"leaky.{fmt}"
        heapscope(str(leaky_c.dump), "-o", str(out), cache=cache_dir)
        assert out.read_bytes().startswith(head), fmt
    forced = tmp_path / "leaky.img"
    heapscope(str(leaky_c.dump), "-o", str(forced), "--format", "png", cache=cache_dir)
    assert forced.read_bytes().startswith(magic["png"])
    text_out = tmp_path / "leaky.dot"
    heapscope(str(leaky_c.dump), "-o", str(text_out), cache=cache_dir)
    text = text_out.read_text()
    assert text.startswith('digraph "heapscope" {') and "leak_big" in text
    subprocess.run([dot, "-Tsvg", "-o", os.devnull, str(text_out)], check=True)


def test_sample_types_and_granularity(leaky_c: Any, dot: str, cache_dir: Path,
                                      tmp_path: Path) -> None:
    out = tmp_path / "objects.svg"
    heapscope(str(leaky_c.dump), "--inuse-objects", "--lines", "-o", str(out), cache=cache_dir)
    _, text = svg_texts(out)
    assert "Type: inuse_objects" in text
    assert re.search(r"leaky\.c:\d+", text), text  # a node per source line
    assert "20000 (" in text  # leak_small's 20,000 objects
    out = tmp_path / "alloc.svg"
    heapscope(str(leaky_c.dump), "--alloc-space", "-o", str(out), cache=cache_dir)
    _, text = svg_texts(out)
    assert "churn" in text  # freed, so only in the allocation totals


def test_nodecount_focus_and_ignore(leaky_c: Any, dot: str, cache_dir: Path,
                                    tmp_path: Path) -> None:
    out = tmp_path / "small.svg"
    p = heapscope(str(leaky_c.dump), "--nodecount", "3", "-o", str(out), cache=cache_dir)
    root, text = svg_texts(out)
    assert len(node_fills(root)) == 3
    assert "Dropped" in text and "dropped" in p.stderr
    out = tmp_path / "focus.svg"
    heapscope(str(leaky_c.dump), "--focus", "leak_small", "-o", str(out), cache=cache_dir)
    root, text = svg_texts(out)
    names = set(node_fills(root))
    assert "leak_small" in names and "leak_big" not in names
    assert "Focusing on: leak_small" in text
    out = tmp_path / "ignore.svg"
    heapscope(str(leaky_c.dump), "--ignore", "leak_big", "-o", str(out), cache=cache_dir)
    root, text = svg_texts(out)
    names = set(node_fills(root))
    assert "leak_small" in names and "leak_big" not in names
    assert "Ignoring: leak_big" in text


def test_base_diff_is_red_and_green(leaky_c: Any, leaky_cpp: Any, dot: str, cache_dir: Path,
                                    tmp_path: Path) -> None:
    out = tmp_path / "diff.svg"
    heapscope(str(leaky_c.dump), "--base", str(leaky_cpp.dump), "-o", str(out),
              cache=cache_dir)
    root, text = svg_texts(out)
    assert "Red: grew since the base; green: shrank" in text
    fills = node_fills(root)
    assert fills["leak_big"] == "#fbe3e3"  # only in the new dump: grew (red)
    assert "#e0f5e0" in fills.values()  # the C++ program's sites: shrank (green)
    strokes = {p.get("stroke") for p in root.iter(f"{SVG}path")}
    assert {"#b22222", "#228b22"} <= strokes  # edges coloured the same way
    # The same dump as its own base: nothing changed, nothing drawn.
    same = tmp_path / "same.svg"
    heapscope(str(leaky_c.dump), "--base", str(leaky_c.dump), "-o", str(same), cache=cache_dir)
    root, text = svg_texts(same)
    assert node_fills(root) == {} and "Showing 0 of 0 nodes" in text


def test_output_errors_are_one_line(leaky_c: Any, cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.dot"
    out.write_text("keep me")
    p = heapscope(str(leaky_c.dump), "-o", str(out), cache=cache_dir, check=False)
    # The one overwrite rule: exit 3, "exists: add --force to replace it".
    assert p.returncode == 3 and "add --force" in p.stderr and len(p.stderr.splitlines()) == 1
    assert out.read_text() == "keep me"
    heapscope(str(leaky_c.dump), "-o", str(out), "--force", cache=cache_dir)
    assert out.read_text().startswith("digraph")
    p = heapscope(str(leaky_c.dump), "-o", str(tmp_path / "nope" / "g.svg"), cache=cache_dir,
                  check=False)
    assert p.returncode == 3 and len(p.stderr.splitlines()) == 1, p.stderr
    p = heapscope(str(leaky_c.dump), "-o", str(tmp_path / "g.txt"), cache=cache_dir,
                  check=False)
    assert p.returncode == 2 and "--format" in p.stderr


def test_missing_dot_says_how_to_install(leaky_c: Any, cache_dir: Path,
                                         tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    out = tmp_path / "g.svg"
    p = heapscope(str(leaky_c.dump), "-o", str(out), cache=cache_dir,
                  env={"PATH": str(empty)}, check=False)
    assert p.returncode == 4, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "apt-get install graphviz" in p.stderr and "dnf install graphviz" in p.stderr
    assert not out.exists()
    # DOT text needs no Graphviz.
    heapscope(str(leaky_c.dump), "-o", str(tmp_path / "g.dot"), cache=cache_dir,
              env={"PATH": str(empty)})


def test_library_nodes_are_told_apart(leaky_cpp: Any, dot: str, cache_dir: Path,
                                      tmp_path: Path) -> None:
    """Every frame is drawn; libraries get a dashed outline, the program's code does not."""
    out = tmp_path / "g.dot"
    heapscope(str(leaky_cpp.dump), "-o", str(out), "--nodecount", "200",
              cache=cache_dir)
    nodes = {m.group(2): m.group(1) for m in re.finditer(
        r'^\s*(N\d+ \[.*?label="([^"\\]*)[^\n]*)$', out.read_text(), re.M)}
    std = [n for n in nodes if n.startswith("std::")]
    assert std and all("dashed" in nodes[n] for n in std), std
    assert "dashed" not in nodes["app::make_widgets"], nodes["app::make_widgets"]
    raw = tmp_path / "raw.dot"
    heapscope(str(leaky_cpp.dump), "-o", str(raw), "--frames", "raw", cache=cache_dir)
    assert "dashed" not in raw.read_text().replace('style="dashed"', "")
