"""Writing the pictures a report suggests on request (``--html``)."""

from __future__ import annotations

import sys

from heapscope.errors import HeapscopeError
from heapscope.render.commands import commands
from heapscope.terminal import clean


def write_html(target: str, folder: str, *, force: bool = False) -> list[str]:
    """Write the flame graph (and, for a session, the timeline) into ``folder``, each with
    the command a user would type (which says what it wrote); a file already there is
    replaced only with ``force``."""
    from heapscope.cli.main import parser  # the same commands a user would type

    written = []
    for argv in commands(target, folder):
        out = argv[argv.index("-o") + 1]
        if not out.endswith(".html"):
            continue
        args = parser().parse_args(argv[1:] + (["--force"] if force else []))
        try:
            args.func(args)
            written.append(out)
        except HeapscopeError as e:
            print(f"heapscope: note: {argv[1]} not written: {clean(str(e))}", file=sys.stderr)
    return written
