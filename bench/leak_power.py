#!/usr/bin/env python3
"""How many dumps does a leak need before heapscope calls it a leak? Tables from simulation.

    python bench/leak_power.py              # the README's dumps-needed tables (markdown)
    python bench/leak_power.py --families   # recall, false leaks and interval coverage per
                                            # scenario family at 6, 10 and 30 dumps
    python bench/leak_power.py --runs 1000
    python bench/leak_power.py --families --timing loaded   # dumps at uneven times

Dumps needed: for each leak rate (bytes leaked between two dumps) and sample period, the
smallest series length at which ``leak`` is the verdict in at least 95% of simulated runs.
The simulation is tests/leaksim.py's (jemalloc's sampling, object by object): 256-byte
objects, the leak already running for two dumps' worth before the first dump; the second
and third tables add ten times the growth in short-lived objects renewed at every dump at
the same site (a request path that leaks one buffer in eleven), at a steady request rate and
with a level that swings ±50% from dump to dump. The verdicts come from heapscope's own
classifier (heapscope.analysis.trend), on each run's series alone, judged with the counting
noise the objects' size implies.

Families: every scenario of tests/leaksim.py (small objects: leak_cases/null_cases; big
objects and pools: block_leak_cases/block_null_cases) grouped by family, on seeds the
thresholds were not chosen on.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import zlib
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests import leaksim as ls  # noqa: E402

from heapscope.analysis import trend  # noqa: E402

KIB = 1024
RATES = (64 * KIB, 256 * KIB, 1024 * KIB, 4096 * KIB)
PERIODS = (4 * KIB, 64 * KIB, 512 * KIB)
LENGTHS = (3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60, 80, 100, 150, 200, 300)
SIZE = 256
FAMILY_LENGTHS = (6, 10, 30)
GROUP = 20  # uneven times: runs judged together share their dumps' times


def _judge(s: ls.Series) -> trend.Judged:
    c = s.counts.astype(float)
    return trend.judge_counts(c, c * (s.size / s.p), c / s.p)


def needed(rate: int, period: int, churn: float, spread: float, runs: int,
           seed: int) -> int | None:
    """The shortest series in LENGTHS whose leak verdict rate reaches 95%."""
    p = ls.sample_probability(SIZE, period)
    per_dump = rate / SIZE * p  # expected new samples per dump
    plan = ls.Plan(ls.LEAK, leak=per_dump, steady=2 * per_dump, transient=churn * per_dump,
                   spread=spread, size=SIZE)
    for n in LENGTHS:
        rng = np.random.default_rng([seed, rate, period, n, int(churn), int(10 * spread)])
        found = _judge(ls.simulate(plan, n, period, runs, rng)).verdict.count(trend.LEAK)
        if found >= 0.95 * runs:
            return n
    return None


def table(churn: float, spread: float, runs: int, seed: int) -> str:
    head = "| leak per dump | " + " | ".join(f"R = {r // KIB} KiB" for r in PERIODS) + " |"
    lines = [head, "|" + "---|" * (len(PERIODS) + 1)]
    for rate in RATES:
        cells = []
        for period in PERIODS:
            n = needed(rate, period, churn, spread, runs, seed)
            lam = rate / SIZE * ls.sample_probability(SIZE, period)
            cells.append(f"{n if n is not None else f'> {LENGTHS[-1]}'} ({lam:.3g}/dump)")
        name = f"{rate // KIB} KiB" if rate < 1024 * KIB else f"{rate // (1024 * KIB)} MiB"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _family(name: str) -> str:
    """A scenario's family: its name without the numbers that vary within it."""
    name = re.sub(r"\d+(\.\d+)?", "N", name)
    return re.sub(r"\s+", " ", name).strip()


class Tally:
    """Verdict counts and interval coverage of one family at one length."""

    def __init__(self) -> None:
        self.runs = 0
        self.leaks = 0
        self.judged = 0  # runs called leak or growing (an interval is printed)
        self.covered = 0

    def add(self, j: trend.Judged, c: np.ndarray, y: np.ndarray,
            truth: float | None) -> None:
        for i, v in enumerate(j.verdict):
            self.runs += 1
            self.leaks += v == trend.LEAK
            if truth is not None and v in (trend.LEAK, trend.GROWING):
                t = trend.describe(j, i, c, y, None)
                tol = 1e-9 * max(abs(truth), 1.0)
                self.judged += 1
                self.covered += t.slope_low - tol <= truth <= t.slope_high + tol


def families(runs: int, seed: int, timing: str = "even") -> str:
    """Markdown: per family and length, the share called leak and the interval coverage.
    With ``timing`` other than "even" the dumps come at uneven times (tests/leaksim.py's
    ``intervals``), each group of GROUP runs sharing one draw, judged with its times."""
    tallies: dict[tuple[str, str, int], Tally] = collections.defaultdict(Tally)
    cases: list[ls.Case | ls.BlockCase] = [*ls.leak_cases(), *ls.null_cases(),
                                           *ls.block_leak_cases(), *ls.block_null_cases()]
    for case in cases:
        if case.n not in FAMILY_LENGTHS:
            continue
        rng = np.random.default_rng([seed, zlib.crc32(case.label.encode())])
        kind = "leak" if case.plan.truth == ls.LEAK else "not a leak"
        tally = tallies[(kind, _family(case.name), case.n)]
        if timing == "even":
            c, y, objects, truth = ls.observe(case, runs, rng)
            tally.add(trend.judge_counts(c, y, objects), c, y, truth)
            continue
        dt = ls.intervals(runs, case.n, timing, rng, GROUP)
        c, y, objects, truth = ls.observe(case, runs, rng, dt)
        for g in range(0, runs, GROUP):
            rows = slice(g, g + GROUP)
            times = np.cumsum(dt[g]).tolist()
            tally.add(trend.judge_counts(c[rows], y[rows], objects[rows], times),
                      c[rows], y[rows], truth)
    lines = ["| truth | family | " + " | ".join(f"{n} dumps" for n in FAMILY_LENGTHS) + " |",
             "|---|---|" + "---|" * len(FAMILY_LENGTHS)]
    names = sorted({(k[0], k[1]) for k in tallies})
    for truth_kind, fam in names:
        cells = []
        for n in FAMILY_LENGTHS:
            t = tallies.get((truth_kind, fam, n))
            if t is None or not t.runs:
                cells.append("")
                continue
            cell = f"{t.leaks / t.runs:.3f}"
            if t.judged:
                cell += f" (cov {t.covered / t.judged:.2f})"
            cells.append(cell)
        lines.append(f"| {truth_kind} | {fam} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--families", action="store_true",
                    help="recall, false leaks and interval coverage per scenario family")
    ap.add_argument("--timing", choices=("even", "jitter", "loaded"), default="even",
                    help="with --families: dumps at even intervals, jittered ±50%%, or a "
                         "loaded machine's late and hurried rounds")
    args = ap.parse_args()
    if args.families:
        print("Share of runs called `leak` per scenario family (recall where the truth is a "
              "leak, false leaks where it is not), and in brackets the share of runs called "
              "leak or growing whose 95% interval of the rate holds the true rate\n")
        print(families(args.runs, args.seed, args.timing))
        print(f"\n({args.runs} simulated runs per scenario, seed {args.seed}, "
              f"dumps at {args.timing} intervals)")
        return 0
    print("Dumps needed for a 95% leak verdict (expected new samples per dump in brackets)\n")
    print(table(0.0, 0.0, args.runs, args.seed))
    print("\nThe same leak beside 10x its growth in short-lived objects at the same site, "
          "renewed at a steady rate\n")
    print(table(10.0, 0.0, args.runs, args.seed))
    print("\nThe same, the short-lived objects' level swinging ±50% from dump to dump\n")
    print(table(10.0, 0.5, args.runs, args.seed))
    print(f"\n({args.runs} simulated runs per cell; 256-byte objects; "
          f"lengths tried: {', '.join(map(str, LENGTHS))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
