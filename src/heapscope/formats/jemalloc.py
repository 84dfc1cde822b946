"""Reader for jemalloc's threaded heap profile format (``heap_v2/<R>``, jemalloc 4.0 and later).

Layout (jemalloc ``src/prof_data.c``): a ``heap_v2/R`` line; a header block of ``t*:`` (all
threads) and ``tN:`` lines (one per live thread, optionally followed by the thread's name, which
may contain blanks); then per stack an ``@ 0x… 0x…`` line (leaf first; possibly no frames) with
its own ``t*:`` and ``tN:`` lines; then ``MAPPED_LIBRARIES:`` and the process's memory map.
Every count is ``curobjs: curbytes [accumobjs: accumbytes]``. Values are kept raw: jemalloc
5.3 writes numbers pre-adjusted for jeprof's formula, so the unsample pass must still run.
"""

from __future__ import annotations

import re

from heapscope.errors import InputError
from heapscope.formats.maps import parse_maps
from heapscope.model import Profile, Sample, Thread, ThreadValues
from heapscope.native import core
from heapscope.units import shorten

# Numbers have at most 19 digits (they are 64-bit counters): longer ones are damage, and
# would make Python's int() refuse (4,300 digits) or turn into inf.
_HEADER = re.compile(r"^heap_v2/(\d{1,19})\s*$")
_COUNTS = re.compile(
    r"^\s*t(\*|\d{1,19}):\s*(\d{1,19}):\s*(\d{1,19})\s*\[\s*(\d{1,19}):\s*(\d{1,19})\s*\]"
    r"(?:[ \t](.*))?$"
)
_LONG_NUMBER = re.compile(r"\d{20}")


def _counts(path: str, lineno: int, line: str) -> tuple[str, tuple[float, ...], str]:
    # Fast path for the common exact shape "  t*: 4: 64 [4: 64]"; the regex handles the rest.
    parts = line.split()
    if len(parts) == 5:
        tag, n1, s1, n2, s2 = parts
        tid = tag[1:-1]
        nums = n1[:-1] + s1 + n2[1:-1] + s2[:-1]
        # Each number has at most 19 digits, as in the regex (n1 and s2 hold one more
        # character, n2 two): a longer one is damage, which the regex path names.
        if (tag[:1] == "t" and tag[-1:] == ":" and n1[-1:] == ":" and n2[:1] == "["
                and n2[-1:] == ":" and s2[-1:] == "]" and (tid == "*" or tid.isdigit())
                and nums.isascii() and nums.isdigit() and tid.isascii()
                and max(len(n1), len(s1) + 1, len(n2) - 1, len(s2)) <= 20 and len(tid) <= 19):
            try:
                values = (float(n1[:-1]), float(s1), float(n2[1:-1]), float(s2[:-1]))
            except ValueError:  # an empty field: let the regex give the precise error
                pass
            else:
                return tid, values, ""
    m = _COUNTS.match(line)
    if m is None:
        if _LONG_NUMBER.search(line.split("]", 1)[0]):
            raise InputError(path, f"line {lineno}: number too large (over 19 digits)")
        raise InputError(path, f"line {lineno}: malformed count line: "
                               f"{shorten(line.strip(), 60)!r}")
    values = (float(m.group(2)), float(m.group(3)), float(m.group(4)), float(m.group(5)))
    return m.group(1), values, (m.group(6) or "").rstrip("\r\n")


class _HexCache(dict[str, int]):
    """Address text to int, parsed once: the same return addresses recur in many stacks."""

    def __missing__(self, tok: str) -> int:
        value = int(tok, 16)
        self[tok] = value
        return value


def _stack(path: str, lineno: int, line: str, cache: _HexCache) -> tuple[int, ...]:
    try:
        return tuple(map(cache.__getitem__, line[1:].split()))
    except ValueError:
        bad = next(t for t in line[1:].split() if not _is_hex(t))
        raise InputError(path, f"line {lineno}: bad address {shorten(bad, 30)!r} "
                               "in stack") from None


def _is_hex(tok: str) -> bool:
    try:
        int(tok, 16)
    except ValueError:
        return False
    return True


class ParseCache:
    """Parsed text shared by the dumps of one process: its stacks recur in every dump."""

    def __init__(self) -> None:
        self.hexes = _HexCache()
        self.stacks: dict[str, tuple[int, ...]] = {}
        self.counts: dict[str, tuple[str, tuple[float, ...], str]] = {}


def parse_heap_v2_text(path: str, text: str, *, threads: bool = False,
                       cache: ParseCache | None = None) -> Profile:
    """Parse a heap_v2 dump's text; ``threads`` keeps per-thread values per stack.

    Series take a bulk path that splits the stacks section into records rather than lines;
    anything unusual (per-thread values wanted, stray ``<jemalloc>`` text, carriage returns,
    a malformed record) goes through the line-by-line parser, which also gives the precise
    error with its line number.
    """
    shared = cache if cache is not None else ParseCache()
    if not threads and core is not None:
        fast = _compiled(path, text, shared)
        if fast is not None:
            return fast
    if not threads and cache is not None:
        # Only a series (a shared cache) gains from the bulk path: its stacks recur. For one
        # dump the line parser is as fast and holds less memory.
        fast = _bulk(path, text, shared)
        if fast is not None:
            return fast
    return parse_heap_v2(path, text.splitlines(), threads=threads, cache=shared)


def _sections(text: str) -> tuple[int, int] | None:
    """Where the stack records start (the first ``@``) and the memory map begins."""
    maps_at = text.find("\nMAPPED_LIBRARIES:")
    if maps_at < 0:
        maps_at = text.find("\n--- Memory map:")
    first = text.find("\n@")
    if maps_at < 0 or first < 0 or first > maps_at:
        return None
    head = text[:first + 1]
    if len(head.splitlines()) != head.count("\n"):
        # Another line break (a lone "\r", "\v", "\x85"…) may hide a record in the header
        # part, which the line parser, splitting the whole text the same way, would read.
        return None
    return first, maps_at


def _compiled(path: str, text: str, shared: ParseCache) -> Profile | None:
    """The records read by the compiled loop (None: unusual text, left to the line parser);
    the header and the memory map as the line parser reads them."""
    assert core is not None
    found = _sections(text)
    if found is None:
        return None
    first, maps_at = found
    samples = core.parse_records(text, first + 1, maps_at + 1, Sample)
    if samples is None:
        return None
    return _around(path, text, first, maps_at, samples, shared)


def _around(path: str, text: str, first: int, maps_at: int, samples: list[Sample],
            shared: ParseCache) -> Profile:
    """A profile of records read in bulk, with the header and the memory map around them
    read by the line parser."""
    head = parse_heap_v2(path, [*text[:first + 1].splitlines(), "MAPPED_LIBRARIES:"],
                         cache=shared)
    return head.with_(samples=tuple(samples),
                      mappings=parse_maps(text[maps_at + 1:].splitlines()))


def _bulk(path: str, text: str, shared: ParseCache) -> Profile | None:
    found = _sections(text)
    if found is None:
        return None
    first, maps_at = found
    body = text[first + 2: maps_at]
    if "<jemalloc>" in body or "\r" in body:
        return None
    stacks, hexes, counts = shared.stacks, shared.hexes, shared.counts
    samples: list[Sample] = []
    append = samples.append
    try:
        for record in body.split("\n@"):
            nl = record.find("\n")
            if nl < 0:
                return None
            key = record[:nl]
            stack = stacks.get(key)
            if stack is None:
                stack = stacks[key] = tuple(map(hexes.__getitem__, key.split()))
            end = record.find("\n", nl + 1)
            tline = record[nl + 1: end if end >= 0 else len(record)]
            got = counts.get(tline)
            if got is None:
                got = _counts(path, 0, tline)
                if got[0] != "*":
                    return None
                counts[tline] = got
            append(Sample(stack, got[1]))
    except (InputError, ValueError):
        return None
    return _around(path, text, first, maps_at, samples, shared)


def parse_heap_v2(path: str, lines: list[str], *, threads: bool = False,
                  cache: ParseCache | None = None) -> Profile:
    """Parse the lines of a heap_v2 dump; ``threads`` keeps per-thread values per stack."""
    start = 0
    while start < len(lines) and (not lines[start].strip() or _stray(lines[start])):
        start += 1
    m = _HEADER.match(lines[start]) if start < len(lines) else None
    if m is None:
        if start < len(lines) and _LONG_NUMBER.search(lines[start][:40]):
            raise InputError(path, "line 1: sample period too large (over 19 digits)")
        raise InputError(path, "not a jemalloc heap_v2 profile (bad first line)")
    period = int(m.group(1))

    header: tuple[float, ...] = ()
    thread_list: list[Thread] = []
    samples: list[Sample] = []
    shared = cache if cache is not None else ParseCache()
    hexes = shared.hexes
    stacks = shared.stacks
    counts_memo = shared.counts
    stack: tuple[int, ...] | None = None
    values: tuple[float, ...] | None = None
    per_thread: list[ThreadValues] = []
    maps_at = -1

    def flush() -> None:
        if stack is not None:
            if values is None:
                raise InputError(path, "truncated: a stack has no counts (still being written?)")
            samples.append(Sample(stack, values, tuple(per_thread)))

    i = start + 1
    n = len(lines)
    while i < n:
        line = lines[i]
        i += 1
        if not line or line.isspace():
            continue
        c = line[0]
        if c == "@":
            flush()
            known = stacks.get(line)
            if known is None:
                known = stacks[line] = _stack(path, i, line, hexes)
            stack = known
            values = None
            per_thread = []
        elif c == " " or c == "\t" or c == "t":
            body = line.lstrip()
            if stack is not None and not threads and not body.startswith("t*"):
                continue  # per-thread line of a stack, not wanted: skip the parse cost
            if not body.startswith("t") and stack is not None:
                continue  # a record line of an extension (fragmentation "f:", …): not ours
            got = counts_memo.get(line)
            if got is None:
                got = _counts(path, i, line)
                if stack is not None:
                    counts_memo[line] = got  # count lines repeat a lot: parse each text once
            tid, vals, name = got
            if stack is None:
                if tid == "*":
                    header = vals
                else:
                    thread_list.append(Thread(int(tid), name, vals))
            elif tid == "*":
                if values is not None:
                    raise InputError(path, f"line {i}: two t* lines for one stack")
                values = vals
            elif threads:
                per_thread.append(ThreadValues(int(tid), vals))
        elif line.startswith("MAPPED_LIBRARIES:") or line.startswith("--- Memory map:"):
            maps_at = i
            break
        elif _stray(line):
            continue
        else:
            raise InputError(path, f"line {i}: unexpected line {shorten(line.strip(), 60)!r}")
    flush()
    # No MAPPED_LIBRARIES section after complete records: jeprof reads such files (some
    # projects keep dumps without maps as test fixtures); their addresses cannot be named,
    # which the symbolizer says. A record cut short is still refused (flush above).
    return Profile(
        samples=tuple(samples),
        mappings=parse_maps(lines[maps_at:]) if maps_at >= 0 else (),
        period=period,
        sampling="v2",
        header=header,
        threads=tuple(thread_list),
        source=path,
        format="heap_v2",
    )


def _stray(line: str) -> bool:
    """jemalloc's own messages (leak summary, warnings) sometimes land inside dump files."""
    return line.startswith("<jemalloc>")
