"""The subcommands: where each lives and its one-line summary.

The ``heapscope`` command imports only the module of the subcommand it runs (start-up time
matters: the analysis pulls in numpy and the symbolizers); the summaries here are enough to
list every subcommand in ``heapscope --help``.
"""

from __future__ import annotations

#: name -> (module, summary), in the order ``--help`` lists them.
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("heapscope.cli.run",
            "run a program under jemalloc heap profiling and report its leaks"),
    "attach": ("heapscope.cli.attach",
               "control the jemalloc heap profiler of a running process"),
    "agent": ("heapscope.cli.agent",
              "watch processes continuously; serve leak verdicts on /metrics"),
    "top": ("heapscope.cli.top", "top allocation sites of heap dumps (like jeprof --text)"),
    "leaks": ("heapscope.cli.leaks",
              "tell leaks from caches over a series of dumps, per process"),
    "diff": ("heapscope.cli.diff", "growth per allocation site from BASE to NEW"),
    "graph": ("heapscope.cli.graph", "draw a call graph of heap dumps (like jeprof --svg)"),
    "export": ("heapscope.cli.export",
               "write dumps as pprof, collapsed stacks, callgrind or JSON"),
    "flamegraph": ("heapscope.cli.flamegraph",
                   "write an interactive flame graph (one offline HTML file)"),
    "timeline": ("heapscope.cli.timeline",
                 "chart memory over time: RSS, heap per dump, top suspects"),
    "shell": ("heapscope.cli.shell", "interactive shell on a heap dump (like jeprof's prompt)"),
    "serve": ("heapscope.cli.serve",
              "browse sessions, dumps, leaks and diffs in a browser (one local URL)"),
    "env": ("heapscope.cli.env",
            "print the environment that turns on jemalloc heap profiling"),
}


def summary(name: str) -> str:
    """A subcommand's one-line summary."""
    return COMMANDS[name][1]
