"""What the user tells the symbolizer, and what it reports back."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple

from heapscope.files import Stamp
from heapscope.model import Profile

#: Called as progress(description, done, total) while long work runs.
Progress = Callable[[str, int, int], None]


def _env_urls() -> tuple[str, ...]:
    return tuple(u for u in os.environ.get("DEBUGINFOD_URLS", "").split() if u)


def default_cache_dir() -> str:
    """``$HEAPSCOPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/heapscope``, else ``~/.cache/heapscope``."""
    env = os.environ.get("HEAPSCOPE_CACHE_DIR")
    if env:
        return env
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not _mine(os.path.dirname(base) if not os.path.exists(base) else base):
        # Under `sudo -E` HOME and XDG_CACHE_HOME are still the invoking user's: root's
        # caches are root's own, never files in a folder another user controls.
        import pwd

        base = os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache")
    return os.path.join(base, "heapscope")


def _mine(path: str) -> bool:
    """True when ``path`` is missing or belongs to the effective user."""
    try:
        return os.stat(path).st_uid == os.geteuid()
    except OSError:
        return True


# The default of SymbolOptions' debuginfod_urls and cache_dir: read from the environment
# when the options are made.
_FROM_ENV: Any = object()


# SymbolOptions is written by hand, the others are NamedTuples, not dataclasses:
# `heapscope top` must not import dataclasses (start-up time).
class SymbolOptions:
    """Where to find binaries and debug info, and whether to use the on-disk cache."""

    __slots__ = ("binaries", "cache_dir", "debug_dirs", "debuginfod_urls", "force",
                 "perf_map_dirs", "recorded", "search_paths", "sysroot", "system_debug_dir")

    def __init__(
        self,
        binaries: tuple[str, ...] = (),
        search_paths: tuple[str, ...] = (),
        sysroot: str | None = None,
        debug_dirs: tuple[str, ...] = (),
        debuginfod_urls: tuple[str, ...] = _FROM_ENV,  # default: $DEBUGINFOD_URLS
        cache_dir: str | None = _FROM_ENV,  # default: default_cache_dir()
        perf_map_dirs: tuple[str, ...] = (),
        system_debug_dir: str = "/usr/lib/debug",
        recorded: Mapping[str, ModuleFacts] | None = None,
        force: bool = False,
    ) -> None:
        self.binaries: Final = binaries
        self.search_paths: Final = search_paths
        self.sysroot: Final = sysroot
        self.debug_dirs: Final = debug_dirs
        self.debuginfod_urls: Final = (
            _env_urls() if debuginfod_urls is _FROM_ENV else debuginfod_urls)
        self.cache_dir: Final = default_cache_dir() if cache_dir is _FROM_ENV else cache_dir
        self.perf_map_dirs: Final = perf_map_dirs
        self.system_debug_dir: Final = system_debug_dir
        # What was recorded of each module when the dump was taken (path -> facts), and
        # whether to use a file that provably (or possibly) differs from it anyway.
        self.recorded: Final[Mapping[str, ModuleFacts]] = {} if recorded is None else recorded
        self.force: Final = force

    def with_recorded(self, recorded: Mapping[str, ModuleFacts]) -> SymbolOptions:
        """These options, knowing also what ``recorded`` says of modules they do not."""
        if all(k in self.recorded for k in recorded):
            return self
        return SymbolOptions(self.binaries, self.search_paths, self.sysroot, self.debug_dirs,
                             self.debuginfod_urls, self.cache_dir, self.perf_map_dirs,
                             self.system_debug_dir, {**recorded, **self.recorded}, self.force)


class ModuleFacts(NamedTuple):
    """A module file as it was when the dump was taken: build-id, size and mtime, and for a
    process in another root (a container, a chroot) the host path of that root."""

    build_id: str = ""
    size: int | None = None
    mtime_ns: int | None = None
    # The module's path names a file inside this folder (``/proc/PID/root`` while the process
    # lives when its root has no lasting host path); "" for the host's own files.
    root: str = ""


NO_DEBUG_INFO = "no debug info (names from the symbol table only)"


class Diagnostic(NamedTuple):
    """A note about one module: missing binary, build-id mismatch, no debug info, …"""

    module: str
    level: str  # "warning" or "info"
    message: str
    # For "no debug info": the module's file and build-id, and the largest share (0..1) of a
    # dump's bytes whose stacks pass through it, so that the CLI can hint how to get the
    # debug info for the modules that matter (heapscope.symbols.hints).
    path: str = ""
    build_id: str = ""
    share: float = 0.0

    def __str__(self) -> str:
        return f"{self.level}: {self.module}: {self.message}"


class Symbolized(NamedTuple):
    """The symbolized profile and what the symbolizer had to say about it.

    ``depends`` lists every file the names were read from or looked for, with its stamp
    then (None: absent): while all are unchanged, symbolizing again gives the same result.
    None when the result could differ with nothing on disk changed (no llvm-symbolizer, a
    failed run, a debuginfod server asked).
    """

    profile: Profile
    diagnostics: tuple[Diagnostic, ...] = ()
    depends: tuple[tuple[str, Stamp], ...] | None = None
