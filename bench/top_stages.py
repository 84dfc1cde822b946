#!/usr/bin/env python3
"""One cold ``heapscope top`` with its passes timed: the child process of bench/top_floor.py.

    python bench/top_stages.py DUMP OUT.json

Runs ``heapscope top --show-bytes DUMP`` in this process as the console script does (the
cyclic collector off), with a wrapper around each pass (reading, unsampling, symbolizing,
pruning, folding, storing, aggregation, rendering) and around each llvm-symbolizer run, and
records the (file, addresses) requests heapscope sends llvm-symbolizer. Writes the seconds per
pass, the time in main() and the requests to OUT.json; the parent measures the process's wall
time, so start-up (interpreter, imports, exit) is the difference. Imports nothing but the
standard library and heapscope, so start-up is heapscope's own.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Any

STAGES = (
    ("start", "start-up: interpreter, cli.main, symbolizer ahead, exit"),
    ("imports", "importing the subcommand's modules"),
    ("parser", "building the argument parser, parsing"),
    ("lookup", "looking for a stored result"),
    ("read", "reading the dump"),
    ("unsample", "unsampling"),
    ("symbolize", "symbolizing"),
    ("llvm", "  of which llvm-symbolizer runs (summed; they overlap)"),
    ("prune", "pruning allocator frames"),
    ("fold", "folding stacks to sites"),
    ("store", "storing the prepared profile"),
    ("aggregate", "aggregation (build_table)"),
    ("render", "rendering"),
    ("hints", "debug-info hints (dpkg asked while folding)"),
    ("other", "the rest of main()"),
)


def child(dump: str, out: str) -> None:
    """One ``heapscope top --show-bytes DUMP`` in this process, its passes timed; the
    times, the llvm-symbolizer requests and the time in main() go to ``out`` as JSON."""
    import threading

    t_imports = time.perf_counter()
    import heapscope.cli.main as cli
    import heapscope.symbols.ahead as ahead
    import heapscope.symbols.llvm as llvm

    imports = time.perf_counter() - t_imports
    spent: dict[str, float] = {}
    lock = threading.Lock()
    requests: dict[str, set[int]] = {}

    def timed(owner: Any, name: str, stage: str) -> None:
        inner = getattr(owner, name)

        def wrapper(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                with lock:
                    spent[stage] = spent.get(stage, 0.0) + time.perf_counter() - t0

        setattr(owner, name, wrapper)

    def recorded(name: str) -> None:
        inner = getattr(llvm.LlvmSymbolizer, name)

        def wrapper(self: Any, reqs: Any, alone: bool) -> Any:
            with lock:
                for path, vaddrs in reqs:
                    requests.setdefault(path, set()).update(vaddrs)
            return inner(self, reqs, alone)

        setattr(llvm.LlvmSymbolizer, name, wrapper)

    timed(llvm, "_run", "llvm")
    timed(llvm.Ahead, "finish", "llvm")
    timed(ahead, "start_for_args", "ahead")
    recorded("_run_lookup")
    dispatch = cli._dispatch

    def dispatched(argv: list[str]) -> int:
        # The subcommand's modules are imported here, as in a plain run: after main() has
        # started the program's llvm-symbolizer ahead.
        t0 = time.perf_counter()
        import heapscope.cli.common as common
        import heapscope.cli.top as top
        import heapscope.prepare as prep
        import heapscope.reuse as reuse

        spent["imports"] = time.perf_counter() - t0
        timed(cli, "parser", "parser")
        timed(common, "print_debug_hints", "hints")

        timed(prep, "load_cached", "read")
        timed(prep, "unsample", "unsample")
        timed(prep, "symbolize", "symbolize")
        timed(prep, "prune", "prune")
        timed(prep, "fold", "fold")
        timed(reuse, "store", "store")
        timed(reuse, "load", "lookup")
        timed(reuse, "identity", "lookup")
        timed(top, "build_table", "aggregate")
        timed(top, "render_table", "render")
        return int(dispatch(argv))

    cli._dispatch = dispatched
    gc.disable()  # as the console script's entry() does
    t0 = time.perf_counter()
    rc = cli.main(["top", "--show-bytes", dump])
    in_main = time.perf_counter() - t0
    sys.stdout.flush()
    Path(out).write_text(json.dumps({
        "rc": rc, "imports": imports, "main": in_main, "spent": spent,
        "requests": {p: sorted(v) for p, v in requests.items()}}))


if __name__ == "__main__":
    child(sys.argv[1], sys.argv[2])
