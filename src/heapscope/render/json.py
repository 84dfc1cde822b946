"""The ``top`` table as one JSON object, for scripts; :func:`render_json` writes every JSON
report heapscope prints."""

from __future__ import annotations

from typing import Any, TextIO

from heapscope.analysis.aggregate import Row, Table
from heapscope.model import ViaFrame
from heapscope.safetext import json_text


def table_dict(table: Table, rows: tuple[Row, ...]) -> dict[str, Any]:
    """The JSON shape: sample_type, unit, total and rows in displayed order."""
    return {
        "sample_type": table.sample_type,
        "unit": table.unit,
        "total": table.total,
        "rows": [
            {
                "name": r.key.name,
                "file": r.key.file,
                "line": r.key.line,
                "module": r.key.module,
                "flat": r.flat,
                "cum": r.cum,
                "via": via_list(r.via),
                "leaf": r.via[0].text if r.via else row_leaf(r),
            }
            for r in rows
        ],
    }


def via_list(via: tuple[ViaFrame, ...]) -> list[dict[str, Any]]:
    """JSON form of a via chain: the frames folded into a site, innermost first (the
    outermost, what the program's own code called, last)."""
    return [{"function": f.function, "file": f.file, "line": f.line, "module": f.module,
             "kind": f.kind} for f in via]


def row_leaf(r: Row) -> str:
    """A row's own name as ``function file:line`` (its leaf when nothing was folded)."""
    k = r.key
    return f"{k.name} {k.file}:{k.line}" if k.file and k.line else k.name


def render_json(out: TextIO, payload: Any) -> None:
    """Write ``payload`` as indented JSON followed by a newline: ASCII, every control
    character escaped, undecodable bytes as ``\\xNN`` text (:func:`json_text`)."""
    out.write(json_text(payload, indent=2))
    out.write("\n")
