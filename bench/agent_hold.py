#!/usr/bin/env python3
"""What the agent's leak gauge does round after round: simulated sites judged over a sliding
window, the verdict alone against the verdict held through `growing` (agent/watch.py's
``hold``), and how often a "held for 30 rounds" alert (deploy/prometheus's HeapscopeLeak at
one round a minute) fires.

    python bench/agent_hold.py                # 200 runs per site, 150 dumps, window 30
    python bench/agent_hold.py --runs 1000

The sites are tests/leaksim.py's (jemalloc's sampling, object by object; 256-byte objects at
a 64 KiB sample period); each round judges the last WINDOW dumps with heapscope's classifier
(heapscope.analysis.trend), as the agent judges its window.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO))

from tests.agentsim import DUMPS, FOR, SITES, WINDOW, fired, held, rounds  # noqa: E402

from heapscope.analysis import trend  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args()
    print("| site | truth | rounds at 1: verdict | held | alert fired: verdict | held |")
    print("|---|---|---|---|---|---|")
    for i, (name, plan) in enumerate(SITES):
        v = rounds(plan, args.runs, np.random.default_rng([args.seed, i]))
        raw, kept = v == trend.LEAK, held(v)
        print(f"| {name} | {plan.truth} | {raw.mean():.3f} | {kept.mean():.3f} | "
              f"{fired(raw).mean():.3f} | {fired(kept).mean():.3f} |")
    print(f"\n({args.runs} runs per site, {DUMPS} dumps, a window of {WINDOW}, alert after "
          f"{FOR} rounds at 1; seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
