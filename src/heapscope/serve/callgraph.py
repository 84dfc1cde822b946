"""The call graph tab: ``heapscope graph``'s DOT, drawn by Graphviz, made safe to show.

The page shows the SVG as an image (``<img src="data:image/svg+xml,…">``): an image runs no
script, loads nothing and is no part of the page's document, whatever text it holds. The SVG
is checked here as well before it is sent (:func:`check_svg`): only the elements Graphviz
draws a graph with, no event-handler attribute, no link, no style, no processing
instruction or entity. What a click needs (each node's box, its name and the focus pattern
that picks it) goes beside the picture as data; the page lays a transparent box over each
node, with the name as its tooltip.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from heapscope.analysis.aggregate import Key
from heapscope.analysis.graph import Graph
from heapscope.errors import ToolError
from heapscope.render.callgraph import draw, node_name, to_dot

SVG_NS = "{http://www.w3.org/2000/svg}"
# What Graphviz draws a graph with (a gradient fill adds the last four).
ELEMENTS = frozenset({"svg", "g", "title", "a", "polygon", "polyline", "path", "ellipse",
                      "text", "defs", "linearGradient", "radialGradient", "stop"})
_FORBIDDEN_TEXT = ("<?xml-stylesheet", "<!ENTITY", "<!ATTLIST", "<![CDATA[")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e-?\d+)?")
_SCALE = re.compile(r"scale\(\s*([-\d.e]+)(?:[\s,]+([-\d.e]+))?\s*\)")
_TRANSLATE = re.compile(r"translate\(\s*([-\d.e]+)(?:[\s,]+([-\d.e]+))?\s*\)")
_NODE_ID = re.compile(r"N\d+")

Box = tuple[float, float, float, float]  # x, y, width, height as fractions of the picture


def check_svg(svg: str) -> ET.Element:
    """The parsed SVG, when it holds only what Graphviz draws graphs with; else a ToolError
    naming what it should not hold."""
    for bad in _FORBIDDEN_TEXT:
        if bad in svg:
            raise ToolError(f"Graphviz wrote an SVG holding {bad}; it is not shown")
    try:
        root = ET.fromstring(svg)
    except ET.ParseError as e:
        raise ToolError(f"Graphviz wrote an SVG that is not XML: {e}") from None
    for el in root.iter():
        tag = el.tag.rsplit("}", 1)[-1] if isinstance(el.tag, str) else "?"
        if tag not in ELEMENTS or not el.tag.startswith(SVG_NS):
            raise ToolError(f"Graphviz wrote an SVG element <{tag}>; it is not shown")
        for name in el.attrib:
            local = name.rsplit("}", 1)[-1].lower()
            if local.startswith("on") or local in ("href", "style", "src"):
                raise ToolError(f"Graphviz wrote an SVG attribute {local}; it is not shown")
    return root


def _transform(root: ET.Element) -> tuple[float, float, float, float]:
    """(scale x, scale y, translate x, translate y) of the graph's top group."""
    group = root.find(f"{SVG_NS}g")
    text = group.get("transform", "") if group is not None else ""
    sx = sy = 1.0
    tx = ty = 0.0
    if m := _SCALE.search(text):
        sx = float(m.group(1))
        sy = float(m.group(2)) if m.group(2) else sx
    if m := _TRANSLATE.search(text):
        tx = float(m.group(1))
        ty = float(m.group(2)) if m.group(2) else 0.0
    return sx, sy, tx, ty


def _outline(group: ET.Element) -> list[tuple[float, float]]:
    """The corner points of a node's shape (its box, or its ellipse's bounding box)."""
    for el in group.iter():
        if el.tag == f"{SVG_NS}polygon":
            nums = [float(x) for x in _NUMBER.findall(el.get("points", ""))]
            return list(zip(nums[::2], nums[1::2], strict=False))
        if el.tag == f"{SVG_NS}ellipse":
            cx, cy = float(el.get("cx", 0)), float(el.get("cy", 0))
            rx, ry = float(el.get("rx", 0)), float(el.get("ry", 0))
            return [(cx - rx, cy - ry), (cx + rx, cy + ry)]
    return []


def node_boxes(root: ET.Element) -> tuple[float, float, dict[str, Box]]:
    """The picture's width and height (its viewBox) and each node's box by its DOT name
    (``N1``…), as fractions of the picture."""
    view = [float(x) for x in _NUMBER.findall(root.get("viewBox", ""))]
    if len(view) != 4 or view[2] <= 0 or view[3] <= 0:
        raise ToolError("Graphviz wrote an SVG without a viewBox")
    vx, vy, width, height = view
    sx, sy, tx, ty = _transform(root)
    boxes: dict[str, Box] = {}
    for group in root.iter(f"{SVG_NS}g"):
        title = group.find(f"{SVG_NS}title")
        if group.get("class") != "node" or title is None or \
                not _NODE_ID.fullmatch(title.text or ""):
            continue
        points = [((x + tx) * sx - vx, (y + ty) * sy - vy) for x, y in _outline(group)]
        if not points:
            continue
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        boxes[title.text or ""] = (min(xs) / width, min(ys) / height,
                                   (max(xs) - min(xs)) / width, (max(ys) - min(ys)) / height)
    return width, height, boxes


def focus_pattern(key: Key, granularity: str) -> str:
    """The focus regular expression that keeps the stacks through a node: its function by
    its whole name, its file by its lines, its module by its addresses."""
    if granularity == "files":
        if key.module and key.name == key.module:
            return "^" + re.escape(key.module) + r"\+0x"
        return "^" + re.escape(key.name) + ":"
    if granularity == "addresses":
        return "^" + re.escape(key.name.split(" ", 1)[0]) + "$"
    return "^" + re.escape(key.name) + "$"


def graph_doc(graph: Graph) -> dict[str, Any]:
    """The JSON of the call graph endpoints: the DOT text (``heapscope graph --format
    dot``), the SVG Graphviz draws from it (None, with a message, when it cannot), and each
    node's box, name, values and focus pattern."""
    dot = to_dot(graph)
    svg: str | None = None
    message = ""
    width = height = 0.0
    boxes: dict[str, Box] = {}
    try:
        text = draw(dot, "svg").decode("utf-8")
        width, height, boxes = node_boxes(check_svg(text))
        svg = text
    except ToolError as e:
        message = str(e)
    nodes = []
    for i, n in enumerate(graph.nodes, 1):
        box = boxes.get(f"N{i}")
        nodes.append({"id": f"N{i}", "name": n.key.name, "label": node_name(n, graph.granularity),
                      "file": n.key.file, "module": n.key.module, "flat": n.flat, "cum": n.cum,
                      "focus": focus_pattern(n.key, graph.granularity),
                      "box": list(box) if box else None})
    return {"dot": dot, "svg": svg, "message": message, "width": width, "height": height,
            "nodes": nodes, "sample_type": graph.sample_type, "unit": graph.unit,
            "total": graph.total, "diff": graph.diff, "granularity": graph.granularity,
            "shown_nodes": len(graph.nodes), "all_nodes": graph.all_nodes,
            "shown_edges": len(graph.edges), "all_edges": graph.all_edges}
