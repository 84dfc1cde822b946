"""Checks shared by the site tests: every leak is named by the program's own line.

A test program marks each leaking line with ``LEAK:<tag>`` and knows how many bytes each
leaves (a hand count of jemalloc size classes, or jemalloc's own per-thread counters read by
the program). :func:`check_session` runs ``heapscope run --sample 1`` (every allocation
sampled) on it and asserts, from the report and from ``heapscope top``:

- each leak's suspects carry its function and its file, the biggest of them its marked
  line, and their bytes add up to the truth within 20 %;
- the first suspect and the first row of ``top`` (functions and ``--lines``) are the
  biggest leak's function and line: no library, dependency or wrapper frame takes them;
- the first suspects, one per leak, are all in the program's own file.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jemalloc as je

TOLERANCE = 0.20  # the bound for every allocation sampled


@dataclass(frozen=True)
class Leak:
    """One leaking line of a test program and the bytes it leaves."""

    tag: str
    function: str  # a regular expression the site's function name must match (search)
    truth: float
    end: str = ""  # a second tag: the site's line may be anywhere from ``tag`` to here

    def lines(self, source: Path) -> range:
        """The lines the site may carry."""
        first = je.source_line(source, self.tag)
        return range(first, (je.source_line(source, self.end) if self.end else first) + 1)


# sites/leaks.rs, by hand from the table in its header (jemalloc size classes).
RUST_LEAKS = [
    Leak("vec", r"::leaks::load_blobs$", 1500 * 16384),
    Leak("string", r"::leaks::collect_text$", 3000 * 4096),
    Leak("format", r"::leaks::render_lines$", 1000 * 8192),
    Leak("boxed", r"::leaks::box_parts$", 1200 * 6144),
    Leak("hashmap", r"::leaks::index_small$", 2000 * 4096),
    Leak("arc", r"::leaks::share_parts$", 1000 * 10240),
]


@dataclass
class Session:
    """A finished ``heapscope run``: its folder, output, report and pid of the program."""

    path: Path
    proc: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    pid: int

    def suspects(self) -> list[dict[str, Any]]:
        return [s for s in self.report["suspects"] if s["pid"] == self.pid]

    def describe(self, n: int = 12) -> str:
        rows = [f"  {s['verdict']:>6} {s['bytes'] / 1048576:8.2f} MiB  {s['function']} "
                f"{Path(s['file']).name}:{s['line']}  leaf={s.get('leaf')}"
                for s in self.suspects()[:n]]
        return "\n".join([f"session {self.path}", *rows, self.proc.stderr[-3000:]])


def run(argv: Sequence[str | Path], session: Path, cache: Path, *, cwd: Path,
        options: Sequence[str] = (), env: dict[str, str] | None = None,
        timeout: float = 300) -> Session:
    """``heapscope run -o SESSION --sample 1 [options] -- ARGV``; the program prints pid=N."""
    p = je.run_heapscope("run", "-o", str(session), "--sample", "1", *options, "--",
                         *map(str, argv), cache=cache, cwd=cwd, env=env, timeout=timeout,
                         unprofiled=True)
    m = re.search(r"^pid=(\d+)$", p.stdout, re.M)
    assert m is not None, (p.stdout, p.stderr)
    report = json.loads((session / "report.json").read_text())
    return Session(session, p, report, int(m.group(1)))


def truths(stdout: str) -> dict[str, float]:
    """``truth <tag> <bytes>`` lines a program printed (its own measure of each leak)."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^truth (\S+) (\d+)$", stdout, re.M)}


def top_rows(session: Path, cache: Path, *args: str) -> list[dict[str, Any]]:
    """``heapscope top --format json -n 0 [args] SESSION``'s rows."""
    p = je.run_heapscope("top", "--format", "json", "-n", "0", *args, str(session),
                         cache=cache, check=True, unprofiled=True)
    rows: list[dict[str, Any]] = json.loads(p.stdout)["rows"]
    return rows


def _near(got: float, want: float) -> bool:
    return abs(got - want) <= TOLERANCE * want


def check_session(s: Session, source: Path, leaks: Sequence[Leak], cache: Path) -> None:
    """Assert that every leak is named by its own line, with its total (see module doc)."""
    assert s.proc.returncode == 0, s.describe()
    name = source.name
    mine = [x for x in s.suspects() if Path(x["file"]).name == name]
    for leak in leaks:
        rows = [x for x in mine if re.search(leak.function, x["function"])]
        assert rows, f"{leak.tag}: no suspect named {leak.function}\n{s.describe()}"
        biggest = max(rows, key=lambda x: x["bytes"])
        assert biggest["line"] in leak.lines(source), (leak.tag, biggest, s.describe())
        total = sum(x["bytes"] for x in rows)
        assert _near(total, leak.truth), (leak.tag, total, leak.truth, s.describe())
    first = max(leaks, key=lambda x: x.truth)
    head = s.suspects()[0]
    assert re.search(first.function, head["function"]), s.describe()
    assert Path(head["file"]).name == name, s.describe()
    assert head["line"] in first.lines(source), s.describe()
    leading = s.suspects()[:len(leaks)]
    assert all(Path(x["file"]).name == name for x in leading), s.describe(len(leaks) + 4)

    rows = [r for r in top_rows(s.path, cache) if r["flat"] > 0]
    assert re.search(first.function, rows[0]["name"]), rows[:5]
    for leak in leaks:
        flat = sum(r["flat"] for r in rows if re.search(leak.function, r["name"])
                   and Path(r["file"]).name == name)
        assert _near(flat, leak.truth), (leak.tag, flat, leak.truth, rows[:12])
    lines = [r for r in top_rows(s.path, cache, "--lines") if r["flat"] > 0]
    assert Path(lines[0]["file"]).name == name, lines[:5]
    assert lines[0]["line"] in first.lines(source), lines[:5]
