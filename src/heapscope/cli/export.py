"""``heapscope export``: write a dump (or the sum of several) for other tools.

Formats: ``pprof`` (gzipped profile.proto for go tool pprof, Pyroscope, Parca), ``collapsed``
(folded stacks for flamegraph.pl, inferno, speedscope), ``callgrind`` (KCachegrind) and
``json`` (the whole model, for scripts).
"""

from __future__ import annotations

import argparse
import io
import os
import sys

from heapscope.analysis.top import SAMPLE_INDEX, View, filtered
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_input_options,
    add_sample_options,
    add_symbol_options,
    find_dumps,
    load_profiles,
    session_aliases,
)
from heapscope.errors import InputError, UsageError
from heapscope.files import replace_atomically
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
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="output file ('-' = stdout)")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")
    add_sample_options(p)
    p.add_argument("--focus", metavar="RE", help="keep only stacks with a frame matching RE")
    p.add_argument("--ignore", metavar="RE", help="drop stacks with a frame matching RE")
    p.add_argument("--thread", metavar="ID|NAME", help="only what this thread allocated")
    p.add_argument("--thread-labels", action="store_true",
                   help="pprof: one sample per stack and thread, labelled thread_id/thread")
    p.add_argument("--merge", action="store_true", help="export the sum of several dumps")
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def _check_output(path: str, fmt: str, force: bool) -> None:
    """Fail before any work when the output cannot or must not be written."""
    if path == "-":
        if fmt not in TEXT_FORMATS and sys.stdout.isatty():
            raise UsageError(f"--format {fmt} is binary: write it to a file, not a terminal")
        return
    if os.path.isdir(path):
        raise InputError(path, "is a directory")
    if os.path.lexists(path) and not force:
        raise InputError(path, "already exists (use --force to overwrite it)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(path, f"cannot write: no such directory {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(path, f"cannot write: permission denied in {folder}")


def _write(path: str, data: bytes, force: bool) -> None:
    """Write ``data`` to ``path``: a new file, or (``force``) replace it atomically."""
    if path == "-":
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        if not force:
            with open(path, "xb") as fh:
                fh.write(data)
            return
        replace_atomically(path, data)
    except FileExistsError:
        raise InputError(path, "already exists (use --force to overwrite it)") from None
    except OSError as e:
        raise InputError(path, f"cannot write: {e.strerror or e}") from None


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
    return 0
