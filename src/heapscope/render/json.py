"""The ``top`` table as one JSON object, for scripts."""

from __future__ import annotations

import json
from typing import Any, TextIO

from heapscope.analysis.aggregate import Row, Table


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
            }
            for r in rows
        ],
    }


def render_json(out: TextIO, payload: Any) -> None:
    """Write ``payload`` as indented JSON followed by a newline."""
    json.dump(payload, out, indent=2)
    out.write("\n")
