"""The interactive flame graph: one self-contained, offline HTML file.

The page embeds the call tree of :mod:`heapscope.analysis.tree` in its compact form and draws
it on a ``<canvas>`` (``web/assets/flamegraph.js``): hover details, click to zoom, search with
the matched total, inverted (callers) view, the four sample types, and a diff against a base.
Names, files and paths are shown as :func:`heapscope.terminal.clean` writes them (control and
direction characters as visible escapes), and embedded by :func:`heapscope.web.script_json`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heapscope.analysis.tree import KINDS, CallTree
from heapscope.files import write_output
from heapscope.inputs import picture_title
from heapscope.model import HEAP_SAMPLE_TYPES
from heapscope.terminal import clean
from heapscope.web import page

_BODY = """<header>
<h1 id="title"></h1>
<div id="controls">
<label>Show <select id="type"></select></label>
<input id="search" type="search" placeholder="Search (regex or text)" spellcheck="false"
 autocomplete="off" aria-label="search">
<label><input id="invert" type="checkbox"> Inverted (callers)</label>
<button id="reset" type="button">Reset</button>
</div>
<div id="status"><span id="total"></span> <span id="match"></span></div>
<div id="crumbs"></div>
</header>
<main id="chart"><canvas id="flame"></canvas></main>
<div id="tooltip" hidden></div>
<footer id="details"><span id="hint">Hover a frame for details; click to zoom;
Esc or Reset to go back.</span></footer>
<noscript>This flame graph needs JavaScript.</noscript>
"""


def flamegraph_data(tree: CallTree, *, title: str, sources: Sequence[str],
                    sample: str = "inuse_space",
                    base_sources: Sequence[str] = ()) -> dict[str, Any]:
    """Everything the viewer needs, as plain JSON-ready data (every text as it is shown)."""
    return {
        "format": "heapscope-flamegraph",
        "version": 1,
        "title": clean(title),
        "sources": [clean(s) for s in sources],
        "base_sources": [clean(s) for s in base_sources],
        "diff": tree.base is not None,
        "sample": sample,
        "types": [t.type for t in HEAP_SAMPLE_TYPES],
        "units": [t.unit for t in HEAP_SAMPLE_TYPES],
        "strings": [clean(s) for s in tree.strings],
        "kinds": list(KINDS),
        "tree": tree.to_json(),
    }


def default_title(sources: Sequence[str], base_sources: Sequence[str] = (),
                  labels: Sequence[str] = ()) -> str:
    """What the dumps are, by program, process and time (:func:`heapscope.inputs.
    picture_title`; ``labels`` name the processes of a session's dumps), with `` vs base``
    for a diff."""
    title = picture_title(sources, () if base_sources else labels)
    if base_sources:
        title += f" vs {picture_title(base_sources)}"
    return title


def render_flamegraph(tree: CallTree, *, title: str, sources: Sequence[str],
                      sample: str = "inuse_space", base_sources: Sequence[str] = ()) -> str:
    """The complete HTML document for ``tree``."""
    data = flamegraph_data(tree, title=title, sources=sources, sample=sample,
                           base_sources=base_sources)
    return page(f"heapscope flame graph: {title}", css=["flamegraph.css"],
                scripts=["flamegraph.js"], body=_BODY, data=data)


def write_flamegraph(path: str, tree: CallTree, *, force: bool = True, **kw: Any) -> int:
    """Write the HTML to ``path`` (whole or not at all; an existing file only replaced with
    ``force``); return its size in bytes."""
    text = render_flamegraph(tree, **kw)
    raw = text.encode("utf-8")
    write_output(path, raw, force)
    return len(raw)

