"""The ``heapscope`` command: parse arguments, dispatch to a subcommand, report errors."""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from heapscope import __version__
from heapscope.cli.commands import COMMANDS, summary
from heapscope.errors import HeapscopeError

if TYPE_CHECKING:
    import argparse


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand the arguments name (their first word), if it is one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The argument parser. Given the arguments, only the subcommand they name is loaded
    (the others are listed by name and summary); without them, every subcommand is."""
    import argparse  # here: the symbolizer started ahead goes first (see main)

    p = argparse.ArgumentParser(
        prog="heapscope",
        description="Find memory leaks in native processes with jemalloc's heap profiler.",
    )
    from heapscope.native import core

    loops = "compiled" if core is not None else "pure Python"
    p.add_argument("--version", action="version", version=f"heapscope {__version__} ({loops} "
                                                          "loops)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = None if argv is None else _chosen(argv)
    for name, (module, _) in COMMANDS.items():
        if argv is None or name == chosen:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=summary(name))
    return p


# Subcommands that symbolize the dumps named on their command line.
_SYMBOLIZING = frozenset({"top", "diff", "graph", "export", "flamegraph", "shell", "leaks",
                          "timeline"})


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = _chosen(argv)
    if chosen in _SYMBOLIZING:
        # Before the subcommand's modules load: the program's llvm-symbolizer starts on the
        # other core meanwhile (see heapscope.symbols.ahead).
        from heapscope.symbols.ahead import start_for_args

        start_for_args(argv[argv.index(chosen) + 1:])
    try:
        return _dispatch(argv)
    finally:
        if "heapscope.symbols.llvm" in sys.modules:
            from heapscope.symbols.llvm import discard_ahead

            discard_ahead()
        if "heapscope.files" in sys.modules:
            from heapscope.files import IGNORED
            from heapscope.terminal import clean
            from heapscope.units import plural

            if IGNORED:
                print(f"heapscope: note: ignored {plural(len(IGNORED), 'cache file')} another user "
                      f"could have written ({clean(IGNORED[0])})", file=sys.stderr)
                IGNORED.clear()


def _dispatch(argv: list[str]) -> int:
    args = parser(argv).parse_args(argv)
    try:
        rc: int = args.func(args)
        sys.stdout.flush()
        return rc
    except HeapscopeError as e:
        from heapscope.terminal import clean

        # Messages name paths and quote dumps: shown with their control characters escaped.
        print(f"heapscope: error: {clean(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("heapscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `heapscope top … | head`: the reader went away; exit quietly like other tools.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


def entry() -> None:
    """Console-script entry point."""
    # A profile is hundreds of thousands of small tuples and no reference cycles; the cyclic
    # collector would rescan them again and again while they are built. The command is
    # short-lived, so switching it off costs nothing and saves up to a third of the run.
    gc.disable()
    sys.exit(main())


if __name__ == "__main__":
    entry()
