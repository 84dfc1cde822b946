"""``heapscope attach PID ACTION``: control the heap profiler of a running process."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from heapscope.capture import attach as at
from heapscope.capture.conf import lg2
from heapscope.capture.mallctl import NOPROF_HINT, AttachError, Op, proc_state
from heapscope.cli.commands import summary
from heapscope.cli.common import add_symbol_options, add_top_option, symbol_options
from heapscope.cli.gates import add_gate_options, gate, thresholds
from heapscope.errors import HeapscopeError, UsageError
from heapscope.progress import DelayedProgress, RoundReporter
from heapscope.render.json import render_json
from heapscope.render.leaks import render_leaks
from heapscope.seriesview import GrowthEstimate, SeriesRounds
from heapscope.terminal import clean
from heapscope.units import human_bytes, parse_size, plural

ACTIONS = ("status", "dump", "start", "stop", "reset", "window", "watch")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``attach`` subcommand."""
    p = sub.add_parser(
        "attach", help=summary("attach"),
        description="Call jemalloc's mallctl in a running process: show its profiler's "
                    "state, make it dump, switch sampling on or off, or take a window/series "
                    "of dumps and report leaks. Through the helper of a process heapscope run "
                    "started; else one thread is held for a moment (no signal sent, the "
                    "others run on) and the calls run after it is let go. The process must "
                    "have been started with a profiling jemalloc and MALLOC_CONF=prof:true "
                    "(prof_active:false keeps sampling off until 'start').",
        usage="heapscope attach PID ACTION [options]",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pid", type=int, metavar="PID", help="the process")
    acts = p.add_subparsers(dest="action", metavar="ACTION")
    acts.required = True
    parsers: list[argparse.ArgumentParser] = []

    def action(name: str, text: str) -> argparse.ArgumentParser:
        a = acts.add_parser(name, help=text, description=text,
                            prog=f"heapscope attach PID {name}")
        parsers.append(a)
        a.add_argument("--timeout", type=float, default=60.0, metavar="S",
                       help="how long to wait for each call (default 60); one that has not "
                            "returned by then finishes by itself")
        a.add_argument("--retries", type=int, default=2, metavar="N",
                       help="try again up to N times while no thread can run the calls "
                            "(default 2)")
        return a

    def session_opts(a: argparse.ArgumentParser, dump_file: bool = False) -> None:
        a.add_argument("-o", "--output", "--session", dest="output",
                       metavar="DIR" if not dump_file else "PATH",
                       help="session folder (existing attach sessions are extended; default "
                            "a new heapscope-attach-<pid>-<time>)"
                       + ("; a path ending in .heap is the dump file itself" if dump_file
                          else ""))

    def report_opts(a: argparse.ArgumentParser) -> None:
        a.add_argument("--format", choices=("text", "json"), default="text",
                       help="text for people (default), json for programs")
        add_top_option(a, 10, "suspects")
        add_symbol_options(a)

    a = action("status", "jemalloc's version, profiling state, sample period and heap stats")
    a.add_argument("--format", choices=("text", "json"), default="text",
                       help="text for people (default), json for programs")
    a = action("dump", "make the process write a heap dump (prof.dump)")
    session_opts(a, dump_file=True)
    action("start", "activate sampling (prof.active=true)")
    action("stop", "deactivate sampling (prof.active=false)")
    a = action("reset", "forget every sample so far (prof.reset)")
    a.add_argument("--sample", metavar="BYTES",
                   help="new mean bytes between samples (rounded to a power of two)")
    a = action("window", "jemalloc's steady-state recipe: reset the profile, sample for N s, "
                         "stop, settle M s, dump: what was allocated in the window and is "
                         "still live, ranked (a dump taken first keeps the history)")
    a.add_argument("--seconds", type=float, required=True, metavar="N",
                   help="how long sampling runs after the reset")
    a.add_argument("--settle", type=float, default=None, metavar="M",
                   help="wait after sampling stops (default: as long as the window)")
    session_opts(a)
    report_opts(a)
    a = action("watch", "a dump every S seconds, then the leak report of the series")
    a.add_argument("--every", type=float, required=True, metavar="S",
                   help="seconds between dumps (a slow dump does not shift the next)")
    a.add_argument("--count", type=int, default=6, metavar="K",
                   help="dumps to take (default 6; Ctrl-C stops early and reports)")
    a.add_argument("--serve", action="store_true",
                   help="while the dumps are taken, show the session in the browser (as "
                        "heapscope serve does, each dump as it comes) and print its URL; it "
                        "stops with the watch, so the command ends when the series does; "
                        "heapscope serve SESSION shows it again")
    a.add_argument("--stay", action="store_true",
                   help="with --serve (implied): after the report, go on showing the "
                        "session until Ctrl-C or SIGTERM")
    session_opts(a)
    report_opts(a)
    add_gate_options(a, "the series")
    p.description = _wrapped(p.description or "") + "\n\nactions and their options " \
        "(heapscope attach PID ACTION --help says what each does):\n" + \
        "\n".join(_usage(a) for a in parsers)
    p.set_defaults(func=run)


def _wrapped(text: str) -> str:
    """A paragraph wrapped to the terminal's width, as argparse would."""
    import shutil
    import textwrap

    return textwrap.fill(text, max(40, min(shutil.get_terminal_size().columns, 100) - 2))


def _usage(a: argparse.ArgumentParser) -> str:
    """One action's usage (its options), indented for the list in ``attach --help`` and
    wrapped between options, never inside one."""
    import shutil

    width = max(40, min(shutil.get_terminal_size().columns, 100) - 2)
    words = [w for w in _options(" ".join(a.format_usage().split()[1:])) if w != "[-h]"]
    lines = ["  "]
    for w in words:
        if len(lines[-1]) + len(w) + 1 > width and lines[-1].strip():
            lines.append("      ")
        lines[-1] += ("" if lines[-1].isspace() else " ") + w
    return "\n".join(lines)


def _options(usage: str) -> list[str]:
    """A usage text cut into its words, a bracketed option (nested brackets too) as one."""
    words: list[str] = []
    depth = 0
    for part in usage.split(" "):
        if depth and words:
            words[-1] += " " + part
        else:
            words.append(part)
        depth += part.count("[") - part.count("]")
    return words


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope attach``."""
    if args.retries < 0 or args.timeout <= 0:
        raise UsageError("--retries must be >= 0 and --timeout > 0")
    ctl = at.Controller(args.pid, at.AttachOptions(timeout=args.timeout, retries=args.retries))
    handler = {"status": _status, "dump": _dump, "start": _start, "stop": _stop,
               "reset": _reset, "window": _window, "watch": _watch}[args.action]
    rc = handler(ctl, args)
    if args.action not in ("status",):
        sys.stderr.write(f"heapscope: {ctl.log.line()}\n")
    return rc


def _status(ctl: at.Controller, args: argparse.Namespace) -> int:
    st = ctl.status()
    if args.format == "json":
        render_json(sys.stdout, st)
        return 0
    out = sys.stdout
    # The command line, version and prefix are the target's: shown with control characters
    # escaped.
    cmd = shlex.join(st["cmdline"]) if st["cmdline"] else st["exe"]
    out.write(f"pid {st['pid']}  {clean(cmd)}\n")
    out.write(f"jemalloc   {clean(st['version'] or '?')}  ({clean(st['symbol'])})  "
              f"config.prof {_yn(st['config_prof'])}\n")
    # Without profiling, lg_sample reads as 0: there is no sample period to show.
    sample = f"{human_bytes(st['sample_bytes'])} (lg {st['lg_sample']})" \
        if st["sample_bytes"] and st["opt_prof"] else "-"
    out.write(f"profiling  opt.prof {_yn(st['opt_prof'])}  prof.active "
              f"{_yn(st['prof_active'])}  sample every {sample}  prefix "
              f"{clean(st['prof_prefix']) if st['prof_prefix'] is not None else '-'}\n")
    stats = "  ".join(f"{k} {human_bytes(v) if isinstance(v, int) else '?'}"
                      for k, v in st["stats"].items())
    out.write(f"heap       {stats}\n")
    box = st.get("container")
    if box:
        ident = "".join(f", {k} {clean(box[k])}" for k in ("container", "pod_uid") if k in box)
        out.write(f"container  pid {box['nspid']} in its own namespace, root "
                  f"{clean(box['root'])}{ident}: dumps pass through a private folder inside "
                  "it\n")
    a = st["attach"]
    held = a["stopped_s"] * 1000
    retried = f"; {a['retries']} retries" if a["retries"] else ""
    if a["mode"] == "helper":
        how = "through heapscope's helper in the process: no stop"
    elif a["mode"] == "stub":
        how = (f"one thread of {a['threads']} held {held:.1f} ms (the others ran on), the "
               f"calls ran on it once it was let go (thread {a['caller_tid']}){retried}")
    else:
        how = f"through gdb: held {held:.0f} ms, calls on thread {a['caller_tid']}{retried}"
    out.write(f"attach     {how}\n")
    if not st["opt_prof"]:
        out.write(f"note: profiling is off in this process; {NOPROF_HINT}\n")
    return 0


def _yn(v: object) -> str:
    return "?" if v is None else ("true" if v else "false")


def _facts(ctl: at.Controller) -> dict[str, Any]:
    st = ctl.status()
    if not st["opt_prof"]:
        raise AttachError(f"pid {ctl.pid} was started without heap profiling "
                             f"(opt.prof is false): {NOPROF_HINT}"
                             if st["config_prof"] else
                             f"pid {ctl.pid}: its jemalloc was built without profiling "
                             "(config.prof is false)")
    return at.jemalloc_facts(st)


def _dump(ctl: at.Controller, args: argparse.Namespace) -> int:
    if args.output and at.is_heap_file(args.output):
        path = os.path.abspath(args.output)
        at.check_dump_file(path)
        ctl.dump(path)
    else:
        session = at.open_session(ctl, args.output, _facts(ctl))
        path = at.next_dump_path(session, ctl.pid)
        ctl.dump(path)
    print(path)
    return 0


def _start(ctl: at.Controller, args: argparse.Namespace) -> int:
    was = ctl.set_active(True)
    print(f"pid {ctl.pid}: prof.active true (was {_yn(was)})")
    return 0


def _stop(ctl: at.Controller, args: argparse.Namespace) -> int:
    was = ctl.set_active(False)
    print(f"pid {ctl.pid}: prof.active false (was {_yn(was)})")
    return 0


def _reset(ctl: at.Controller, args: argparse.Namespace) -> int:
    lg = lg2(parse_size(args.sample, "--sample")) if args.sample else None
    now = ctl.reset(lg)
    period = f", sample every {human_bytes(1 << now)} (lg {now})" if now is not None else ""
    print(f"pid {ctl.pid}: profile reset{period}")
    return 0


def _window(ctl: at.Controller, args: argparse.Namespace) -> int:
    """jemalloc's steady-state recipe: forget every sample, sample for N s, stop sampling,
    let short-lived objects go for M s, dump. The dump then holds exactly what was
    allocated in the window and is still live; the dump taken first keeps the history that
    the reset forgets."""
    if args.seconds <= 0 or (args.settle is not None and args.settle < 0):
        raise UsageError("--seconds must be > 0 and --settle >= 0")
    settle = args.seconds if args.settle is None else args.settle
    session = at.open_session(ctl, args.output, _facts(ctl))
    before = at.next_dump_path(session, ctl.pid)
    was = bool(ctl.dump(before, [Op("prof.active", "bool")]).values.get("prof.active"))
    os.replace(before, before[:-len(".heap")] + ".before")  # kept aside, not a point
    before = before[:-len(".heap")] + ".before"
    restored = False
    try:
        ctl.reset(None)
        ctl.set_active(True)
        time.sleep(args.seconds)
        ctl.set_active(False)
        time.sleep(settle)
        window = at.next_dump_path(session, ctl.pid)
        ctl.dump(window, [Op("prof.active", "bool", was, True)])
        restored = True
    finally:
        if not restored:
            _restore(ctl, was)
    note = (f"window: what was allocated during the {args.seconds:g} s window and is still "
            f"live {settle:g} s after it (the profile was reset when it began; the heap "
            f"before it is in {before}); prof.active restored to {_yn(was)}")
    return _report(ctl, args, session, [window], "window", note,
                   {"seconds": args.seconds, "settle": settle, "before": before})


def _restore(ctl: at.Controller, was: bool) -> None:
    try:
        ctl.set_active(was)
    except HeapscopeError as e:
        sys.stderr.write(f"heapscope: could not restore prof.active={_yn(was)}: "
                         f"{clean(str(e))}\n")


def _watch(ctl: at.Controller, args: argparse.Namespace) -> int:
    """A dump every --every seconds, on a fixed rhythm (a slow round does not shift the
    ones after it). A round whose dump fails is counted, said and skipped, not the end of
    the series; the verdicts rest on the dumps taken, and a process whose lost rounds leave
    too little to rule a leak out is 'undecided', never 'clean'."""
    if args.every <= 0 or args.count < 2:
        raise UsageError("--every must be > 0 and --count at least 2")
    args.limits = thresholds(args)  # a bad size fails before the first dump
    session = at.open_session(ctl, args.output, _facts(ctl))
    viewer = None
    if args.serve or args.stay:
        from heapscope.cli.beside import SideViewer, inputs_of

        # attach has no frame options: the viewer names sites as heapscope serve does.
        viewer = SideViewer(inputs_of([session], symbol_options(args, [session])))
        viewer.start()
    try:
        rc = _series(ctl, args, session)
        if viewer is not None and args.stay:
            viewer.stay()
    finally:
        if viewer is not None:
            viewer.stop(session)
    return rc


def _series(ctl: at.Controller, args: argparse.Namespace, session: str) -> int:
    """The dumps of ``attach watch`` into ``session``, then their report."""
    dumps: list[str] = []
    missed = 0
    why = ""
    asked = 0
    ended = ""
    start = time.monotonic()
    # One line per round on a terminal, one every 15 s in a log (see RoundReporter).
    lines = SeriesRounds(session, RoundReporter(sys.stderr), of=args.count,
                         growth=GrowthEstimate(session))
    try:
        for k in range(args.count):
            wait = start + k * args.every - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            asked += 1
            path = at.next_dump_path(session, ctl.pid)
            try:
                got = ctl.dump(path)
                dumps.append(path)
                lines.round(k + 1, [ctl.pid], 0,
                            {} if got.mode == "helper" else {ctl.pid: got.stopped_s})
            except AttachError as e:
                if proc_state(ctl.pid) in (None, "Z", "X"):
                    asked -= 1
                    ended = f"pid {ctl.pid} exited after {plural(len(dumps), 'dump')}"
                    if len(dumps) < 2:
                        raise
                    break
                missed += 1
                why = str(e)
                lines.close()  # the round line held back comes before the miss
                sys.stderr.write(f"heapscope: round {k + 1} of {args.count} missed: "
                                 f"{clean(str(e))}\n")
    except KeyboardInterrupt:
        lines.close()
        if len(dumps) < 2:
            raise
        sys.stderr.write(f"heapscope: stopped after {plural(len(dumps), 'dump')}\n")
    lines.close()
    if len(dumps) < 2:
        raise AttachError(f"pid {ctl.pid}: only {len(dumps)} of {asked} rounds brought a dump, "
                          f"no series to judge (last: {why})")
    note = f"watch: {plural(len(dumps), 'dump')} every {args.every:g} s" + (
        f", {missed} of {asked} rounds missed" if missed else "") + (
        f"; {ended}" if ended else "")
    return _report(ctl, args, session, at.session_dumps(session, ctl.pid), "watch", note,
                   rounds={"rounds": asked, "missed_rounds": missed, "missed_why": why})


def _report(ctl: at.Controller, args: argparse.Namespace, session: str, dumps: Sequence[str],
            kind: str, note: str, window: dict[str, Any] | None = None,
            rounds: dict[str, Any] | None = None) -> int:
    with DelayedProgress() as bar:
        report = at.analyse(session, ctl.pid, list(dumps), symbol_options(args, [session]),
                            bar.update, rounds)
    if window is not None:
        report.window = window
        report.notes = []
    report.notes.insert(0, note)
    doc = at.write_report(session, ctl.pid, report, kind, ctl.log,
                          {"session": session, "dumps": list(dumps)})
    if args.format == "json":
        render_json(sys.stdout, doc)
    else:
        render_leaks(sys.stdout, report, top=args.top)
        sys.stdout.write(f"\nsession: {clean(session)}\n")
    limits = getattr(args, "limits", None)
    if limits is not None:
        sys.stdout.flush()  # the report comes before the gate's line
        return gate(report, *limits)
    return 0
