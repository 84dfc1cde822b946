"""``heapscope export``: write a dump (or the sum of several) for other tools.

Formats: ``pprof`` (gzipped profile.proto for go tool pprof, Pyroscope, Parca), ``collapsed``
(folded stacks for flamegraph.pl, inferno, speedscope), ``callgrind`` (KCachegrind) and
``json`` (the whole model, for scripts).
"""

from __future__ import annotations

import argparse
import io
import sys

from heapscope.analysis.top import SAMPLE_INDEX, View, filtered
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_focus_options,
    add_input_options,
    add_output_options,
    add_sample_options,
    add_symbol_options,
    find_dumps,
    load_profiles,
    session_aliases,
    wrote,
)
from heapscope.errors import UsageError
from heapscope.files import check_output, write_output
from heapscope.model import Profile
from heapscope.progress import DelayedProgress
from heapscope.render.callgrind import render_callgrind
from heapscope.render.collapsed import render_collapsed
from heapscope.render.pprof import PprofOptions, file_build_ids, render_pprof
from heapscope.render.profile_json import render_profile_json

FORMATS = ("pprof", "collapsed", "callgrind", "json")
TEXT_FORMATS = ("collapsed", "callgrind", "json")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``export`` subcommand."""
    p = sub.add_parser(
        "export",
        help=summary("export"),
        description="Convert heap dumps (symbolized, unsampled, allocator frames removed) "
                    "for other tools: pprof (go tool pprof, Pyroscope, Parca), collapsed "
                    "stacks (flamegraph.pl, inferno, speedscope), callgrind (KCachegrind) "
                    "or JSON (scripts).",
    )
    p.add_argument("dumps", nargs="+", metavar="DUMP",
                   help="jemalloc heap dump (.heap, .heap.gz), a folder of dumps or a session")
    p.add_argument("--format", default="pprof", metavar="FORMAT",
                   help=f"one of {', '.join(FORMATS)} (default pprof)")
    add_output_options(p, "FILE", "output file ('-' = stdout)")
    add_sample_options(p)
    add_focus_options(p)
    p.add_argument("--thread", metavar="ID|NAME", help="only what this thread allocated")
    p.add_argument("--thread-labels", action="store_true",
                   help="pprof: one sample per stack and thread, labelled thread_id/thread")
    p.add_argument("--merge", action="store_true", help="export the sum of several dumps")
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def _check_output(path: str, fmt: str, force: bool) -> None:
    """Fail before any work when the output cannot or must not be written."""
    if path == "-" and fmt not in TEXT_FORMATS and sys.stdout.isatty():
        raise UsageError(f"--format {fmt} is binary: write it to a file, not a terminal")
    check_output(path, force)


def _write(path: str, data: bytes, force: bool) -> None:
    """Write ``data`` to ``path`` (``-``: standard output) by the overwrite rule."""
    if path == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    write_output(path, data, force)


def _load(args: argparse.Namespace) -> list[Profile]:
    paths = find_dumps(args, args.dumps, latest=True)
    if len(paths) > 1 and not args.merge:
        raise UsageError(
            f"{len(paths)} dumps given: add --merge to export their sum, or name one dump"
        )
    view = View(focus=args.focus, ignore=args.ignore)
    threads = bool(args.thread_labels) or args.format == "json"
    with DelayedProgress() as bar:
        return [filtered(p, view)
                for p in load_profiles(paths, args, bar.update, threads=threads,
                                       aliases=session_aliases(args.dumps))]


def render(fmt: str, profiles: list[Profile], args: argparse.Namespace) -> bytes:
    """The exported file's bytes."""
    index = SAMPLE_INDEX[args.sample]
    if fmt == "pprof":
        options = PprofOptions(
            thread_labels=bool(args.thread_labels),
            build_id=file_build_ids(args.sysroot, args.binary),
            comments=tuple(f"heapscope export of {p.source}" for p in profiles),
            default_sample_type=args.sample,
        )
        return render_pprof(profiles, options)
    buf = io.StringIO()
    if fmt == "collapsed":
        render_collapsed(buf, profiles, index)
    elif fmt == "callgrind":
        cmd = " ".join(p.source for p in profiles)
        render_callgrind(buf, profiles, index, args.sample, cmd=cmd)
    else:
        render_profile_json(buf, profiles)
    return buf.getvalue().encode("utf-8", "surrogateescape")


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope export``."""
    fmt = args.format
    if fmt not in FORMATS:
        raise UsageError(f"unknown format {fmt!r}: choose one of {', '.join(FORMATS)}")
    if args.thread_labels and fmt != "pprof":
        raise UsageError("--thread-labels applies to --format pprof only")
    _check_output(args.output, fmt, args.force)
    profiles = _load(args)
    data = render(fmt, profiles, args)
    if args.sample.startswith("alloc") and fmt in ("collapsed", "callgrind") and not any(
        p.total(SAMPLE_INDEX[args.sample]) for p in profiles
    ):
        print("heapscope: note: no allocation totals in this dump; they are recorded only with "
              "MALLOC_CONF=prof_accum:true", file=sys.stderr)
    _write(args.output, data, args.force)
    wrote(args.output, len(data), f"{fmt}, {len(profiles)} "
          f"{'dump' if len(profiles) == 1 else 'dumps'}")
    return 0
