"""``heapscope diff BASE NEW``: growth per site between two dumps, sessions or folders.

Sites are matched by name after symbolization, so the two sides may come from different
processes, restarts or machines. The same as ``heapscope top NEW --base BASE``. The text
names both sides with their totals and the change, then signs every row's change; a growing
row's share is of all growth, a shrinking row's of all shrinkage (a footer says so).
"""

from __future__ import annotations

import argparse

from heapscope.cli import top
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_frame_options,
    add_input_options,
    add_symbol_options,
    add_view_options,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``diff`` subcommand."""
    p = sub.add_parser("diff", help=summary("diff"),
                       description="Show what grew (and shrank) per allocation site from BASE "
                                   "to NEW; sites are matched by name, so any two processes, "
                                   "restarts or hosts can be compared.")
    p.add_argument("base", metavar="BASE", help="the earlier dump, session or folder")
    p.add_argument("new", metavar="NEW", help="the later dump, session or folder")
    add_view_options(p)
    p.add_argument("--format", choices=("text", "json"), default="text",
                       help="text for people (default), json for programs")
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope diff`` through the top view."""
    args.dumps = [args.new]
    args.base = args.base
    args.thread = None
    args.merge = True
    args.interactive = False
    return top.run(args)
