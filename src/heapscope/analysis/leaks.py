"""Find leaks: a verdict for every allocation site of every process, with the evidence.

A site is the pruned stack written as names (``function file:line`` per frame, inlined frames
included), so the same site matches across the dumps of a process, across processes and across
restarts. With two or more dumps of a process each site's live bytes form a series that
:mod:`heapscope.analysis.trend` classifies; with one dump (a dump at exit) everything still live
is a candidate, runtime start-up allocations are ``expected``, and memory a forked child
inherited from its parent is not counted as the child's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from heapscope.analysis import trend
from heapscope.analysis.processes import QUIET_ROLES, role
from heapscope.analysis.series import ProcessSeries, SiteKey
from heapscope.analysis.suppress import Suppression
from heapscope.model import INUSE_SPACE, Profile

EXPECTED = "expected"
SUPPRESSED = "suppressed"
INHERITED = "inherited"
LEAK = trend.LEAK
_ORDER = {trend.LEAK: 0, trend.BOUNDED: 1, trend.CHURN: 2, trend.STEADY: 3, EXPECTED: 4,
          INHERITED: 5, SUPPRESSED: 6}
_LOADER_PREFIX = "ld-linux"

@dataclass
class Finding:
    """One site of one process: where it is, what it holds, and the verdict with evidence."""

    pid: int | None
    function: str
    file: str
    line: int
    module: str
    stack: tuple[str, ...]
    bytes: float
    objects: float
    verdict: str
    series: list[float] = field(default_factory=list)
    trend: trend.Trend | None = None
    suppressed_by: str = ""

    @property
    def growth(self) -> float:
        """Bytes gained over the series (live bytes for a single dump)."""
        if self.trend is not None:
            return max(self.trend.rise, 0.0)
        return self.bytes

    def rank(self) -> tuple[int, float, float, str]:
        """Sort key: verdict, then evidence-weighted growth, then size."""
        score = self.trend.score if self.trend is not None else self.bytes
        return (_ORDER.get(self.verdict, 9), -score, -self.bytes, self.function)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, the report.json ``suspects`` schema."""
        t = self.trend
        out: dict[str, Any] = {
            "pid": self.pid, "function": self.function, "file": self.file, "line": self.line,
            "module": self.module, "stack": list(self.stack), "bytes": self.bytes,
            "objects": self.objects, "verdict": self.verdict,
        }
        if t is not None:
            out.update({
                "growth_bytes": t.rise,
                "growth_bytes_per_dump": t.slope_per_dump,
                "growth_bytes_per_s": t.slope_per_s,
                "first_growth": t.first_growth,
                "fit": round(t.fit, 4),
                "trend_z": round(t.z, 3),
                "tau": round(t.tau, 4),
                "recent_z": round(t.z_recent, 3),
                "noise_bytes": t.noise,
                "series": [round(v, 1) for v in self.series],
            })
        if self.suppressed_by:
            out["suppressed_by"] = self.suppressed_by
        return out


@dataclass
class ProcessFinding:
    """One process: what it is and whether it leaks."""

    pid: int | None
    exe: str = ""
    cmdline: list[str] = field(default_factory=list)
    ppid: int | None = None
    role: str = "main"
    dumps: int = 0
    live_bytes: float = 0.0
    leak_bytes: float = 0.0

    @property
    def verdict(self) -> str:
        """``leaks`` when any unsuppressed site of the process is a leak, else ``clean``."""
        return "leaks" if self.leak_bytes > 0 else "clean"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, the report.json ``processes`` schema."""
        return {"pid": self.pid, "ppid": self.ppid, "exe": self.exe, "cmdline": self.cmdline,
                "role": self.role, "dumps": self.dumps, "live_bytes": self.live_bytes,
                "leak_bytes": self.leak_bytes, "leaks": self.verdict == "leaks",
                "verdict": self.verdict}


@dataclass
class LeakReport:
    """Every process and every interesting site, most likely leak first."""

    processes: list[ProcessFinding]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)

    @property
    def leak_bytes(self) -> float:
        """What unsuppressed leaks hold (growth for series, live bytes for single dumps)."""
        return sum(f.growth for f in self.findings if f.verdict == LEAK)

    def as_dict(self) -> dict[str, Any]:
        """The report.json document's analysis part."""
        return {"processes": [p.as_dict() for p in self.processes],
                "suspects": [f.as_dict() for f in self.findings],
                "notes": self.notes}


def _site_fields(profile: Profile, stack: tuple[int, ...]) -> tuple[str, str, int, str]:
    loc = profile.location(stack[0])
    if loc.frames:
        f = loc.frames[0]
        return f.function, f.file, f.line, loc.module
    return loc.fallback_name, "", 0, loc.module


def _site_texts(profile: Profile, stack: tuple[int, ...]) -> list[str]:
    out: list[str] = []
    for a in stack:
        loc = profile.location(a)
        out.append(loc.module)
        for f in loc.frames:
            out.extend((f.function, f.file))
        if not loc.frames:
            out.append(loc.fallback_name)
    return out


def _expected(profile: Profile, stack: tuple[int, ...], builtin: list[Suppression]) -> bool:
    for a in stack:
        if profile.location(a).module.startswith(_LOADER_PREFIX):
            return True
    texts = [t for a in stack for f in profile.location(a).frames for t in (f.function,)]
    return any(s.matches(texts) for s in builtin)


def analyse_process(series: ProcessSeries, *, builtin: list[Suppression],
                    inherited: dict[SiteKey, float] | None = None,
                    max_sites: int = 1000) -> tuple[list[Finding], dict[SiteKey, float]]:
    """Findings for one process, and its last dump's bytes per site (for its children)."""
    last = series.last
    tallies = series.tallies
    if last is None or not tallies:
        return [], {}
    final = tallies[-1]
    final_bytes = {k: v[0] for k, v in final.items()}
    peak: dict[SiteKey, float] = {}
    for t in tallies:
        for k, v in t.items():
            if v[0] > peak.get(k, 0.0):
                peak[k] = v[0]
    # Only sites that ever held a noticeable share are classified: the rest cannot matter,
    # and the trend test is quadratic in the number of dumps.
    total_peak = max((sum(v[0] for v in t.values()) for t in tallies), default=0.0)
    floor = 0.0002 * total_peak
    ranked = sorted((k for k in peak if peak[k] >= floor), key=lambda k: (-peak[k], k))
    ranked = ranked[:max_sites]
    period = last.period if last.sampling == "v2" else 1
    times = series.times
    zero = [0.0, 0.0]
    out: list[Finding] = []
    for k in ranked:
        stack = series.site_stacks[k]
        function, file, line, module = _site_fields(last, stack)
        b, objs = final.get(k, zero)
        f = Finding(series.pid, function, file, line, module, k[:24], b, objs, trend.STEADY)
        if len(tallies) >= 2:
            ys = [t.get(k, zero)[0] for t in tallies]
            counts = [t.get(k, zero)[1] for t in tallies]
            size = max((y / c for y, c in zip(ys, counts, strict=True) if c > 0), default=1.0)
            f.series = ys
            f.trend = trend.classify(ys, times, period, size)
            f.verdict = f.trend.verdict
        elif _expected(last, stack, builtin):
            f.verdict = EXPECTED
        else:
            f.verdict = LEAK
            if inherited and k in inherited:
                own = b - inherited[k]
                if own <= 0:
                    f.verdict = INHERITED
                else:
                    f.bytes = own
        out.append(f)
    return out, final_bytes


def apply_suppressions(findings: Iterable[Finding], rules: list[Suppression]) -> None:
    """Mark findings matched by a user suppression (verdict ``suppressed``)."""
    for f in findings:
        texts = [*f.stack, f.function, f.file, f.module]
        for r in rules:
            if r.matches(texts):
                f.suppressed_by = r.origin + " " + r.pattern
                f.verdict = SUPPRESSED
                break


def find_leaks(all_series: list[ProcessSeries], *, info: dict[int, dict[str, Any]] | None = None,
               root: int | None = None, suppressions: list[Suppression] | None = None,
               builtin: list[Suppression] | None = None) -> LeakReport:
    """Analyse every process; ``info`` gives exe/cmdline/ppid per pid when known."""
    from heapscope.analysis.suppress import builtin as builtin_rules

    rules = suppressions or []
    base_rules = builtin if builtin is not None else builtin_rules()
    info = info or {}
    by_pid = {s.pid: s for s in all_series if s.last is not None}
    # Parents first, so a child's inherited memory is known when the child is analysed.
    order = sorted(by_pid, key=lambda pid: _depth(pid, info))
    finals: dict[int | None, dict[SiteKey, float]] = {}
    processes: list[ProcessFinding] = []
    findings: list[Finding] = []
    n = len(by_pid)
    for pid in order:
        s = by_pid[pid]
        meta = info.get(pid, {}) if pid is not None else {}
        ppid = meta.get("ppid")
        last = s.last
        assert last is not None
        exe = meta.get("exe") or _exe_of(last)
        found, finals[pid] = analyse_process(s, builtin=base_rules,
                                             inherited=finals.get(ppid))
        apply_suppressions(found, rules)
        proc = ProcessFinding(pid, exe, list(meta.get("cmdline") or []), ppid,
                              role(pid or -1, exe, root, n), s.count,
                              last.total(INUSE_SPACE))
        proc.leak_bytes = sum(f.growth for f in found if f.verdict == LEAK)
        processes.append(proc)
        findings.extend(found)
    quiet = {p.pid for p in processes if p.role in QUIET_ROLES}
    findings.sort(key=lambda f: (f.pid in quiet, *f.rank()))
    processes.sort(key=lambda p: (p.role in QUIET_ROLES, -p.leak_bytes, p.pid or 0))
    notes = []
    if any(s.count == 2 for s in by_pid.values()):
        notes.append("two dumps of a process show growth but cannot tell a leak from a cache "
                     "that is still warming up; take more dumps (heapscope run --interval)")
    return LeakReport(processes, findings, notes)


def _depth(pid: int | None, info: dict[int, dict[str, Any]]) -> int:
    depth = 0
    seen = set()
    while pid is not None and pid in info and pid not in seen:
        seen.add(pid)
        pid = info[pid].get("ppid")
        depth += 1
    return depth


def _exe_of(profile: Profile) -> str:
    return next((m.path for m in profile.mappings if not m.anonymous), "")
