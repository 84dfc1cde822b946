"""What the user tells the symbolizer, and what it reports back."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

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
    return os.path.join(base, "heapscope")


@dataclass(frozen=True)
class SymbolOptions:
    """Where to find binaries and debug info, and whether to use the on-disk cache."""

    binaries: tuple[str, ...] = ()
    search_paths: tuple[str, ...] = ()
    sysroot: str | None = None
    debug_dirs: tuple[str, ...] = ()
    debuginfod_urls: tuple[str, ...] = field(default_factory=_env_urls)
    cache_dir: str | None = field(default_factory=default_cache_dir)
    perf_map_dirs: tuple[str, ...] = ()
    system_debug_dir: str = "/usr/lib/debug"
    # What was recorded of each module when the dump was taken (path -> facts), and whether
    # to use a file that provably (or possibly) differs from it anyway.
    recorded: Mapping[str, ModuleFacts] = field(default_factory=dict)
    force: bool = False


@dataclass(frozen=True)
class ModuleFacts:
    """A module file as it was when the dump was taken: build-id, size and mtime."""

    build_id: str = ""
    size: int | None = None
    mtime_ns: int | None = None


@dataclass(frozen=True)
class Diagnostic:
    """A note about one module: missing binary, build-id mismatch, no debug info, …"""

    module: str
    level: str  # "warning" or "info"
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.module}: {self.message}"


@dataclass(frozen=True)
class Symbolized:
    """The symbolized profile and what the symbolizer had to say about it."""

    profile: Profile
    diagnostics: tuple[Diagnostic, ...] = ()
