"""What the paths a user names hold: session facts, and the leak report over them.

The command line and the browser viewer (``heapscope serve``) read sessions, folders and dumps
the same way through these functions, so a verdict, a module's name or a process's title is
the same in ``heapscope leaks`` and in the page. Nothing here parses options: callers pass
:class:`~heapscope.symbols.SymbolOptions` and a :class:`~heapscope.analysis.fold.FramePolicy`.

Modules that only sessions need are imported inside the functions: ``heapscope top`` of a
plain dump must load no session code (start-up time).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from heapscope.model import Profile
from heapscope.prepare import is_session
from heapscope.symbols.options import ModuleFacts
from heapscope.units import plural

if TYPE_CHECKING:
    from heapscope.analysis.fold import FramePolicy
    from heapscope.analysis.leaks import LeakReport
    from heapscope.analysis.ownership import ProcessFacts
    from heapscope.analysis.series import ProcessSeries
    from heapscope.analysis.suppress import Suppression
    from heapscope.formats.trust import Ignored
    from heapscope.symbols import SymbolOptions

ProgressFn = Callable[[str, int, int], None]


def recorded_facts(inputs: Sequence[str]) -> dict[str, ModuleFacts]:
    """Module facts the session manifests of ``inputs`` recorded, by module path."""
    out: dict[str, ModuleFacts] = {}
    seen: set[str] = set()
    for path in inputs:
        folder = path if os.path.isdir(path) else os.path.dirname(os.path.dirname(
            os.path.abspath(path)))
        if folder in seen:
            continue
        seen.add(folder)
        if not is_session(folder):
            continue  # a plain dump: no manifest, and no session code to load (start-up)
        from heapscope.capture.session import read_manifest, recorded_modules

        for module, f in recorded_modules(read_manifest(folder)).items():
            size, mtime = f.get("size"), f.get("mtime_ns")
            out.setdefault(module, ModuleFacts(
                str(f.get("build_id") or ""), size if isinstance(size, int) else None,
                mtime if isinstance(mtime, int) else None, str(f.get("root") or "")))
    return out


def session_facts(inputs: Sequence[str]) -> dict[int, ProcessFacts]:
    """What the session manifests among ``inputs`` say of their processes."""
    facts: dict[int, ProcessFacts] = {}
    for path in inputs:
        if os.path.isdir(path) and is_session(path):
            # Imported only for a session: a plain dump needs neither (start-up time).
            from heapscope.analysis.ownership import facts_from_manifest
            from heapscope.capture.session import read_manifest

            facts.update(facts_from_manifest(read_manifest(path)))
    return facts


def session_aliases(inputs: Sequence[str]) -> dict[str, str]:
    """Program files by the names their processes were started as (see exe_aliases)."""
    facts = session_facts(inputs)
    if not facts:
        return {}
    from heapscope.analysis.ownership import exe_aliases

    return exe_aliases(facts)


def session_info(inputs: Sequence[str]) -> tuple[dict[int, dict[str, Any]], int | None,
                                                  list[str]]:
    """From the session manifests among ``inputs``: each process's record by pid, the pid
    of the program heapscope started, and notes on runs that have not finished."""
    info: dict[int, dict[str, Any]] = {}
    root = None
    notes = []
    for path in inputs:
        if os.path.isdir(path) and is_session(path):
            from heapscope.capture.session import read_manifest, unfinished

            m = read_manifest(path)
            root = m.get("pid", root)
            for proc in m.get("processes", []):
                if isinstance(proc, dict) and isinstance(proc.get("pid"), int):
                    info[proc["pid"]] = proc
            note = unfinished(m)
            if note:
                notes.append(note)
    return info, root, notes


def judge(inputs: Sequence[str], dumps: list[str], options: SymbolOptions,
          frames: FramePolicy | None, *, suppressions: list[Suppression] | None = None,
          progress: ProgressFn | None = None, focus: str | None = None,
          ignore: str | None = None) -> tuple[list[ProcessSeries], LeakReport]:
    """Every process's series of ``dumps`` (found in ``inputs``) and the leak report on them:
    what ``heapscope leaks`` prints. A process none of whose dumps can be read is kept as
    unreadable, unless it is the only one (then its error is raised). ``focus`` and
    ``ignore`` keep only the sites whose stacks match (``--focus``/``--ignore``)."""
    from heapscope.analysis.leaks import find_leaks
    from heapscope.analysis.series import group_by_pid, load_series, unreadable_series
    from heapscope.analysis.sitefilter import select_sites
    from heapscope.errors import InputError

    info, root, notes = session_info(inputs)
    aliases = session_aliases(inputs)
    groups = group_by_pid(dumps)
    series = []
    for pid, paths in groups.items():
        try:
            series.append(select_sites(load_series(pid, paths, options, progress,
                                                   aliases=aliases, frames=frames),
                                       focus, ignore))
        except InputError as e:
            if len(groups) == 1:
                raise  # the one thing asked for cannot be read: say so and stop
            series.append(unreadable_series(pid, [str(e)]))
    report = find_leaks(series, info=info, root=root, suppressions=suppressions or [])
    report.notes[:0] = notes
    chosen = [f"with a frame matching --focus {focus!r}" if focus else "",
              f"without one matching --ignore {ignore!r}" if ignore else ""]
    if focus or ignore:
        report.notes.insert(0, "only the stacks " + " and ".join(c for c in chosen if c)
                            + " are judged; the totals are theirs")
    return series, report


def left_out_note(ignored: Sequence[Ignored]) -> str:
    """The report's note on dumps left out of folders other users can write to."""
    were = "was" if len(ignored) == 1 else "were"
    return (f"{plural(len(ignored), 'file')} {were} left out of a folder other users can write to, "
            f"e.g. {ignored[0].path}: {ignored[0].reason}")


def per_process(inputs: Sequence[str], profiles: list[Profile], *, roots: bool = True
                ) -> tuple[list[Profile], list[str]]:
    """For dumps of several processes: each process's own memory (what a forked child
    inherited is its parent's), with one root frame per process when ``roots``; and the
    processes' labels, for a title (the ones holding the most first). One process: the
    profiles as they are."""
    from heapscope.analysis.ownership import fill_images, own_memory, with_process_root

    pids = [p.pid for p in profiles if p.pid is not None]
    if len(set(pids)) < 2:
        return profiles, []
    facts = fill_images(session_facts(inputs), profiles)
    own = own_memory(profiles, facts)
    labels = [facts[p.pid].label if p.pid is not None else p.source for p in own]
    if roots:
        own = [with_process_root(p, label, i) for i, (p, label) in enumerate(zip(own, labels,
                                                                                  strict=True))]
    # Titles name the processes that hold the most first.
    held = {label: p.total(1) for p, label in zip(own, labels, strict=True)}
    return own, sorted(labels, key=lambda label: -held[label])


def processes_title(labels: list[str]) -> str:
    """A title naming the processes of a picture."""
    shown = ", ".join(labels[:3])
    more = f" (+{len(labels) - 3} more)" if len(labels) > 3 else ""
    return f"{plural(len(labels), 'process')}: {shown}{more}"


# ------------------------------------------------------------------------------ titles
# Pictures are titled by program, process and time, as the session's manifest records them;
# the files' own names (jeprof.13685.21.f.heap.json.gz) mean little to a user.

_SYMBOLIZED = ".json.gz"  # heapscope.formats.symbolized.SUFFIX (not imported: start-up time)


def dump_name(path: str) -> str:
    """The name jemalloc gave a dump: a session's symbolized copy is named by its raw dump."""
    name = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(os.path.abspath(path)))
    if parent == "symbolized" and name.endswith(_SYMBOLIZED):
        return name[: -len(_SYMBOLIZED)]
    return name


def series_wrappers(paths: Sequence[str]) -> tuple[str, ...]:
    """The functions the sessions these dumps belong to found to be allocation wrappers over
    their whole series (``report.json``'s ``wrappers`` found from the profile): a command
    that reads one dump of such a session folds them too, as the series did."""
    import json

    from heapscope.files import open_regular

    found: set[str] = set()
    for folder in {dump_session(p) for p in paths} - {None}:
        try:
            with open_regular(os.path.join(str(folder), "report.json")) as f:
                doc = json.loads(f.read(8 << 20))
        except (OSError, ValueError):
            continue  # no report yet (a run still going), or not one of ours
        entries = doc.get("wrappers") if isinstance(doc, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and entry.get("why") in ("profile", "series") and \
                    isinstance(entry.get("function"), str):
                found.add(entry["function"])
    return tuple(sorted(found))


def dump_session(path: str) -> str | None:
    """The session folder a dump belongs to (``SESSION/dumps/`` or ``SESSION/symbolized/``),
    None for a dump elsewhere."""
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.basename(parent) not in ("dumps", "symbolized"):
        return None
    folder = os.path.dirname(parent)
    return folder if is_session(folder) else None


def program_name(manifest: dict[str, Any]) -> str:
    """The program a session ran, by its file's name: the root process's, or when that is a
    wrapper (runuser, sudo, a shell script's shell) the program it started; "" when the
    manifest does not say."""
    from heapscope.analysis.ownership import facts_from_manifest

    facts = facts_from_manifest(manifest)
    root = manifest.get("pid")
    f = facts.get(root) if isinstance(root, int) else None
    if f is not None and f.role == "wrapper":
        children = sorted(p for p, c in facts.items() if c.ppid == root)
        f = facts[children[0]] if children else f
    if f is not None and (f.exe or f.cmdline):
        return os.path.basename(f.exe or f.cmdline[0].split(" ")[0])
    cmd = manifest.get("command")
    return os.path.basename(str(cmd[0])) if isinstance(cmd, list) and cmd else ""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else ('es' if word.endswith('s') else 's')}"


def session_title(manifest: dict[str, Any], *, processes: int, dumps: int,
                  seconds: float | None, fallback: str) -> str:
    """``program · N processes · M dumps over S s``: a whole session's picture."""
    name = program_name(manifest) or fallback
    over = f" over {seconds:.1f} s" if seconds is not None and dumps > 1 else ""
    return f"{name} \u00b7 {_plural(processes, 'process')} \u00b7 {_plural(dumps, 'dump')}{over}"


def _process_name(f: ProcessFacts) -> str:
    """A process by the name a user knows: the title a server gave it, else its program."""
    if f.cmdline and " " in f.cmdline[0].strip():
        title = f.cmdline[0].strip()
        return title if len(title) <= 40 else title[:39] + "\u2026"
    return os.path.basename(f.exe or (f.cmdline[0] if f.cmdline else "")) or f"pid {f.pid}"


def dump_title(path: str) -> str:
    """``program (pid N) · dump K at S s`` for one dump of a session (K counts that process's
    dumps from 1, S is seconds since the session started); the dump's own name outside a
    session, or when the session does not know the process."""
    name = dump_name(path)
    folder = dump_session(path)
    from heapscope.formats.load import dump_order, parse_dump_name

    d = parse_dump_name(name)
    if folder is None or d is None:
        return name
    from heapscope.analysis.ownership import facts_from_manifest
    from heapscope.capture.session import read_manifest

    manifest = read_manifest(folder)
    f = facts_from_manifest(manifest).get(d.pid)
    who = f"{_process_name(f) if f is not None else program_name(manifest) or name} " \
          f"(pid {d.pid})"
    raw_dir = os.path.join(folder, "dumps")
    try:
        mine = sorted((n for n in os.listdir(raw_dir)
                       if (o := parse_dump_name(n)) is not None and o.pid == d.pid),
                      key=dump_order)
    except OSError:
        mine = []
    title = who
    if name in mine:
        title += f" \u00b7 dump {mine.index(name) + 1}" + (" (at exit)" if d.kind == "f" else "")
    seconds = _seconds_in(manifest, os.path.join(raw_dir, name))
    if seconds is not None:
        title += f" at {seconds:.1f} s" if name in mine else f" \u00b7 at {seconds:.1f} s"
    return title


def _seconds_in(manifest: dict[str, Any], raw: str) -> float | None:
    """When a session's dump was written, in seconds since the session started."""
    start = manifest.get("start_time")
    try:
        mtime = os.stat(raw).st_mtime
    except OSError:
        return None
    return max(mtime - start, 0.0) if isinstance(start, (int, float)) else None


def picture_title(paths: Sequence[str], labels: Sequence[str] = ()) -> str:
    """The title of a picture of ``paths`` (the dumps it adds up, ``labels`` naming their
    processes as :func:`per_process` gives them): one dump by its program, process and time;
    a session's dumps by its program, processes, dumps and span; else the dumps' names."""
    if not paths:
        return "profile"
    if len(paths) == 1:
        return dump_title(paths[0])
    folders = {dump_session(p) for p in paths}
    folder = folders.pop() if len(folders) == 1 else None
    if folder is None:
        return f"{dump_name(paths[0])} (+{len(paths) - 1} more)"
    from heapscope.capture.session import read_manifest
    from heapscope.formats.load import parse_dump_name

    manifest = read_manifest(folder)
    pids = {d.pid for p in paths if (d := parse_dump_name(dump_name(p))) is not None}
    times = [t for p in paths
             if (t := _seconds_in(manifest, os.path.join(folder, "dumps", dump_name(p))))
             is not None]
    name = program_name(manifest) or os.path.basename(folder)
    if len(pids) == 1:
        from heapscope.analysis.ownership import facts_from_manifest

        pid = next(iter(pids))
        f = facts_from_manifest(manifest).get(pid)
        title = f"{_process_name(f) if f is not None else name} (pid {pid})"
    else:
        title = f"{name} \u00b7 " + (processes_title(list(labels)) if labels
                                     else _plural(len(pids), "process"))
    if len(pids) == len(paths):
        title += " \u00b7 the last dump of each"  # what a session folder gives
        when = ", up to"
    else:
        title += f" \u00b7 {_plural(len(paths), 'dump')}"
        when = ", the last at"
    return title + (f"{when} {max(times):.1f} s" if times else "")
