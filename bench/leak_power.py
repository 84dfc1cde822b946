#!/usr/bin/env python3
"""How many dumps does a leak need before heapscope calls it a leak? A table from simulation.

    python bench/leak_power.py            # the README's table (markdown)
    python bench/leak_power.py --runs 1000

For each leak rate (bytes leaked between two dumps) and sample period, the smallest series
length at which ``leak`` is the verdict in at least 95% of simulated runs. The simulation is
tests/leaksim.py's (jemalloc's sampling, object by object): 256-byte objects, the leak already
running for two dumps' worth before the first dump, and, in the second table, ten times the
growth in short-lived objects renewed at every dump at the same site (a request path that
leaks one buffer in eleven). The verdicts come from heapscope's own classifier
(heapscope.analysis.trend), on each run's series alone.
"""

from __future__ import annotations

import argparse
import sys
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


def needed(rate: int, period: int, churn: float, runs: int, seed: int) -> int | None:
    """The shortest series in LENGTHS whose leak verdict rate reaches 95%."""
    p = ls.sample_probability(SIZE, period)
    per_dump = rate / SIZE * p  # expected new samples per dump
    plan = ls.Plan(ls.LEAK, leak=per_dump, steady=2 * per_dump, transient=churn * per_dump,
                   spread=0.5 if churn else 0.0, size=SIZE)
    for n in LENGTHS:
        rng = np.random.default_rng([seed, rate, period, n, int(churn)])
        s = ls.simulate(plan, n, period, runs, rng)
        found = trend.judge_counts(s.counts.astype(float)).verdict.count(trend.LEAK)
        if found >= 0.95 * runs:
            return n
    return None


def table(churn: float, runs: int, seed: int) -> str:
    head = "| leak per dump | " + " | ".join(f"R = {r // KIB} KiB" for r in PERIODS) + " |"
    lines = [head, "|" + "---|" * (len(PERIODS) + 1)]
    for rate in RATES:
        cells = []
        for period in PERIODS:
            n = needed(rate, period, churn, runs, seed)
            lam = rate / SIZE * ls.sample_probability(SIZE, period)
            cells.append(f"{n if n is not None else f'> {LENGTHS[-1]}'} ({lam:.3g}/dump)")
        name = f"{rate // KIB} KiB" if rate < 1024 * KIB else f"{rate // (1024 * KIB)} MiB"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=400)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    print("Dumps needed for a 95% leak verdict (expected new samples per dump in brackets)\n")
    print(table(0.0, args.runs, args.seed))
    print("\nThe same leak beside 10x its growth in short-lived objects at the same site\n")
    print(table(10.0, args.runs, args.seed))
    print(f"\n({args.runs} simulated runs per cell; 256-byte objects; "
          f"lengths tried: {', '.join(map(str, LENGTHS))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
