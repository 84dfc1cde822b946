"""Find leaks: a verdict for every allocation site of every process, with the evidence.

A site is the pruned stack written as names (``function file:line`` per frame, inlined frames
included), so the same site matches across the dumps of a process, across processes and across
restarts. With two or more running dumps of a process each site's series is judged by
:mod:`heapscope.analysis.judge` (leak, growing, bounded, churn, steady). One dump cannot show
growth: its sites are ``live`` (ranked by size), runtime start-up allocations ``expected``,
and memory a forked child inherited from its parent is not counted as the child's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from heapscope.analysis import trend
from heapscope.analysis.fold import Wrappers
from heapscope.analysis.judge import ProcessJudgement, SiteSeries, judge_process
from heapscope.analysis.processes import QUIET_ROLES, role
from heapscope.analysis.series import ProcessSeries, SiteKey
from heapscope.analysis.suppress import Suppression
from heapscope.model import Location, Profile, ViaFrame
from heapscope.units import plural

LEAK = trend.LEAK
GROWING = trend.GROWING
LIVE = "live"
EXPECTED = "expected"
SUPPRESSED = "suppressed"
INHERITED = "inherited"
# A site of a wrapper or helper process (a shim's shells, the tools its scripts run): never a
# suspect while the report has a process of the program's own.
HELPER = "helper"
QUIET = (trend.STEADY, EXPECTED, INHERITED, SUPPRESSED, HELPER)  # verdicts a report does not list
_ORDER = {LEAK: 0, GROWING: 1, trend.BOUNDED: 2, trend.CHURN: 3, LIVE: 4, trend.STEADY: 5,
          EXPECTED: 6, INHERITED: 7, SUPPRESSED: 8, HELPER: 9}
_LOADER_PREFIX = "ld-linux"
MAX_FINDINGS = 1000  # sites listed per process (every non-steady one, then the biggest)
LIVE_FLOOR = 0.0002  # single dumps list sites holding at least this share of the process


def json_numbers(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with every infinite or NaN float written as None: JSON has no such numbers
    (Python would write ``Infinity``, which jq and every strict reader refuse). A z of
    counts known exactly is infinite: its ``null`` sits beside ``exact_counts: true``."""
    return {k: _finite_or_none(v) for k, v in doc.items()}


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return json_numbers(value)
    if isinstance(value, list | tuple):
        return [_finite_or_none(v) for v in value]
    return value


@dataclass
class Finding:
    """One site (or roll-up of sites) of one process: where, how much, verdict, evidence."""

    pid: int | None
    function: str
    file: str
    line: int
    module: str
    stack: tuple[str, ...]
    bytes: float  # live at the last judged dump
    objects: float
    verdict: str
    series: list[float] = field(default_factory=list)  # bytes per dump, exit dump included
    trend: trend.Trend | None = None
    suppressed_by: str = ""
    at_exit: float | None = None  # bytes left in the exit dump after a clean shutdown
    rollup: str = ""  # "line" or "function" for a roll-up of several sites
    sites: int = 1
    via: tuple[ViaFrame, ...] = ()  # frames folded into the site, innermost first

    @property
    def leaf(self) -> str:
        """The stack's first frame outside the allocator, as ``function file:line``."""
        if self.via:
            return self.via[0].text
        return f"{self.function} {self.file}:{self.line}" if self.file else self.function

    @property
    def growth(self) -> float:
        """Bytes gained over the judged series (live bytes for a single dump)."""
        if self.trend is not None:
            return max(self.trend.growth, 0.0)
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
            "via": [{"function": v.function, "file": v.file, "line": v.line,
                     "module": v.module, "kind": v.kind} for v in self.via],
            "leaf": self.leaf,
        }
        if self.rollup:
            out.update({"rollup": self.rollup, "sites": self.sites})
        if t is not None:
            out.update({
                "judged_dumps": t.dumps,
                "growth_bytes": t.growth,
                "growth_bytes_per_dump": t.slope_per_dump,
                "growth_bytes_per_dump_95": [t.slope_low, t.slope_high],
                "growth_bytes_per_s": t.slope_per_s,
                "growth_bytes_per_s_95": _per_s_interval(t),
                "first_growth": t.first_growth,
                "window_start": t.window_start,
                "trend_z": round(t.z, 3),
                "p_value": t.p_value,
                "q_value": t.q_value,
                "slowdown_z": None if t.slowdown_z is None else round(t.slowdown_z, 3),
                "rise_z": round(t.rise_z, 3),
                "samples": t.samples,
                "new_samples": t.new_samples,
                "exact_counts": t.exact,
                "sampled_share": round(t.sampled, 4),
                "arrival_dumps": t.steps,
                "whole_series_test": t.whole_series,
                "noise_persistent_bytes": t.noise_persistent,
                "noise_transient_bytes": t.noise_transient,
                "more_dumps": t.more_dumps,
            })
            if self.verdict not in QUIET:  # a flat series says nothing its verdict does not
                out["series"] = [round(v, 1) for v in self.series]
        if self.at_exit is not None:
            out["at_exit_bytes"] = self.at_exit
        if self.suppressed_by:
            out["suppressed_by"] = self.suppressed_by
        return json_numbers(out)


def _per_s_interval(t: trend.Trend) -> list[float] | None:
    if t.slope_per_s is None or t.slope_per_dump == 0:
        return None
    scale = t.slope_per_s / t.slope_per_dump
    return [t.slope_low * scale, t.slope_high * scale]


# Dumps a process needs before missed rounds may still leave it "clean" (the judge's short
# series end at trend.SHORT = 5 dumps).
MIN_CLEAN = 6


@dataclass
class ProcessFinding:
    """One process: what it is, what its dumps can tell, and whether it leaks."""

    pid: int | None
    exe: str = ""
    cmdline: list[str] = field(default_factory=list)
    ppid: int | None = None
    role: str = "main"
    dumps: int = 0
    live_bytes: float = 0.0  # at the last judged dump
    leak_bytes: float = 0.0  # growth of the sites called leak
    growing_bytes: float = 0.0  # growth of the sites still undecided
    bounded_bytes: float = 0.0  # growth of bounded sites that grew by more than they began with
    judged: int = 0  # dumps the verdicts rest on
    exit_bytes: float | None = None  # in the exit dump, when it was set aside
    teardown: bool = False  # the exit dump came after a clean shutdown
    left_bytes: float = 0.0  # live in the last dump, start-up and inherited memory aside
    unreadable: str = ""  # why none of its dumps could be read
    skipped: list[str] = field(default_factory=list)  # "dump: reason" for each one left out
    rounds: int = 0  # rounds of dumps asked of it as it ran (run --every, attach watch)
    missed: int = 0  # of them, rounds that brought no dump
    missed_why: str = ""  # the last reason one was missed
    why_no_dumps: str = ""  # what is known of why a process that ran wrote no dump

    @property
    def verdict(self) -> str:
        """``leaks``, ``undecided`` (a site grew but its series cannot yet tell a leak from a
        cache still filling), ``clean``, ``unjudged`` (one dump: nothing to compare),
        ``unreadable`` (it wrote dumps, none could be read) or ``no dumps``."""
        if self.unreadable:
            return "unreadable"
        if self.dumps == 0:
            return "no dumps"
        if self.leak_bytes > 0:
            return "leaks"
        if self.judged < 2:
            return "unjudged"
        if self.growing_bytes > 0:
            return "undecided"  # fail closed: growth nobody could explain is not "clean"
        if self.blind:
            return "undecided"  # too many rounds lost to rule a leak out
        if self.bounded_bytes > 0:
            return "grew, bounded"  # it stopped, but a user should see what it took
        return "clean"

    @property
    def unexamined(self) -> bool:
        """True for a process of the program's own (not a wrapper or a tool) that left no
        dump at all: nothing was looked at, so nothing may be said of it."""
        return self.dumps == 0 and not self.unreadable and self.role not in QUIET_ROLES

    @property
    def blind(self) -> bool:
        """True when rounds of dumps were missed (a loaded machine, a busy process) and what
        was taken is too little to call the process clean: fewer than MIN_CLEAN dumps, or a
        quarter of the rounds or more lost."""
        return self.missed > 0 and (self.judged < MIN_CLEAN or 4 * self.missed >= self.rounds)

    def why_undecided(self) -> str:
        """The reason for an ``undecided`` verdict with no growth behind it."""
        return (f"{self.missed} of {self.rounds} rounds of dumps were missed"
                + (f" ({self.missed_why})" if self.missed_why else "")
                + f": {plural(self.judged, 'dump')} {'is' if self.judged == 1 else 'are'} too few "
                  "to call it clean")

    @property
    def fail_bytes(self) -> float:
        """What ``--fail-on-leak`` holds against the process: its leaks, and the growth of
        its sites that grew without proof either way (fail closed), also beside a leak (a
        3-dump series with one small leak and one big `growing` site must not pass a
        threshold the growing site alone crosses)."""
        return self.leak_bytes + self.growing_bytes

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, the report.json ``processes`` schema."""
        out = {"pid": self.pid, "ppid": self.ppid, "exe": self.exe, "cmdline": self.cmdline,
               "role": self.role, "dumps": self.dumps, "judged_dumps": self.judged,
               "live_bytes": self.live_bytes, "leak_bytes": self.leak_bytes,
               "growing_bytes": self.growing_bytes, "bounded_bytes": self.bounded_bytes,
               "exit_bytes": self.exit_bytes,
               "teardown": self.teardown,
               "left_bytes": self.left_bytes, "leaks": self.verdict == "leaks",
               "verdict": self.verdict, "unreadable": self.unreadable,
               "skipped_dumps": self.skipped, "rounds": self.rounds,
               "missed_rounds": self.missed, "missed_why": self.missed_why,
               "examined": not self.unexamined, "why_no_dumps": self.why_no_dumps}
        return json_numbers(out)


@dataclass
class LeakReport:
    """Every process and every interesting site, most likely leak first."""

    processes: list[ProcessFinding]
    findings: list[Finding]
    notes: list[str] = field(default_factory=list)
    window: dict[str, Any] | None = None  # set when the one dump is a window's (attach)
    wrappers: Wrappers = field(default_factory=Wrappers)  # folded as allocation wrappers

    @property
    def leak_bytes(self) -> float:
        """What ``--fail-on-leak`` compares: leaks, plus growth no series could judge yet."""
        return sum(p.fail_bytes for p in self.processes)

    @property
    def unexamined(self) -> list[ProcessFinding]:
        """The processes that left no dump to examine (see ProcessFinding.unexamined)."""
        return [p for p in self.processes if p.unexamined]

    @property
    def left_bytes(self) -> float:
        """What ``--fail-on-live`` compares: memory still live in each process's last dump,
        beyond runtime start-up, inherited and suppressed memory."""
        return sum(p.left_bytes for p in self.processes)

    def as_dict(self) -> dict[str, Any]:
        """The report.json document's analysis part."""
        doc = {"processes": [p.as_dict() for p in self.processes],
               "suspects": [f.as_dict() for f in self.findings],
               "notes": self.notes, "wrappers": self.wrappers.as_list()}
        if self.window is not None:
            doc["window"] = self.window
        return doc


def _site_fields(profile: Profile, stack: tuple[int, ...]) -> tuple[str, str, int, str]:
    if not stack:
        return "(no stack)", "", 0, ""
    loc = profile.location(stack[0])
    if loc.frames:
        f = loc.frames[0]
        return f.function, f.file, f.line, loc.module
    return loc.fallback_name, "", 0, loc.module


class _Expected:
    """Whether a stack was allocated by a runtime as it started (the dynamic loader, or a
    built-in suppression). Each address is decided once, the built-in patterns tried as one,
    and a stack is then one set test: thousands of sites share most of their addresses."""

    def __init__(self, profile: Profile, builtin: list[Suppression],
                 stacks: Iterable[tuple[int, ...]]) -> None:
        # Any of the patterns matching any frame's function is one search of their union.
        rule = re.compile("|".join(f"(?:{s.regex.pattern})" for s in builtin)) \
            if builtin else None
        self.addresses = frozenset(
            a for a in set().union(*stacks)
            if _from_runtime(profile.location(a), rule))

    def __call__(self, stack: tuple[int, ...]) -> bool:
        return bool(self.addresses) and not self.addresses.isdisjoint(stack)


def _from_runtime(loc: Location, rule: re.Pattern[str] | None) -> bool:
    if loc.module.startswith(_LOADER_PREFIX):
        return True
    return rule is not None and any(rule.search(f.function) for f in loc.frames
                                    if f.function)


def _suppressed_by(texts: list[str], rules: list[Suppression]) -> str:
    for r in rules:
        if r.matches(texts):
            return r.origin + " " + r.pattern
    return ""


def analyse_process(series: ProcessSeries, *, builtin: list[Suppression],
                    rules: list[Suppression] | None = None,
                    inherited: dict[SiteKey, float] | None = None
                    ) -> tuple[list[Finding], dict[SiteKey, float], ProcessFinding]:
    """Findings for one process, its last dump's bytes per site (for its children), and the
    process's own numbers (pid and role are filled in by the caller)."""
    profile = series.profile
    rules = rules or []
    proc = ProcessFinding(series.pid, dumps=series.count)
    if profile is None or not series.count:
        return [], {}, proc
    fields = {k: _site_fields(profile, st) for k, st in series.site_stacks.items()}
    leaf = {k: (f[0], f"{f[0]} {f[1]}:{f[2]}" if f[1] else "") for k, f in fields.items()}
    judged = judge_process(series, leaf)
    proc.judged = judged.judged
    proc.live_bytes = judged.totals[judged.judged - 1]
    if judged.exit_aside:
        proc.exit_bytes = judged.totals[-1]
        proc.teardown = judged.teardown
    final_bytes = {k: float(v) for k, v in zip(series.sites, series.values[:, -1],
                                                  strict=True)}
    findings: list[Finding] = []
    single = judged.judged < 2
    expected = _Expected(profile, builtin, series.site_stacks.values())
    for s in judged.sites:
        stack = series.site_stacks[s.key]
        function, file, line, module = fields[s.key]
        f = Finding(series.pid, function, file, line, module, s.key[:24], s.bytes, s.objects,
                    s.verdict, s.values, s.trend, at_exit=s.at_exit,
                    via=series.site_via.get(s.key, ()))
        last_bytes = s.values[-1] if s.values else 0.0
        if expected(stack):
            if single:
                f.verdict = EXPECTED
            last_bytes = 0.0
        elif single and inherited and s.key in inherited:
            own = s.bytes - inherited[s.key]
            if own <= 0:
                f.verdict = INHERITED
                last_bytes = 0.0
            else:
                f.bytes = own
                last_bytes = own
        if rules:
            f.suppressed_by = _suppressed_by([*f.stack, function, file, module], rules)
        if f.suppressed_by:
            f.verdict = SUPPRESSED
            last_bytes = 0.0
        proc.left_bytes += last_bytes
        findings.append(f)
    peaks = _peaks(series, judged, single)
    for r in judged.rollups:
        findings.append(_rollup_finding(series, r, rules, leaf))
        peaks.append(max(r.values[:judged.judged], default=0.0))
    proc.leak_bytes = sum(f.growth for f in findings if f.verdict == LEAK)
    proc.growing_bytes = sum(f.growth for f in findings if f.verdict == GROWING)
    proc.bounded_bytes = sum(f.growth for f in findings if grew_bounded(f))
    return _select(findings, peaks, judged, single), final_bytes, proc


def _peaks(series: ProcessSeries, judged: ProcessJudgement, single: bool) -> list[float]:
    """The most each site held over the judged dumps, in the order of the sites (those
    :func:`_select` ranks quiet sites by; none for a single dump, which does not)."""
    if single or not series.sites:
        return [0.0] * len(series.sites)
    peaks: list[float] = series.values[:, :judged.judged].max(axis=1).tolist()
    return peaks


BOUNDED_NOTICE = 1 << 20  # bounded growth below this is never worth a word on the process line


def grew_bounded(f: Finding) -> bool:
    """A ``bounded`` site whose growth is worth a word: at least BOUNDED_NOTICE, and more than
    it held at the first dump (a cache that at least doubled) or more than 16 of them."""
    if f.verdict != trend.BOUNDED or not f.series:
        return False
    g = f.growth
    return g >= BOUNDED_NOTICE and (g > f.series[0] or g >= 16 * BOUNDED_NOTICE)


def _rollup_finding(series: ProcessSeries, r: SiteSeries, rules: list[Suppression],
                    leaf: dict[SiteKey, tuple[str, str]]) -> Finding:
    name = r.key[0]
    pick = 1 if r.rollup == "line" else 0
    last = {k: float(v) for k, v in zip(series.sites, series.values[:, -1], strict=True)}
    members = [k for k, names in leaf.items() if names[pick] == name]
    biggest = max(members, key=lambda k: last.get(k, 0.0), default=None)
    function, _, where = name.partition(" ")
    file, _, line = where.rpartition(":")
    stack = (f"{name}  ({plural(r.members, 'call path')})",)
    f = Finding(series.pid, function, file, int(line) if line.isdigit() else 0, "",
                stack, r.bytes, r.objects, r.verdict, r.values, r.trend, at_exit=r.at_exit,
                rollup=r.rollup, sites=r.members,
                via=series.site_via.get(biggest, ()) if biggest is not None else ())
    f.suppressed_by = _suppressed_by([name, function, file], rules)
    if f.suppressed_by:
        f.verdict = SUPPRESSED
    return f


def _select(findings: list[Finding], peaks: list[float], judged: ProcessJudgement,
            single: bool) -> list[Finding]:
    """Every site with something to say, then the biggest quiet ones (by ``peaks``, the most
    each finding held over the judged dumps), up to MAX_FINDINGS."""
    ranked = sorted(zip(findings, peaks, strict=True), key=lambda fp: fp[0].rank())
    if single:
        total = max(judged.totals[judged.judged - 1], 0.0)
        return [f for f, _ in ranked if f.bytes >= LIVE_FLOOR * total][:MAX_FINDINGS]
    loud = [f for f, _ in ranked if f.verdict not in QUIET]
    quiet = [f for f, _ in sorted(((f, p) for f, p in ranked if f.verdict in QUIET),
                                  key=lambda fp: (-fp[1], fp[0].function))]
    return (loud + quiet)[:max(MAX_FINDINGS, len(loud))]


def apply_suppressions(findings: Iterable[Finding], rules: list[Suppression]) -> None:
    """Mark findings matched by a user suppression (verdict ``suppressed``)."""
    for f in findings:
        by = _suppressed_by([*f.stack, f.function, f.file, f.module], rules)
        if by:
            f.suppressed_by = by
            f.verdict = SUPPRESSED


def find_leaks(all_series: list[ProcessSeries], *, info: dict[int, dict[str, Any]] | None = None,
               root: int | None = None, suppressions: list[Suppression] | None = None,
               builtin: list[Suppression] | None = None) -> LeakReport:
    """Analyse every process; ``info`` gives exe/cmdline/ppid per pid when known."""
    from heapscope.analysis.suppress import builtin as builtin_rules

    rules = suppressions or []
    base_rules = builtin if builtin is not None else builtin_rules()
    info = info or {}
    by_pid = {s.pid: s for s in all_series if s.profile is not None}
    # A process whose every dump failed to load is kept, unreadable: never "clean".
    lost = [s for s in all_series if s.profile is None and s.skipped]
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
        profile = s.profile
        assert profile is not None
        exe = meta.get("exe") or _exe_of(profile)
        found, finals[pid], proc = analyse_process(s, builtin=base_rules, rules=rules,
                                                   inherited=finals.get(ppid))
        proc.exe, proc.cmdline, proc.ppid = exe, list(meta.get("cmdline") or []), ppid
        proc.role = role(pid or -1, exe, root, n)
        proc.skipped = list(s.skipped)
        proc.rounds = int(meta.get("rounds") or 0)
        proc.missed = int(meta.get("missed_rounds") or 0)
        proc.missed_why = str(meta.get("missed_why") or "")
        processes.append(proc)
        findings.extend(found)
    for s in lost:
        meta = info.get(s.pid, {}) if s.pid is not None else {}
        exe = str(meta.get("exe") or "")
        processes.append(ProcessFinding(
            s.pid, exe, list(meta.get("cmdline") or []), meta.get("ppid"),
            role(s.pid or -1, exe, root, n + len(lost)), dumps=len(s.skipped),
            unreadable=s.skipped[-1], skipped=list(s.skipped)))
    quiet = {p.pid for p in processes if p.role in QUIET_ROLES}
    if len(quiet) < len(processes):
        # Shells and tools in front of the program (pyenv/rbenv/nvm/asdf shims, `sh -c`,
        # scripts) keep what they allocated until they exit or exec: it is no lead. They
        # keep their verdicts only when no process of the program's own is there to judge.
        for f in findings:
            if f.pid in quiet:
                f.verdict = HELPER
        # Nor is how to name their code worth a hint (heapscope.symbols.hints).
        for s in all_series:
            if s.pid in quiet:
                s.diagnostics[:] = [d._replace(share=0.0) for d in s.diagnostics]
    findings.sort(key=lambda f: (f.pid in quiet, *f.rank()))
    processes.sort(key=lambda p: (p.role in QUIET_ROLES, not p.unreadable, -p.fail_bytes,
                                  -p.left_bytes, p.pid or 0))
    wrappers = Wrappers()
    for s in all_series:
        wrappers.update(s.wrappers)
    return LeakReport(processes, findings, _notes(processes), wrappers=wrappers)


def _notes(processes: list[ProcessFinding]) -> list[str]:
    notes = []
    for p in processes:
        for skipped in p.skipped:
            notes.append(f"dump left out (pid {p.pid}): {skipped}")
    single = [p for p in processes if p.verdict == "unjudged" and p.role not in QUIET_ROLES]
    if single:
        notes.append("one dump shows what is live, not what grows: a leak needs a series "
                     "(heapscope run --every SECONDS, or attach PID watch); --fail-on-live "
                     "BYTES fails on what is left at exit")
    for p in processes:
        if p.missed and p.blind and p.verdict == "undecided" and not p.growing_bytes:
            notes.append(f"pid {p.pid}: {p.why_undecided()} (undecided, never 'clean')")
        elif p.missed:
            notes.append(f"pid {p.pid}: {p.missed} of {p.rounds} rounds of dumps were missed"
                         + (f" ({p.missed_why})" if p.missed_why else "")
                         + "; judged on the dumps taken")
    short = [p for p in processes if p.verdict == "undecided" and p.growing_bytes]
    if short:
        notes.append("a site that grew without proof of a leak is 'growing': its series cannot "
                     "yet tell a leak from a cache that is still filling (take more dumps); "
                     "--fail-on-leak counts it")
    if any(p.exit_bytes is not None for p in processes):
        notes.append("the dump written at exit is not judged as a point of the series (it "
                     "comes whenever the program ended, after a clean shutdown most memory is "
                     "already freed): verdicts rest on the dumps taken as it ran, 'at exit' "
                     "shows what was left")
    return notes


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
