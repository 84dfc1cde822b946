"""Find the separate debug file of a binary: debug dirs, .build-id trees, debuglink, debuginfod.

The search follows GDB's order ("Separate Debug Files") with the user's ``--debug-dir``
directories first and debuginfod last. A candidate is accepted only when it is an ELF file
with DWARF or a symbol table, its build-id equals the binary's (when both have one) and, for
files found through ``.gnu_debuglink`` without a build-id to prove the match, its CRC32 equals
the one recorded in the binary.
"""

from __future__ import annotations

import contextlib
import os
import time

from heapscope.symbols.elf import ElfError, ElfInfo, file_crc32
from heapscope.symbols.options import SymbolOptions

DEBUGINFOD_TIMEOUT = 10.0  # seconds; debuginfod's own default (90 s) is far too patient
NEGATIVE_TTL = 600.0  # seconds a 404 is remembered, as libdebuginfod's cache_miss_s
_USER_AGENT = "heapscope (debuginfod client)"


# Written by hand, not as a dataclass: `heapscope top` must not import dataclasses (start-up
# time).
class DebugFinder:
    """Looks up separate debug files; ``download_dir`` receives debuginfod downloads."""

    __slots__ = ("download_dir", "notes", "options")

    def __init__(self, options: SymbolOptions, download_dir: str | None) -> None:
        self.options = options
        self.download_dir = download_dir
        self.notes: list[str] = []  # problems worth telling the user about

    def find(self, binary: ElfInfo) -> ElfInfo | None:
        """The debug file for ``binary``, or None when there is none anywhere."""
        for path, crc in self.candidates(binary):
            found = self._accept(path, binary, crc)
            if found:
                return found
        bid = binary.build_id
        if bid and self.options.debuginfod_urls and self.download_dir:
            got = fetch_debuginfo(bid, self.options.debuginfod_urls, self.download_dir, self.notes)
            if got:
                return self._accept(got, binary, None)
        return None

    def candidates(self, binary: ElfInfo) -> list[tuple[str, int | None]]:
        """The local files :meth:`find` tries, in order, each with the CRC it must have
        (None: proven by build-id instead)."""
        bid = binary.build_id
        link = binary.debuglink
        out: list[tuple[str, int | None]] = []
        for d in self.options.debug_dirs:
            if bid:
                out.append((_build_id_path(d, bid), None))
            if link:
                out.append((os.path.join(d, link[0]), link[1]))
        if bid:
            out.append((_build_id_path(self.options.system_debug_dir, bid), None))
        if link:
            name, crc = link
            here = os.path.dirname(binary.path)
            system_dir = self.options.system_debug_dir.rstrip("/") + os.path.abspath(here)
            out += [(os.path.join(here, name), crc), (os.path.join(here, ".debug", name), crc),
                    (os.path.join(system_dir, name), crc)]
        return out

    def _accept(self, path: str, binary: ElfInfo, crc: int | None) -> ElfInfo | None:
        if not os.path.isfile(path):
            return None
        with contextlib.suppress(OSError):
            if os.path.samefile(path, binary.path):
                return None  # a debuglink naming the binary itself
        try:
            info = ElfInfo.read(path)
        except ElfError as exc:
            self.notes.append(f"ignored debug file {exc}")
            return None
        if not (info.has_debug_info or info.has_symtab):
            return None
        if binary.build_id and info.build_id:
            if binary.build_id != info.build_id:
                self.notes.append(f"ignored debug file {path}: build-id {info.build_id[:12]}…")
                return None
        elif crc is not None and file_crc32(path) != crc:
            self.notes.append(f"ignored debug file {path}: CRC does not match .gnu_debuglink")
            return None
        return info


def _build_id_path(root: str, build_id: str) -> str:
    return os.path.join(root, ".build-id", build_id[:2], build_id[2:] + ".debug")


def fetch_debuginfo(
    build_id: str, urls: tuple[str, ...], root: str, notes: list[str]
) -> str | None:
    """Download ``/buildid/<id>/debuginfo`` from the first server that has it.

    The file lands in ``root/debuginfod/<id>/debuginfo`` (libdebuginfod's layout), written to
    a temporary file and renamed so an interrupted download never leaves a partial file. A
    miss on every server is remembered for :data:`NEGATIVE_TTL` seconds.
    """
    build_id = build_id.lower()
    folder = os.path.join(root, "debuginfod", build_id)
    target = os.path.join(folder, "debuginfo")
    if os.path.isfile(target):
        return target
    miss = os.path.join(folder, ".miss")
    with contextlib.suppress(OSError):
        if time.time() - os.stat(miss).st_mtime < NEGATIVE_TTL:
            return None
    # Imported here: http.client is a noticeable share of start-up, and most runs never
    # talk to a debuginfod server.
    import urllib.error
    import urllib.request

    timeout = _timeout()
    all_missing = True
    for url in urls:
        req = urllib.request.Request(
            f"{url.rstrip('/')}/buildid/{build_id}/debuginfo",
            headers={"User-Agent": _USER_AGENT},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                os.makedirs(folder, exist_ok=True)
                import tempfile  # only when downloading: start-up time

                fd, tmp = tempfile.mkstemp(dir=folder, prefix=".part-")
                try:
                    with os.fdopen(fd, "wb") as out:
                        while chunk := resp.read(1 << 20):
                            out.write(chunk)
                    os.replace(tmp, target)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                return target
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                all_missing = False
                notes.append(f"debuginfod {url}: HTTP {exc.code} for build-id {build_id}")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            all_missing = False
            reason = getattr(exc, "reason", exc)
            notes.append(f"debuginfod {url}: {reason}")
    if all_missing:
        # Only a clean "not found" everywhere is remembered; network errors are retried.
        with contextlib.suppress(OSError):
            os.makedirs(folder, exist_ok=True)
            # Without blocking: opening a FIFO left at that name to write would wait for a
            # reader forever (it fails at once instead, and the miss is not remembered).
            os.close(os.open(miss, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK
                             | getattr(os, "O_CLOEXEC", 0), 0o666))
    return None


def _timeout() -> float:
    try:
        value = float(os.environ.get("DEBUGINFOD_TIMEOUT", ""))
    except ValueError:
        return DEBUGINFOD_TIMEOUT
    return value if value > 0 else DEBUGINFOD_TIMEOUT
