"""Find the file on this machine for each module path named in a dump's memory map.

Candidates, in order: ``--binary`` files (matched by build-id, else by base name; a single
unmatched ``--binary`` stands for the main executable), ``SYSROOT/path``, each search path
(``DIR/basename`` and ``DIR/path``), and finally the path itself (not when a sysroot is
given: then the host's own file is the wrong one). A module the session recorded as mapped in
another root (a container) is looked for inside that root instead of at its path. A
candidate is rejected when its build-id differs from the dump's or when none of its
executable segments covers a mapped offset; a file newer than the dump with no build-id to
vouch for it is used but flagged.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from heapscope.model import Mapping
from heapscope.symbols.elf import ElfError, ElfInfo
from heapscope.symbols.options import Diagnostic, SymbolOptions
from heapscope.symbols.rooted import resolve_in_root

HINT = "pass --binary FILE, --search-path DIR or --sysroot DIR"


# Written by hand, not as a dataclass: `heapscope top` must not import dataclasses (start-up
# time).
class Module:
    """A file-backed module of the dump: its path, mappings and the file found for it."""

    __slots__ = ("build_id", "diagnostics", "elf", "mappings", "path")

    def __init__(self, path: str, mappings: list[Mapping]) -> None:
        self.path = path
        self.mappings = mappings
        self.build_id = ""  # from the dump, when it recorded one
        self.elf: ElfInfo | None = None
        self.diagnostics: list[Diagnostic] = []

    @property
    def name(self) -> str:
        """The short module name reports print (the file's base name)."""
        return self.mappings[0].name

    def warn(self, message: str) -> None:
        """Record a warning about this module."""
        self.diagnostics.append(Diagnostic(self.name, "warning", message))

    def info(self, message: str) -> None:
        """Record an informational note about this module."""
        self.diagnostics.append(Diagnostic(self.name, "info", message))


class Locator:
    """Resolves module paths to files, following :class:`SymbolOptions`."""

    def __init__(
        self,
        options: SymbolOptions,
        modules: Sequence[Module],
        main_path: str,
        dump_path: str = "",
    ) -> None:
        """``modules`` are all file-backed modules (to decide what a lone ``--binary`` is);
        ``main_path`` is the executable's path; ``dump_path`` the dump file (for mtimes)."""
        self.options = options
        self.main_path = main_path
        self.dump_mtime_ns = _mtime_ns(dump_path)
        self.binaries: list[ElfInfo] = []
        self.diagnostics: list[Diagnostic] = []
        for b in options.binaries:
            try:
                self.binaries.append(ElfInfo.read(b))
            except ElfError as exc:
                self.diagnostics.append(
                    Diagnostic(os.path.basename(b), "warning", f"cannot use --binary: {exc}")
                )
        self.main_fallback: ElfInfo | None = None
        if len(self.binaries) == 1:
            only = self.binaries[0]
            if not any(_binary_matches(only, m.path, m.build_id) for m in modules):
                self.main_fallback = only

    def candidates(self, module: Module) -> list[str]:
        """Files to try for ``module``, best first, without duplicates."""
        path = module.path
        base = os.path.basename(path)
        out: list[str] = [
            b.path for b in self.binaries if _binary_matches(b, path, module.build_id)
        ]
        if self.main_fallback is not None and path == self.main_path:
            out.append(self.main_fallback.path)
        rel = path.lstrip("/")
        root = self._root(module)
        if self.options.sysroot:
            out.append(os.path.join(self.options.sysroot, rel))
        elif root:
            # The process ran in another root (a container): the path is the container's,
            # and the host's file of that name is the wrong one.
            inside = resolve_in_root(root, path)
            if inside is not None:
                out.append(inside)
        for d in self.options.search_paths:
            out.append(os.path.join(d, base))
            out.append(os.path.join(d, rel))
        if not self.options.sysroot and not root:
            out.append(path)
        if base == HELPER_LIBRARY:
            # heapscope's own helper, loaded from a private folder that is gone once the run
            # ends: the package's copy is the same file (checked by build-id, as any other).
            own = _helper_library()
            if own:
                out.append(own)
        return list(dict.fromkeys(out))

    def _root(self, module: Module) -> str:
        """The host folder the session recorded as the root ``module`` was mapped from."""
        recorded = self.options.recorded.get(module.path)
        return recorded.root if recorded is not None else ""

    def locate(self, module: Module) -> None:
        """Set ``module.elf`` to the first acceptable candidate and record diagnostics."""
        rejected: list[str] = []
        tried = self.candidates(module)
        for cand in tried:
            if not os.path.isfile(cand):
                continue
            try:
                elf = ElfInfo.read(cand)
            except ElfError as exc:
                rejected.append(str(exc))
                continue
            problem = self._mismatch(module, elf)
            if problem and self.options.force:
                module.warn(f"{problem}; used anyway (--force-symbols)")
            elif problem:
                rejected.append(problem)
                continue
            module.elf = elf
            self._check_age(module, elf)
            return
        if rejected:
            for problem in rejected:
                module.warn(problem)
            module.warn("no matching file; its addresses are shown as module+offset "
                        "(--force-symbols to use it anyway)")
            return
        deleted = " (deleted while the process ran)" if module.mappings[0].deleted else ""
        root = self._root(module)
        if root and not self.options.sysroot:
            gone = root.startswith("/proc/") and not os.path.isdir(root)
            where = (f"its process has exited, and its root could only be read through "
                     f"{root} while it ran" if gone else f"not found in its root {root}")
            module.warn(f"{module.path}{deleted} was mapped inside a container; {where}: "
                        "pass --sysroot DIR (a copy of the container's files)")
            return
        module.warn(f"{module.path}{deleted} not found; {HINT}")

    def _mismatch(self, module: Module, elf: ElfInfo) -> str:
        """Why ``elf`` is not (or is not proven to be) the file that was mapped, or ""."""
        recorded = self.options.recorded.get(module.path)
        want = (module.build_id or (recorded.build_id if recorded else "")).lower()
        if want and elf.build_id and want != elf.build_id:
            return (
                f"build-id differs from the one recorded when the dump was taken (expected "
                f"{want[:12]}…, found {elf.build_id[:12]}… in {elf.path}): rebuilt since; "
                "not used"
            )
        proven = bool(want) and want == elf.build_id
        if not proven and recorded is not None and elf.path == module.path:
            changed = [f"{what} {was} then, {now} now" for what, was, now in (
                ("size", recorded.size, elf.size), ("mtime_ns", recorded.mtime_ns, elf.mtime_ns))
                if was is not None and was != now]
            if changed:
                return (f"{elf.path} changed since the dump was taken ({'; '.join(changed)}); "
                        "not used")
        if not proven and any(m.deleted for m in module.mappings):
            return (f"{module.path} was deleted or replaced while the process ran (the dump "
                    f"maps it '(deleted)') and no build-id proves {elf.path} is the file "
                    "that ran; not used")
        for m in module.mappings:
            if elf.segment_for_mapping(m) is None:
                return (
                    f"{elf.path} has no executable segment at file offset {m.offset:#x} "
                    "where the dump mapped code; probably a different build, not used"
                )
        return ""

    def _check_age(self, module: Module, elf: ElfInfo) -> None:
        proven = bool(module.build_id) and module.build_id.lower() == elf.build_id
        if proven or module.path in self.options.recorded or self.dump_mtime_ns is None:
            return  # a recorded module was checked against its record (see _mismatch)
        if elf.mtime_ns > self.dump_mtime_ns:
            module.warn(
                f"{elf.path} is newer than the dump and no build-id proves it is the same "
                "file; names may be wrong (rebuilt since the dump was taken?)"
            )


HELPER_LIBRARY = "libheapscope-preload.so"  # heapscope.capture.helper.LIBRARY_NAME


def _helper_library() -> str | None:
    """The package's build of the helper library (``heapscope/_preload*.so``), if any."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("heapscope._preload")
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin else None


def _binary_matches(binary: ElfInfo, path: str, build_id: str) -> bool:
    """A ``--binary`` file stands for a module with its build-id or its base name.

    A base-name match with a different build-id still counts here, so that the user hears
    about the mismatch instead of "not found".
    """
    if build_id and binary.build_id and build_id.lower() == binary.build_id:
        return True
    return os.path.basename(binary.path) == os.path.basename(path)


def _mtime_ns(path: str) -> int | None:
    if not path or path == "-":
        return None
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
