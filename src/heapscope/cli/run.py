"""``heapscope run -- CMD …``: launch a program under heap profiling and report its leaks."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from heapscope.capture.runner import RunOptions, SessionResult, run_session
from heapscope.cli.beside import SideViewer, inputs_of
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_frame_options,
    add_symbol_options,
    add_top_option,
    frame_policy,
    print_diagnostics,
    symbol_options,
)
from heapscope.cli.gates import add_gate_options, gate, thresholds
from heapscope.cli.pictures import write_html
from heapscope.errors import UsageError
from heapscope.progress import DelayedProgress, RoundReporter
from heapscope.render.report import render_report
from heapscope.seriesview import GrowthEstimate, SeriesRounds
from heapscope.terminal import clean
from heapscope.units import parse_size

#: Exit status of ``--fail-on-leak`` when the program itself succeeded but leaked.



def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``run`` subcommand."""
    p = sub.add_parser(
        "run", help=summary("run"),
        description="Run CMD with a profiling jemalloc, follow its child processes, and "
                    "report what was still allocated at exit. Everything lands in a session "
                    "folder that every other command can open.",
        usage="heapscope run [options] -- CMD [ARGS...]")
    p.add_argument("-o", "--output", metavar="DIR",
                   help="session folder (default: a new heapscope-<prog>-<time> here)")
    p.add_argument("--sample", metavar="BYTES", help="mean bytes between samples "
                   "(default 512k; smaller is more precise and slower)")
    p.add_argument("--interval", metavar="BYTES",
                   help="also dump every BYTES allocated (a series to see growth)")
    p.add_argument("--every", type=float, metavar="SECONDS",
                   help="also dump every SECONDS, for a series over time: each process "
                        "through the helper heapscope preloads (no stop), else as heapscope "
                        "attach does")
    p.add_argument("--gdump", action="store_true", help="also dump at each new memory high")
    p.add_argument("--accum", action="store_true",
                   help="also record allocation totals (for --alloc-space/--alloc-objects)")
    p.add_argument("--conf", default="", metavar="RAW",
                   help="extra MALLOC_CONF options, passed through as they are")
    p.add_argument("--jemalloc", metavar="PATH", help="the libjemalloc.so to preload")
    p.add_argument("--user", metavar="USER",
                   help="the user the program runs as once started (a server that drops "
                        "privileges): it alone may write the dumps folder. Found by itself "
                        "for runuser -u, sudo -u, setpriv --reuid, su, gosu, su-exec, chpst")
    p.add_argument("--no-helper", action="store_true",
                   help="do not preload heapscope's helper (a control thread in each process, "
                        "so --every never stops it): for a program that must stay "
                        "single-threaded; --every then reaches it like attach does")
    add_gate_options(p, "total")
    p.add_argument("--no-symbolize", action="store_true",
                   help="do not symbolize now (the session then needs the binaries later)")
    add_top_option(p, 5, "suspects")
    p.add_argument("--html", action="store_true",
                   help="also write flamegraph.html and timeline.html into the session")
    p.add_argument("--serve", action="store_true",
                   help="while the program runs, show the session in the browser (as "
                        "heapscope serve does; with --every it gains each dump as it comes) "
                        "and print its URL before the program starts. The viewer stops with "
                        "the run, so the run ends when the program does, in a script as at "
                        "a terminal; heapscope serve SESSION shows it again")
    p.add_argument("--stay", action="store_true",
                   help="with --serve (implied): once the program has ended and the report "
                        "is printed, go on showing the finished session until Ctrl-C or "
                        "SIGTERM; the exit status is still the program's")
    add_frame_options(p)
    add_symbol_options(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="CMD",
                   help="the program to run and its arguments, after --")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope run``."""
    cmd = list(args.command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("no command given: heapscope run [options] -- CMD [ARGS...]")
    opts = RunOptions(
        output=args.output,
        sample=parse_size(args.sample, "--sample") if args.sample else None,
        interval=parse_size(args.interval, "--interval") if args.interval else None,
        gdump=args.gdump,
        accum=args.accum,
        extra_conf=args.conf,
        jemalloc=args.jemalloc,
        symbolize=not args.no_symbolize,
        symbol_options=symbol_options(args),
        every=args.every,
        frames=frame_policy(args),
        user=args.user,
        helper=not args.no_helper,
    )
    if args.every is not None and args.every <= 0:
        raise UsageError("--every needs a positive number of seconds")
    leak_limit, live_limit = thresholds(args)
    # The viewer of --serve, once the session exists (a list: the callback fills it).
    viewers: list[SideViewer] = []

    def start_viewer(path: str) -> None:
        viewer = SideViewer(inputs_of([path], opts.symbol_options, opts.frames))
        viewers.append(viewer)
        viewer.start()

    rounds: list[SeriesRounds] = []

    def on_session(path: str) -> None:
        if args.every is not None:
            rounds.append(SeriesRounds(path, RoundReporter(sys.stderr),
                                       growth=GrowthEstimate(path)))
        if args.serve or args.stay:
            start_viewer(path)

    def on_round(n: int, pids: list[int], got: dict[int, tuple[str | None, str]],
                 pauses: dict[int, float]) -> None:
        for r in rounds:
            r.round(n, pids, sum(1 for why, _how in got.values() if why is not None), pauses)

    try:
        # Lazy: nothing is drawn while the program runs (its output shares the terminal);
        # the rounds of --every say their own lines (see RoundReporter).
        with DelayedProgress(lazy=True) as bar:
            try:
                res = run_session(cmd, opts, after_run(rounds, bar), on_session, on_round)
            finally:
                for r in rounds:
                    r.close()
        status = _report(args, res, leak_limit, live_limit)
        if args.stay:
            for viewer in viewers:
                viewer.stay()
    finally:
        for viewer in viewers:
            viewer.stop(viewer.inputs.paths[0])
    return status


def after_run(rounds: list[SeriesRounds], bar: DelayedProgress
              ) -> Callable[[str, int, int], None]:
    """The progress callback of the work after the program ended: its first call also
    writes the last round line if the throttle held it back, before symbolizing begins."""
    def progress(description: str, done: int, total: int) -> None:
        for r in rounds:
            r.close()
        bar.update(description, done, total)
    return progress


def _report(args: argparse.Namespace, res: SessionResult, leak_limit: int | None,
            live_limit: int | None) -> int:
    """Print the run's report; the exit status: the program's, or the gates'."""
    print_diagnostics(tuple(res.diagnostics), args.verbose)
    if args.verbose and res.leaks.wrappers.describe():
        print(f"heapscope: {clean(res.leaks.wrappers.describe())}", file=sys.stderr)
    render_report(sys.stderr, res, top=args.top)
    if args.html and res.leaks.processes:
        write_html(res.path, res.path)  # each picture's command says what it wrote
    status = res.result.exit_status
    if status == 0:
        return gate(res.leaks, leak_limit, live_limit)
    return status
