"""A call Graph as Graphviz DOT text, and images made from it with ``dot``.

The drawing follows jeprof's (and pprof's): a box per node labelled with its name, flat value
and percent, and "of" its cumulative value when that differs; the font grows with the flat
value; edges are labelled with their value and drawn thicker and tighter the heavier they
are; a title box says where the data came from, the total and what was dropped. In a
``--base`` diff, growth is red and shrinkage green. Every name is escaped for DOT, so no
symbol (``operator<<``, quotes, backslashes, entities, markup) can change the graph or inject
markup into the SVG, and control and direction characters are drawn as visible escapes; long
names are shortened in the middle with the full name in the tooltip.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable

from heapscope.analysis.aggregate import Key
from heapscope.analysis.graph import Edge, Graph, Node
from heapscope.errors import ToolError, UsageError
from heapscope.files import check_output, write_output
from heapscope.inputs import dump_name, picture_title
from heapscope.terminal import clean
from heapscope.units import human_bytes, percent, plural
from heapscope.units import shorten as cut

FORMATS = ("svg", "png", "pdf", "gif", "dot")
MAX_LABEL = 60  # characters of a name shown in a node; the tooltip has the full name
INSTALL_HINT = ("install Graphviz (apt-get install graphviz, dnf install graphviz or "
                "apk add graphviz) or write a .dot file")

GROW = ("#b22222", "#fbe3e3", "#8b0000")  # border/edge, fill, text: new − base > 0
SHRINK = ("#228b22", "#e0f5e0", "#006400")  # new − base < 0
NEUTRAL = ("#555555", "#f8f8f8", "#000000")

# A name as graphviz draws it: a quote or backslash would end or change the string, ``&``
# starts an entity graphviz decodes (``&#27;`` would put a raw ESC into the SVG, which is then
# no longer XML), ``< > { } |`` are record-label syntax. Line breaks are heapscope's own
# (``\\n``, ``\\l``), never a name's: :func:`~heapscope.terminal.clean` shows those first.
_SPECIAL = {"\\": "\\\\", '"': '\\"', "&": "&amp;", "<": "\\<", ">": "\\>", "{": "\\{",
            "}": "\\}", "|": "\\|"}
_LABEL = str.maketrans(_SPECIAL)
# Graphviz reads a tooltip's backslashes twice (its escapes, then ``\\N``-style names), so a
# backslash that should stay one is written as four.
_TOOLTIP = str.maketrans({**_SPECIAL, "\\": "\\\\\\\\"})


def escape(text: str) -> str:
    """``text`` for a double-quoted DOT label, drawn exactly as :func:`clean` shows it.

    Control, direction and undecodable characters become visible escapes; then quotes,
    backslashes (so ``\\l`` or ``\\N`` in a name stay literal), ``&`` (so no entity is
    decoded) and the record-label characters ``< > { } |`` are escaped.
    """
    return clean(text).translate(_LABEL)


def escape_tooltip(text: str) -> str:
    """``text`` for a double-quoted DOT ``tooltip``: as :func:`escape`, with each backslash
    doubled once more for graphviz's second pass over tooltips."""
    return clean(text).translate(_TOOLTIP)


def shorten(name: str, limit: int = MAX_LABEL) -> str:
    """``name`` cut in the middle to ``limit`` characters (an ellipsis marks the cut)."""
    return cut(name, limit, keep="middle")


def format_value(v: float, unit: str, signed: bool = False) -> str:
    """A node or edge value: binary units for bytes, an integer count for objects."""
    text = human_bytes(v) if unit == "bytes" else str(int(v))
    return "+" + text if signed and v > 0 else text


def node_name(node: Node, granularity: str) -> str:
    """The full display name of a node at its granularity."""
    k = node.key
    if granularity == "lines":
        where = f"{k.file}:{k.line}" if k.file else "??:?"
        return f"{k.name}{' (inline)' if k.inlined else ''} {where}"
    return k.name


def _colors(value: float, diff: bool) -> tuple[str, str, str]:
    if not diff or value == 0:
        return NEUTRAL
    return GROW if value > 0 else SHRINK


def _title_lines(g: Graph) -> list[str]:
    lines = []
    # By program, process and time where a session says them (heapscope graph and the
    # viewer's graph read the same); a session's symbolized copy by its dump's own name.
    lines.append("heapscope: " + (picture_title(g.sources) if g.sources else "(no dump)"))
    if g.diff:
        bases = [dump_name(s) or s for s in g.base_sources]
        if len(bases) > 3:
            bases = [*bases[:2], f"… {len(bases) - 2} more"]
        lines.append("minus base: " + ", ".join(bases))
    lines.append(f"Type: {g.sample_type}")
    what = "Total (new − base)" if g.diff else "Total"
    lines.append(f"{what}: {format_value(g.total, g.unit, g.diff)}")
    if g.diff:
        lines.append(f"Percentages of the base total ({format_value(g.denominator, g.unit)})")
    if g.focus:
        lines.append(f"Focusing on: {g.focus}")
    if g.ignore:
        lines.append(f"Ignoring: {g.ignore}")
    if g.hide:
        lines.append(f"Hiding frames: {g.hide}")
    if g.show:
        lines.append(f"Showing only frames: {g.show}")
    shown = (f"Showing {len(g.nodes)} of {plural(g.all_nodes, 'node')}, {len(g.edges)} of "
             f"{plural(g.all_edges, 'edge')}")
    lines.append(shown)
    if g.dropped_nodes:
        lines.append(f"Dropped {plural(g.dropped_nodes, 'node')} (|cum| <= "
                     f"{format_value(g.node_cutoff, g.unit)} or beyond the top "
                     f"{len(g.nodes)})")
    if g.dropped_edges:
        lines.append(f"Dropped {plural(g.dropped_edges, 'edge')} (<= "
                     f"{format_value(g.edge_cutoff, g.unit)}"
                     " or between dropped nodes)")
    if g.diff:
        lines.append("Red: grew since the base; green: shrank")
    return lines


_NOT_OWN = {"library": "language runtime / standard library", "dependency": "third-party library",
            "wrapper": "allocation wrapper"}
_QUIET_TEXT = "#555555"


def _tooltip(lines: list[str]) -> str:
    """Tooltip lines, each escaped, joined by DOT line breaks."""
    return "\\n".join(escape_tooltip(line) for line in lines)


def _attrs(pairs: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f'{k}="{v}"' for k, v in pairs)


def _node_line(g: Graph, ident: str, n: Node, max_flat: float) -> str:
    full = node_name(n, g.granularity)
    denom = g.denominator
    flat = f"{format_value(n.flat, g.unit, g.diff)} ({percent(n.flat, denom)})"
    cum = f"{format_value(n.cum, g.unit, g.diff)} ({percent(n.cum, denom)})"
    label = escape(shorten(n.key.name)) + "\\n"
    if g.granularity == "lines":
        where = f"{n.key.file}:{n.key.line}" if n.key.file else "??:?"
        inline = " (inline)" if n.key.inlined else ""
        label += escape(shorten(where) + inline) + "\\n"
    label += escape(flat)
    if n.cum != n.flat:
        label += "\\nof " + escape(cum)
    head = full
    if n.key.module:
        head += f" [{n.key.module}]"
    if n.key.file and g.granularity == "functions":
        head += f" ({n.key.file})"
    tip = [head, f"flat {flat}", f"cum {cum}"]
    fontsize = 8.0
    if max_flat > 0 and n.flat:
        # pprof: 8 to 24 points, growing with the square root of the flat share.
        fontsize += math.ceil(16.0 * math.sqrt(min(abs(n.flat) / max_flat, 1.0)))
    border, fill, text = _colors(n.cum, g.diff)
    attrs = [("label", label), ("tooltip", _tooltip(tip)), ("fontsize", f"{fontsize:.0f}"),
             ("color", border), ("fillcolor", fill), ("fontcolor", text)]
    kind = g.kinds.get(n.key, "")
    if kind in _NOT_OWN:
        # Code that is not the program's own: a dashed outline and grey text, so the
        # program's own functions stand out; the tooltip says which.
        attrs[1] = ("tooltip", _tooltip([*tip, _NOT_OWN[kind]]))
        attrs[5] = ("fontcolor", _QUIET_TEXT)
        attrs.append(("style", "filled,dashed"))
    return f"  {ident} [" + _attrs(attrs) + "];"


def _edge_line(g: Graph, ids: dict[Key, str], e: Edge) -> str:
    share = abs(e.value) / g.denominator if g.denominator else 0.0
    weight = 1 + int(min(share * 100.0, 100.0))
    penwidth = 1.0 + min(share * 5.0, 5.0)
    value = format_value(e.value, g.unit, g.diff)
    tip = (f"{node_name(Node(e.caller, 0, 0), g.granularity)} -> "
           f"{node_name(Node(e.callee, 0, 0), g.granularity)} ({value})")
    border = _colors(e.value, g.diff)[0]
    tooltip = escape_tooltip(tip)
    attrs = [("label", " " + escape(value)), ("weight", str(weight)),
             ("penwidth", f"{penwidth:.2f}"), ("color", border), ("tooltip", tooltip),
             ("labeltooltip", tooltip)]
    if e.callee.inlined:
        attrs.append(("style", "dashed"))
    return f"  {ids[e.caller]} -> {ids[e.callee]} [{_attrs(attrs)}];"


def to_dot(g: Graph) -> str:
    """The graph as DOT text (deterministic: the same graph gives the same text)."""
    out = [
        'digraph "heapscope" {',
        '  graph [fontname="Helvetica", tooltip="heapscope call graph"];',
        '  node [shape=box, style=filled, fontname="Helvetica", margin="0.15,0.05"];',
        '  edge [fontname="Helvetica", fontsize=10, arrowsize=0.7];',
    ]
    title = "".join(escape(line) + "\\l" for line in _title_lines(g))
    out.append(f'  title [shape=plaintext, style="", fontsize=16, label="{title}", '
               f'tooltip="{escape_tooltip(" ".join(g.sources) or "heapscope")}"];')
    ids: dict[Key, str] = {}
    max_flat = max((abs(n.flat) for n in g.nodes), default=0.0)
    for i, n in enumerate(g.nodes, 1):
        ids[n.key] = f"N{i}"
        out.append(_node_line(g, f"N{i}", n, max_flat))
    for e in g.edges:
        out.append(_edge_line(g, ids, e))
    out.append("}")
    return "\n".join(out) + "\n"


def output_format(path: str, override: str | None = None) -> str:
    """The output format: ``override``, else the file's extension."""
    if override:
        fmt = override.lower().lstrip(".")
        if fmt not in FORMATS:
            raise UsageError(f"--format {override}: choose one of {', '.join(FORMATS)}")
        return fmt
    ext = os.path.splitext(path)[1].lower().lstrip(".")
    if path == "-":
        return "dot"
    if ext not in FORMATS:
        got = f"extension .{ext}" if ext else "no extension"
        raise UsageError(f"{path}: {got}; name the output .svg, .png, .pdf, .gif or .dot, "
                         "or give --format")
    return ext


def find_dot() -> str:
    """The path of Graphviz's ``dot``, or a ToolError saying how to install it."""
    dot = shutil.which("dot")
    if dot is None:
        raise ToolError(f"Graphviz's dot command was not found; {INSTALL_HINT}")
    return dot


def write_graph(g: Graph, path: str, fmt: str, *, force: bool = False) -> None:
    """Write the graph to ``path`` as ``fmt`` (DOT text, or an image made by ``dot``)."""
    if fmt not in FORMATS:
        raise UsageError(f"unknown graph format {fmt!r}")
    text = to_dot(g).encode("utf-8", "backslashreplace")
    dot = None if fmt == "dot" else find_dot()
    if path == "-":
        if dot is None:
            sys.stdout.buffer.write(text)
        else:
            sys.stdout.buffer.write(_run_dot(dot, fmt, text, None))
        sys.stdout.flush()
        return
    check_output(path, force)
    write_output(path, text if dot is None else _run_dot(dot, fmt, text, None), force)


def draw(dot_text: str, fmt: str = "svg") -> bytes:
    """DOT text drawn by Graphviz's ``dot`` as ``fmt`` (a ToolError when it cannot be)."""
    if fmt not in FORMATS or fmt == "dot":
        raise UsageError(f"unknown image format {fmt!r}")
    return _run_dot(find_dot(), fmt, dot_text.encode("utf-8", "backslashreplace"), None)


def _run_dot(dot: str, fmt: str, text: bytes, out: str | None) -> bytes:
    """Run ``dot -T<fmt> [-o out]`` once with the DOT text on stdin; return its stdout."""
    cmd = [dot, f"-T{fmt}"] + (["-o", out] if out else [])
    try:
        p = subprocess.run(cmd, input=text, capture_output=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        raise ToolError(f"{' '.join(cmd)} took more than 10 minutes; try a smaller "
                        "-n/--top") from None
    except OSError as e:
        raise ToolError(f"cannot run {dot}: {e.strerror or e}; {INSTALL_HINT}") from None
    if p.returncode != 0:
        err = p.stderr.decode("utf-8", "replace").strip().splitlines()
        why = err[-1] if err else f"exit status {p.returncode}"
        raise ToolError(f"{' '.join(cmd)} failed: {why}")
    return p.stdout
