"""``heapscope timeline SESSION``: memory over time (RSS, heap, top suspects) as HTML or PNG."""

from __future__ import annotations

import argparse
import os
import tempfile

from heapscope.analysis.filter import compile_re
from heapscope.analysis.series import group_by_pid
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_focus_options,
    add_output_options,
    add_symbol_options,
    add_top_option,
    print_diagnostics,
    symbol_options,
    wrote,
)
from heapscope.errors import UsageError
from heapscope.files import check_output, write_output
from heapscope.prepare import expand_inputs
from heapscope.progress import DelayedProgress
from heapscope.render.timeline import collect_timeline, render_html, render_svg, svg_to_png


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``timeline`` subcommand."""
    p = sub.add_parser(
        "timeline", help=summary("timeline"),
        description="Chart a session's memory over time: the RSS of each process "
                    "(rss.csv), the live heap estimated from each dump, and the live bytes of "
                    "the top leak suspects at each dump, as a self-contained HTML page or a "
                    "PNG image.")
    p.add_argument("session", metavar="SESSION",
                   help="a session folder written by heapscope run (or a folder of dumps)")
    add_output_options(p, "FILE.html|FILE.png|FILE.svg",
                       "where to write the chart (the format follows the extension)")
    add_top_option(p, 5, "suspects' lines")
    add_focus_options(p)
    add_symbol_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope timeline``."""
    ext = os.path.splitext(args.output)[1].lower()
    if ext not in (".html", ".htm", ".png", ".svg"):
        raise UsageError("-o must end in .html, .png or .svg")
    check_output(args.output, args.force)
    for pattern, option in ((args.focus, "--focus"), (args.ignore, "--ignore")):
        if pattern:
            compile_re(pattern, option)  # a bad pattern fails before any dump is read
    # counted in dumps across processes (with a rate and an ETA), not in processes
    dumps = group_by_pid(expand_inputs([args.session])) if os.path.isdir(args.session) else {}
    with DelayedProgress(dumps=dumps) as bar:
        tl = collect_timeline(args.session, symbol_options(args, [args.session]),
                              top=max(args.top, 0), progress=bar.update,
                              focus=args.focus, ignore=args.ignore)
        bar.update(f"writing {args.output}", 0, 0)
        if ext == ".png":
            # The converter opens its output by name and would follow a symlink planted at
            # it: it writes into a private folder, and the result is moved into place.
            with tempfile.TemporaryDirectory(prefix="heapscope-png-") as private:
                png = os.path.join(private, "timeline.png")
                tool = svg_to_png(render_svg(tl), png)
                with open(png, "rb") as f:
                    data = f.read()
        else:
            text = render_html(tl) if ext in (".html", ".htm") else render_svg(tl)
            data = text.encode("utf-8")
            tool = ""
        write_output(args.output, data, args.force)
    print_diagnostics(tuple(tl.diagnostics), args.verbose)
    how = f" with {tool}" if tool else ""
    drawn = tl.drawn()
    summed = f"; {tl.sums[0].process.removesuffix(' (sum)')} added up" if tl.sums else ""
    wrote(args.output, len(data), f"{len(drawn)} lines{summed}{how}")
    return 0
