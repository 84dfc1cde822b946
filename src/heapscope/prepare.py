"""The shared front half of every report: find dumps, load, unsample, symbolize, prune, fold.

Every command (and later the web viewer) calls :func:`prepare` so that all views are derived
from the same symbolized, unsampled, allocator-pruned profile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import NamedTuple

from heapscope.analysis.fold import FramePolicy, Wrappers, fold
from heapscope.analysis.prune import prune
from heapscope.analysis.unsample import unsample
from heapscope.errors import InputError
from heapscope.files import Stamp
from heapscope.formats.cache import load_cached
from heapscope.formats.load import dump_order, parse_dump_name
from heapscope.formats.symbolized import SUFFIX
from heapscope.formats.trust import FolderTrust, Ignored
from heapscope.model import Profile
from heapscope.symbols import Diagnostic, SymbolOptions, symbolize
from heapscope.units import plural

ProgressFn = Callable[[str, int, int], None]


# A NamedTuple, not a dataclass: `heapscope top` must not import dataclasses (start-up time).
class Prepared(NamedTuple):
    """A profile ready for views, plus what the symbolizer said about it."""

    profile: Profile
    diagnostics: tuple[Diagnostic, ...]
    wrappers: Wrappers


def _dumps_in(folder: str, trust: FolderTrust | None = None,
              ignored: list[Ignored] | None = None) -> list[str]:
    trust = trust or FolderTrust()
    found = []
    for root, _dirs, files in os.walk(folder):
        for f in files:
            if f.endswith((".heap", ".heap.gz", ".heap" + SUFFIX)):
                path = os.path.join(root, f)
                why = trust.reason(path)
                if why is None:
                    found.append(path)
                elif ignored is not None:
                    ignored.append(Ignored(path, why))
    return found


def _session_owners(folder: str) -> list[int]:
    """The uid a session's manifest names as the owner of its dumps."""
    from heapscope.capture.session import read_manifest

    owner = read_manifest(folder).get("access", {})
    uid = owner.get("dumps_owner", {}).get("uid") if isinstance(owner, dict) else None
    return [uid] if isinstance(uid, int) and not isinstance(uid, bool) else []


def session_dumps(folder: str, trust: FolderTrust | None = None,
                  ignored: list[Ignored] | None = None) -> list[str]:
    """The dumps of a ``heapscope run`` session: the self-contained symbolized copy of each
    dump when there is one (no binaries needed), else the raw dump."""
    trust = trust or FolderTrust()
    raw = _dumps_in(os.path.join(folder, "dumps"), trust, ignored)
    copies = {os.path.basename(p): p
              for p in _dumps_in(os.path.join(folder, "symbolized"), trust, ignored)}
    out = []
    for path in raw:
        name = os.path.basename(path)
        out.append(copies.pop(name + SUFFIX, path))
    out.extend(copies.values())
    return out


def is_session(folder: str) -> bool:
    """True when ``folder`` is a session written by ``heapscope run``."""
    return os.path.isfile(os.path.join(folder, "manifest.json"))


def expand_inputs(paths: Iterable[str], *, latest: bool = False,
                  ignored: list[Ignored] | None = None,
                  trust_uids: Iterable[int] = ()) -> list[str]:
    """Turn the user's arguments into dump files: a session or a folder means its dumps.

    Dumps are ordered by pid, then jemalloc's sequence numbers (numerically, so ``m10``
    follows ``m9``). With ``latest``, a folder gives only the newest dump of each process:
    views of one moment must not add up a series of snapshots (jeprof's glob does).
    Files named one by one are always taken as given; files found in a folder other users
    can write to are read only when :mod:`heapscope.formats.trust` allows, the others are
    added to ``ignored``.
    """
    out: list[str] = []
    extra = list(trust_uids)
    for p in paths:
        if os.path.isdir(p):
            skipped: list[Ignored] = []
            if is_session(p):
                found = session_dumps(p, FolderTrust([*extra, *_session_owners(p)]), skipped)
            else:
                found = _dumps_in(p, FolderTrust(extra), skipped)
            if ignored is not None:
                ignored.extend(skipped)
            if not found:
                why = (f"; {plural(len(skipped), 'file')} left out, e.g. {skipped[0].path}: "
                       f"{skipped[0].reason}" if skipped else "")
                raise InputError(p, f"folder holds no .heap dumps{why}")
            ordered = sorted(found, key=dump_order)
            if latest:
                newest: dict[int | str, str] = {}
                for path in ordered:
                    name = parse_dump_name(path)
                    newest[name.pid if name else path] = path
                ordered = list(newest.values())
            out.extend(ordered)
        else:
            out.append(p)
    return out


def prepare(
    path: str,
    options: SymbolOptions,
    *,
    threads: bool = False,
    progress: ProgressFn | None = None,
    frames: FramePolicy | None = None,
    reuse: bool = True,
    symbolized: Callable[[tuple[Diagnostic, ...]], None] | None = None,
) -> Prepared:
    """Load one dump and return it unsampled, symbolized, with allocator frames pruned and
    (unless ``frames`` says raw) each stack folded to its site.

    With ``reuse`` and a cache directory, a result computed before from the same dump,
    options and files is read back instead (:mod:`heapscope.reuse`), and a new one stored.
    ``symbolized`` is given what the symbolizer said as soon as it is said (not for a
    result read back), so the caller can act on it while the stacks are pruned and folded.
    """
    ident = None
    if reuse and options.cache_dir is not None:
        from heapscope import reuse as cache

        ident = cache.identity(path, options, threads, frames)
        if ident is not None:
            found = cache.load(options.cache_dir, ident)
            if found is not None:
                return Prepared(*found)
    name = os.path.basename(path)
    if progress is not None:
        progress(f"reading {name}", 0, 0)
    raw = load_cached(path, threads=threads, cache_dir=options.cache_dir)
    estimated = unsample(raw)
    if raw.locations:
        # A heapscope profile carries its own symbols: no binaries needed, none consulted.
        folded = fold(prune(estimated), frames)
        prepared = Prepared(folded.profile, (), folded.wrappers)
        depends: tuple[tuple[str, Stamp], ...] | None = ()
    else:
        result = symbolize(estimated, options, progress)
        if symbolized is not None:
            symbolized(result.diagnostics)
        if progress is not None:
            progress(f"removing allocator frames from {name}", 0, 0)
        folded = fold(prune(result.profile), frames)
        prepared = Prepared(folded.profile, result.diagnostics, folded.wrappers)
        depends = result.depends
    if ident is not None and options.cache_dir is not None and depends is not None:
        cache.store(options.cache_dir, ident, depends,
                    (prepared.profile, prepared.diagnostics, prepared.wrappers))
    return prepared
