"""Command-line options shared by several subcommands, and their translation to options."""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
from collections.abc import Mapping as MappingT

from heapscope.analysis.aggregate import GRANULARITIES
from heapscope.analysis.filter import select_threads
from heapscope.analysis.fold import FramePolicy, Wrappers
from heapscope.analysis.prune import is_allocator_module
from heapscope.analysis.top import SAMPLE_INDEX, View
from heapscope.errors import InputError, UsageError
from heapscope.inputs import per_process as per_process
from heapscope.inputs import processes_title as processes_title
from heapscope.inputs import recorded_facts as recorded_facts
from heapscope.inputs import series_wrappers
from heapscope.inputs import session_aliases as session_aliases
from heapscope.inputs import session_facts as session_facts
from heapscope.model import Profile
from heapscope.prepare import ProgressFn, prepare
from heapscope.progress import DUMPS_READ
from heapscope.symbols import Diagnostic, SymbolOptions
from heapscope.symbols.hints import Missing, Owners, cached_owners, debug_hints
from heapscope.symbols.options import default_cache_dir
from heapscope.terminal import clean
from heapscope.units import plural


def add_symbol_options(p: argparse.ArgumentParser) -> None:
    """Options telling the symbolizer where binaries and debug info are."""
    g = p.add_argument_group("symbols")
    g.add_argument("--binary", action="append", default=[], metavar="FILE",
                   help="use FILE for the module with the same name or build-id "
                        "(a single --binary also stands for the main executable)")
    g.add_argument("--search-path", action="append", default=[], metavar="DIR",
                   help="look for binaries in DIR (by base name and by full path under DIR)")
    g.add_argument("--sysroot", metavar="DIR",
                   help="resolve the dump's paths under DIR (dumps from containers/other hosts)")
    g.add_argument("--debug-dir", action="append", default=[], metavar="DIR",
                   help="a folder holding .build-id/xx/rest.debug files (repeatable)")
    g.add_argument("--force-symbols", action="store_true",
                   help="name code even from a file that differs from the one recorded when "
                        "the dump was taken (rebuilt, replaced, deleted): names may be wrong")
    g.add_argument("--no-cache", action="store_true",
                   help="do not read or write the symbol cache ($HEAPSCOPE_CACHE_DIR)")
    g.add_argument("-v", "--verbose", action="store_true",
                   help="also print informational notes about symbols")


def add_input_options(p: argparse.ArgumentParser) -> None:
    """Which files found in folders other users can write to are read."""
    p.add_argument("--trust-owner", action="append", default=[], metavar="USER",
                   help="also read dumps owned by USER found in a folder other users can "
                        "write to (/tmp, a mode-1777 folder); by default only yours, root's "
                        "and the folder owner's are read there")


def trusted_uids(args: argparse.Namespace) -> list[int]:
    """The users ``--trust-owner`` names, as uids; UsageError for one this host lacks."""
    from heapscope.formats.trust import uid_of

    uids = []
    for user in getattr(args, "trust_owner", []):
        uid = uid_of(user)
        if uid is None:
            raise UsageError(f"--trust-owner {user}: no such user on this host")
        uids.append(uid)
    return uids


def find_dumps(args: argparse.Namespace, paths: list[str], *,
               latest: bool = False) -> list[str]:
    """The dump files the arguments name (:func:`heapscope.prepare.expand_inputs`); files
    left out of shared folders are named on stderr, and kept in ``args.ignored_dumps``."""
    from heapscope.formats.trust import Ignored
    from heapscope.prepare import expand_inputs
    from heapscope.terminal import clean

    uids = trusted_uids(args)
    ignored: list[Ignored] = []
    found = expand_inputs(paths, latest=latest, ignored=ignored, trust_uids=uids)
    seen: list[Ignored] = getattr(args, "ignored_dumps", [])
    seen.extend(ignored)
    args.ignored_dumps = seen
    for item in ignored[:5]:
        print(f"heapscope: left out {clean(item.path)}: {item.reason}", file=sys.stderr)
    if len(ignored) > 5:
        print(f"heapscope: left out {plural(len(ignored) - 5, 'more file')} for the same reasons",
              file=sys.stderr)
    return found


def add_frame_options(p: argparse.ArgumentParser) -> None:
    """How stacks are shown: folded to the program's own line (the site), or raw."""
    g = p.add_argument_group("frames")
    g.add_argument("--frames", choices=("site", "raw"), default="site",
                   help="site (default): each allocation is named by the first frame of the "
                        "program's own code, the library and wrapper frames it went through "
                        "shown as 'via'; raw: by the first frame outside the allocator")
    g.add_argument("--own", action="append", default=[], metavar="RE",
                   help="modules or source files matching RE are the program's own code "
                        "(repeatable; also $HEAPSCOPE_OWN), e.g. to debug a library itself")
    g.add_argument("--alloc-fn", action="append", default=[], metavar="RE",
                   help="functions matching RE are allocation wrappers, folded like malloc "
                        "(repeatable; also $HEAPSCOPE_ALLOC_FN)")
    g.add_argument("--not-alloc-fn", action="append", default=[], metavar="RE",
                   help="functions matching RE are never treated as allocation wrappers")


def frame_policy(args: argparse.Namespace) -> FramePolicy:
    """The frame policy the options (and environment) ask for; raw when the command has
    no such options."""
    if not hasattr(args, "frames"):
        return FramePolicy(mode="raw")
    return FramePolicy.from_env(args.frames, args.own, args.alloc_fn, args.not_alloc_fn)


_SAMPLE_HELP = {
    "inuse_space": "bytes still in use at the dump (default)",
    "inuse_objects": "objects still in use at the dump",
    "alloc_space": "bytes allocated since the start (needs MALLOC_CONF=prof_accum:true)",
    "alloc_objects": "objects allocated since the start (needs prof_accum:true)",
}
_GRANULARITY_HELP = {
    "functions": "a row per function (default)",
    "lines": "a row per source line",
    "files": "a row per source file",
    "addresses": "a row per code address",
}


def add_sample_options(p: argparse.ArgumentParser) -> None:
    """The four sample types, jeprof's options in today's spelling."""
    g = p.add_mutually_exclusive_group()
    for name in SAMPLE_INDEX:
        g.add_argument("--" + name.replace("_", "-"), dest="sample", action="store_const",
                       const=name, help=_SAMPLE_HELP[name])
    p.set_defaults(sample="inuse_space")


def add_view_options(p: argparse.ArgumentParser) -> None:
    """Options that shape a top view (shared with the interactive shell)."""
    add_sample_options(p)
    g = p.add_mutually_exclusive_group()
    for gran in GRANULARITIES:
        g.add_argument("--" + gran, dest="granularity", action="store_const", const=gran,
                       help=_GRANULARITY_HELP[gran])
    p.set_defaults(granularity="functions")
    p.add_argument("--cum", action="store_true", help="sort by cumulative value")
    add_top_option(p, 20, "rows")
    add_focus_options(p)
    add_frame_filter_options(p)
    p.add_argument("--show-bytes", action="store_true", help="print bytes, not MiB")


def add_top_option(p: argparse.ArgumentParser, default: int, what: str, *,
                   zero: str = "all") -> None:
    """``-n/--top N``: how many rows (sites, suspects, nodes) a command shows; the same name
    in every command. jeprof's ``--nodecount`` is accepted as another name for it."""
    p.add_argument("-n", "--top", "--nodecount", dest="top", type=_count, default=default,
                   metavar="N", help=f"show {what}: the first N (0 = {zero}; default {default})")


def _count(text: str) -> int:
    """A row count: a whole number >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n} is negative: give 0 (no limit) or more")
    return n


def add_focus_options(p: argparse.ArgumentParser) -> None:
    """``--focus`` and ``--ignore``: which stacks a command looks at, by their frames."""
    p.add_argument("--focus", metavar="RE", help="keep only stacks with a frame matching RE")
    p.add_argument("--ignore", metavar="RE", help="drop stacks with a frame matching RE")


def add_output_options(p: argparse.ArgumentParser, metavar: str, what: str, *,
                       required: bool = True) -> None:
    """``-o/--output`` and ``--force``: where a command writes, and leave to replace a file
    that exists (refused otherwise: see :func:`heapscope.files.check_new_output`)."""
    p.add_argument("-o", "--output", required=required, metavar=metavar, help=what)
    p.add_argument("--force", action="store_true",
                   help="replace the output if it exists (refused otherwise)")


def wrote(path: str, size: int, detail: str = "") -> None:
    """The one line a command prints after writing a file (``-o``), on stderr:
    ``heapscope: wrote PATH (SIZE, DETAIL)``; nothing for ``-`` (standard output)."""
    if path == "-":
        return
    from heapscope.units import human_bytes

    more = f", {detail}" if detail else ""
    print(f"heapscope: wrote {clean(path)} ({human_bytes(size)}{more})", file=sys.stderr)


def add_frame_filter_options(p: argparse.ArgumentParser) -> None:
    """pprof's ``--hide`` and ``--show``: which frames of the stacks are shown."""
    p.add_argument("--hide", metavar="RE",
                   help="drop frames matching RE from the stacks (their values stay with "
                        "the rest of the stack)")
    p.add_argument("--show", metavar="RE",
                   help="keep only frames matching RE in the stacks (their values stay)")


def view_from_args(args: argparse.Namespace) -> View:
    """The View described by parsed arguments."""
    return View(args.sample, args.granularity, args.cum, args.top, args.focus,
                args.ignore, args.show_bytes, args.hide, args.show)


def symbol_options(args: argparse.Namespace, inputs: list[str] | None = None
                   ) -> SymbolOptions:
    """Build SymbolOptions from parsed arguments, with what the sessions among ``inputs``
    (session folders, or dumps inside one) recorded of their modules."""
    global _hint_cache
    _hint_cache = None if args.no_cache else default_cache_dir()
    return SymbolOptions(
        binaries=tuple(args.binary),
        search_paths=tuple(args.search_path),
        sysroot=args.sysroot,
        debug_dirs=tuple(args.debug_dir),
        cache_dir=None if args.no_cache else default_cache_dir(),
        recorded=recorded_facts(inputs or []),
        force=bool(getattr(args, "force_symbols", False)),
    )


def print_diagnostics(diags: tuple[Diagnostic, ...], verbose: bool, *,
                      hints: bool = True) -> None:
    """Write symbolizer notes to stderr: warnings always, info only when verbose; then, unless
    ``hints`` is False, how to get the debug info the modules that matter lack
    (:func:`print_debug_hints`)."""
    seen: set[str] = set()
    for d in diags:
        if d.level != "warning" and not verbose:
            continue
        text = str(d)
        if text not in seen:
            seen.add(text)
            # Paths and names come from dumps: no escape sequence reaches the terminal.
            print(f"heapscope: {clean(text)}", file=sys.stderr)
    if hints:
        print_debug_hints(diags)


# A module without debug info earns a hint when its code is on the stacks of at least this
# share of one dump's bytes: below that its missing names change no conclusion.
HINT_SHARE = 0.01
_hinted: set[str] = set()  # module files hinted about by this command (once each)
# Where the hints keep dpkg's answers: the symbol cache's folder (None under --no-cache; set
# by symbol_options, which every command that symbolizes calls first).
_hint_cache: str | None = None


def _wanted_hints(diags: tuple[Diagnostic, ...] | list[Diagnostic]) -> list[Missing]:
    """The modules :func:`print_debug_hints` would hint about now."""
    share: dict[str, float] = {}
    missing: dict[str, Missing] = {}
    for d in diags:
        # Allocator frames (libjemalloc) are pruned from every report: their names do not
        # matter.
        if d.path and d.path not in _hinted and not is_allocator_module(d.module):
            share[d.path] = max(share.get(d.path, 0.0), d.share)
            missing.setdefault(d.path, Missing(d.module, d.path, d.build_id))
    return [m for path, m in missing.items() if share[path] >= HINT_SHARE]


# The hints asked for ahead (start_debug_hints): for which modules, the thread, its answer.
_early: tuple[list[Missing], threading.Thread, dict[str, dict[str, str]]] | None = None


def start_debug_hints(diags: tuple[Diagnostic, ...]) -> None:
    """Find the hints :func:`print_debug_hints` will print for ``diags`` in a thread: the
    package query (a process of ~50 ms on a cold cache) runs while the dump is pruned and
    folded, not after."""
    global _early
    wanted = _wanted_hints(diags)
    if not wanted:
        return
    answer: dict[str, dict[str, str]] = {}

    def ask() -> None:
        # Any failure is met again when print_debug_hints asks itself.
        with contextlib.suppress(Exception):
            answer["found"] = debug_hints(wanted, cached_owners(_hint_cache))

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    _early = (wanted, thread, answer)


def print_debug_hints(diags: tuple[Diagnostic, ...] | list[Diagnostic],
                      owners: Owners | None = None) -> None:
    """Say once per command, one line per module, how to get the debug info of each module
    that had none and is on the stacks of at least :data:`HINT_SHARE` of a dump's bytes
    (allocator modules aside: their frames are pruned anyway).

    The package owning each file is asked for all modules at once (one ``dpkg-query``),
    unless the cache folder has the answer for that very file already, or
    :func:`start_debug_hints` asked for the same modules.
    """
    global _early
    wanted = _wanted_hints(diags)
    found = None
    if _early is not None:
        # Joined even when not used: no thread outlives the command's last hint.
        _early[1].join()
        if owners is None and _early[0] == wanted:
            found = _early[2].get("found")
        _early = None
    if not wanted:
        return
    if found is None:
        found = debug_hints(wanted, cached_owners(_hint_cache) if owners is None else owners)
    for m in wanted:
        _hinted.add(m.path)
        print(f"heapscope: {clean(found[m.path])}", file=sys.stderr)


def empty_dump(profile: Profile) -> bool:
    """True for a jemalloc dump with a header line and nothing else: no total line, no
    records, no memory map."""
    return (profile.format == "heap_v2" and not profile.samples and not profile.header
            and not profile.mappings)


def load_profiles(paths: list[str], args: argparse.Namespace, progress: ProgressFn | None,
                  *, threads: bool = False,
                  aliases: MappingT[str, str] | None = None,
                  fold: bool = True) -> list[Profile]:
    """Prepare each dump (unsampled, symbolized, pruned), print its symbol notes, and keep
    only the thread chosen with ``--thread`` when the command has that option; modules in
    ``aliases`` (a program's file by the name it was started as) are renamed. Stacks are
    folded to their sites as the options say, unless ``fold`` is False (pictures draw every
    frame)."""
    opts = symbol_options(args, paths)
    policy = frame_policy(args) if fold else FramePolicy(mode="raw")
    if policy.mode == "site":
        # A session's dump is folded with the wrappers its whole series showed.
        policy = policy._replace(known=series_wrappers(paths))
    thread = getattr(args, "thread", None)
    # Stored results pay off on a few dumps looked at again; a long series would only push
    # them out of the cache.
    from heapscope.reuse import KEEP

    reuse = len(paths) <= KEEP
    out = []
    wrappers = Wrappers()
    failed: list[InputError] = []
    diagnostics: list[Diagnostic] = []
    # Read one by one: the display counts the dumps beside the steps inside each one.
    counted = progress if len(paths) > 1 else None
    # Debug-info hints once for all the dumps (one package query); not beside JSON output.
    # For one dump they are asked for as soon as it is symbolized.
    hints = not getattr(args, "quiet", False) and getattr(args, "format", None) != "json"
    early = start_debug_hints if hints and len(paths) == 1 else None
    for k, path in enumerate(paths):
        if counted is not None:
            counted(DUMPS_READ, k, len(paths))
        try:
            prep = prepare(path, opts, threads=threads or bool(thread), progress=progress,
                           frames=policy, reuse=reuse, symbolized=early)
        except InputError as e:
            if len(paths) == 1:
                raise
            # One bad dump among several: say which and why, go on with the rest.
            print(f"heapscope: warning: skipped {clean(str(e))}", file=sys.stderr)
            failed.append(e)
            continue
        print_diagnostics(prep.diagnostics, args.verbose, hints=False)
        diagnostics.extend(prep.diagnostics)
        wrappers.update(prep.wrappers)
        profile = prep.profile
        if empty_dump(profile):
            # A dump with nothing in it is not "0 bytes live": it was cut or never written.
            print(f"heapscope: warning: {clean(path)}: the dump holds no records, no 't*:' "
                  "total and no memory map (cut short, or written before anything was "
                  "sampled): its total of 0 says nothing", file=sys.stderr)
        if aliases:
            from heapscope.analysis.ownership import alias_modules

            profile = alias_modules(profile, aliases)
        if thread:
            profile = select_threads(profile, thread)
        out.append(profile)
    if counted is not None:
        counted(DUMPS_READ, len(paths), len(paths))
    if failed and not out:
        raise failed[0]
    if hints:
        print_debug_hints(diagnostics)
    if args.verbose and wrappers.describe():
        print(f"heapscope: {clean(wrappers.describe())}", file=sys.stderr)
    args.wrappers = wrappers
    return out
