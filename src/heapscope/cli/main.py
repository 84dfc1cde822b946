"""The ``heapscope`` command: parse arguments, dispatch to a subcommand, report errors."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Sequence

from heapscope import __version__
from heapscope.cli import (
    agent,
    attach,
    diff,
    env,
    export,
    flamegraph,
    graph,
    leaks,
    run,
    shell,
    timeline,
    top,
)
from heapscope.errors import HeapscopeError


def parser() -> argparse.ArgumentParser:
    """The full argument parser with every subcommand registered."""
    p = argparse.ArgumentParser(
        prog="heapscope",
        description="Find memory leaks in native processes with jemalloc's heap profiler.",
    )
    p.add_argument("--version", action="version", version=f"heapscope {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    run.register(sub)
    attach.register(sub)
    agent.register(sub)
    top.register(sub)
    leaks.register(sub)
    diff.register(sub)
    graph.register(sub)
    export.register(sub)
    flamegraph.register(sub)
    timeline.register(sub)
    shell.register(sub)
    env.register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the process exit status."""
    args = parser().parse_args(argv)
    try:
        rc: int = args.func(args)
        sys.stdout.flush()
        return rc
    except HeapscopeError as e:
        print(f"heapscope: error: {e}", file=sys.stderr)
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
