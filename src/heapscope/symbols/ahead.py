"""Start the program's llvm-symbolizer before the dump is read (cold runs only).

On a cold run, the program's own file is usually the longest symbolizer run: every stack
passes through its ``main``, and it is most often the biggest module with DWARF. Some 0.04 s
of that run is LLVM starting (loading libLLVM) and reading the file's DWARF index, work that
needs no address of the dump. :func:`start_for_args` begins it first thing, from the command
line alone: it reads the memory map at the end of the dump named there, finds the program's
file and, when the symbol cache has no entry for it, starts llvm-symbolizer on it with one
address of its code (:func:`heapscope.symbols.llvm.start_ahead`). heapscope then imports
its other modules and parses the dump (0.1 s on a 2-core machine, with the other core idle
but for this), and the program's lookup goes to the waiting process.

It is a hint, never an answer: it decides nothing about which file names the frames (the
lookup takes the process only when it asks about the very same file), and a process no lookup
takes is stopped. It starts nothing for folders, sessions and compressed dumps, when options
choose other files (``--binary``, ``--sysroot``, …), and when the program's file is not the
one the dump mapped, has no DWARF here, or is already in the cache (a warm run starts no
process).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from heapscope.errors import ToolError
from heapscope.files import open_regular
from heapscope.formats.maps import parse_maps
from heapscope.model import Mapping
from heapscope.symbols.cache import SymbolCache
from heapscope.symbols.debuginfo import DebugFinder
from heapscope.symbols.elf import ElfInfo
from heapscope.symbols.llvm import find_symbolizer, start_ahead
from heapscope.symbols.options import SymbolOptions

# Options that change which file stands for a module: with them, only the full search
# (heapscope.symbols.locate) knows, so nothing is started ahead.
_CHOOSING = ("--binary", "--search-path", "--sysroot", "--debug-dir", "--force-symbols")
# How much of a dump's end is read for its memory map: a map of 2,000 lines fits.
_TAIL = 1 << 18
_MARKER = b"\nMAPPED_LIBRARIES:\n"


def start_for_args(args: Sequence[str]) -> None:
    """Start llvm-symbolizer for the program of the first dump file among a subcommand's
    arguments, when a cold lookup of it is coming. Never raises: at worst it starts
    nothing."""
    if any(a.split("=", 1)[0] in _CHOOSING for a in args):
        return
    use_cache = "--no-cache" not in args
    dump = next((a for a in args if a.endswith(".heap") and not a.startswith("-")), None)
    if dump is None:
        return
    try:
        _start_for(dump, use_cache)
    except (OSError, ValueError, UnicodeError):
        return  # ElfError is a ValueError; the real run reports any such problem itself


def _start_for(dump: str, use_cache: bool) -> None:
    mappings = memory_map(dump)
    main = next((m for m in mappings if not m.anonymous), None)
    if main is None or main.deleted or any(c in main.path for c in '"\n\r'):
        return
    code = [m for m in mappings if m.executable and m.path == main.path]
    if not code or not os.path.isfile(main.path):
        return
    elf = ElfInfo.read(main.path)
    if any(elf.segment_for_mapping(m) is None for m in code):
        return  # not the file that was mapped (the lookup will say so)
    options = SymbolOptions()
    if use_cache and options.cache_dir:
        cache = SymbolCache(options.cache_dir)
        entry = cache.path(cache.key(elf))
        if entry is not None and os.path.exists(entry):
            return  # warm, or nearly: the lookup reads the cache first
    # No download folder: debuginfod is left to the lookup, which reports what it does.
    debug = elf if elf.has_debug_info else DebugFinder(options, None).find(elf)
    if debug is None or not debug.has_debug_info or any(c in debug.path for c in '"\n\r'):
        return  # no DWARF: names come from the symbol table, no llvm-symbolizer run
    vaddr = next((s.vaddr for s in elf.segments if s.executable), None)
    if vaddr is None:
        return
    try:
        executable = find_symbolizer()
    except ToolError:
        return  # the lookup says so, once
    start_ahead(executable, debug.path, vaddr)


def memory_map(dump: str) -> list[Mapping]:
    """The mappings of a plain jemalloc dump's MAPPED_LIBRARIES section, read from the end
    of the file; empty when the section is not within its last 256 KiB."""
    # Before the command's own reader looks at it: never wait on a FIFO named like a dump.
    with open_regular(dump) as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - _TAIL))
        tail = f.read(_TAIL)
    at = tail.rfind(_MARKER)
    if at < 0:
        return []
    # As the dump reader reads the section (sorted, empty mappings left out), so that "the
    # program" is the same mapping here as in the lookup.
    return list(parse_maps(tail[at + len(_MARKER):].decode("utf-8", "surrogateescape")
                           .splitlines()))
