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
                mtime if isinstance(mtime, int) else None))
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
          progress: ProgressFn | None = None
          ) -> tuple[list[ProcessSeries], LeakReport]:
    """Every process's series of ``dumps`` (found in ``inputs``) and the leak report on them:
    what ``heapscope leaks`` prints. A process none of whose dumps can be read is kept as
    unreadable, unless it is the only one (then its error is raised)."""
    from heapscope.analysis.leaks import find_leaks
    from heapscope.analysis.series import group_by_pid, load_series, unreadable_series
    from heapscope.errors import InputError

    info, root, notes = session_info(inputs)
    aliases = session_aliases(inputs)
    groups = group_by_pid(dumps)
    series = []
    for pid, paths in groups.items():
        try:
            series.append(load_series(pid, paths, options, progress, aliases=aliases,
                                      frames=frames))
        except InputError as e:
            if len(groups) == 1:
                raise  # the one thing asked for cannot be read: say so and stop
            series.append(unreadable_series(pid, [str(e)]))
    report = find_leaks(series, info=info, root=root, suppressions=suppressions or [])
    report.notes[:0] = notes
    return series, report


def left_out_note(ignored: Sequence[Ignored]) -> str:
    """The report's note on dumps left out of folders other users can write to."""
    return (f"{len(ignored)} file(s) were left out of a folder other users can write to, "
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
    return f"{len(labels)} processes: {shown}{more}"
