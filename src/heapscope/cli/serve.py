"""``heapscope serve PATH…``: the interactive viewer in a browser (see heapscope.serve)."""

from __future__ import annotations

import argparse
import os

from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_frame_options,
    add_input_options,
    add_symbol_options,
    frame_policy,
    symbol_options,
    trusted_uids,
)
from heapscope.errors import UsageError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``serve`` subcommand."""
    p = sub.add_parser(
        "serve", help=summary("serve"),
        description="Serve an interactive viewer of sessions, folders of dumps and dump "
                    "files on this machine, and print its URL (with a token every request "
                    "needs). In the browser: each session's processes, leak verdicts with "
                    "their evidence and timeline; each dump's top table, flame graph, "
                    "call graph, callers and callees and source lines; the diff of any two "
                    "dumps, or several added up; focus, ignore, hide and show patterns and "
                    "--own/--alloc-fn kept in the URL. A session still being written shows "
                    "its new dumps as they come.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a session (heapscope run -o), a folder of dumps, or dump files "
                        "(.heap, .heap.gz, symbolized .json.gz)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only; any "
                        "other prints a warning)")
    p.add_argument("--port", type=int, default=0,
                   help="port to listen on (default: a free one)")
    p.add_argument("--open", action="store_true", help="open the URL in a browser")
    p.add_argument("--source-path", action="append", default=[], metavar="DIR",
                   help="look for source files under DIR when they are not where the debug "
                        "info says (a tree built elsewhere; repeatable)")
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope serve``."""
    from heapscope.serve.server import serve
    from heapscope.serve.views import Settings

    for path in args.paths:
        if not os.path.exists(path):
            raise UsageError(f"{path}: no such file or folder")
    if not 0 <= args.port <= 65535:
        raise UsageError("--port must be 0 to 65535")
    uids = trusted_uids(args)
    settings = Settings(symbol_options(args, args.paths), frame_policy(args),
                        tuple(os.path.abspath(d) for d in args.source_path))
    try:
        return serve(args.paths, settings, host=args.host, port=args.port,
                     open_browser=args.open, trust_uids=uids)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") \
            from None
