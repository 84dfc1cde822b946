"""Rounds of the agent over simulated sites: each round judges the last WINDOW dumps of a
tests/leaksim.py series with heapscope's classifier, as the agent judges its window; the
leak gauge with and without the hold (agent/watch.py's ``hold``); and whether a "held for FOR
rounds" alert fires. Used by bench/agent_hold.py and tests/unit/test_agent_hold.py."""

from __future__ import annotations

import numpy as np

from heapscope.agent.watch import hold
from heapscope.analysis import trend
from tests import leaksim as ls

WINDOW = 30
DUMPS = 150
FOR = 30  # rounds a gauge must stay 1 for the alert to fire
PERIOD = 64 * 1024
SIZE = 256

SITES: tuple[tuple[str, ls.Plan], ...] = (
    ("leak 1/dump", ls.Plan(ls.LEAK, leak=1, steady=20, size=SIZE)),
    ("leak 0.5/dump", ls.Plan(ls.LEAK, leak=0.5, steady=20, size=SIZE)),
    ("leak 2/dump + ±50% churn 10x", ls.Plan(ls.LEAK, leak=2, transient=20, spread=0.5,
                                             size=SIZE)),
    ("leak 4/dump + ±50% churn 25x", ls.Plan(ls.LEAK, leak=4, transient=100, spread=0.5,
                                             size=SIZE)),
    ("cache 200, turnover 30%", ls.Plan(ls.NOT_LEAK, cache=200, fill=0.1, turnover=0.3,
                                        size=SIZE)),
    ("cache 20, turnover 30%", ls.Plan(ls.NOT_LEAK, cache=20, fill=0.1, turnover=0.3,
                                       size=SIZE)),
    ("churn around 50", ls.Plan(ls.NOT_LEAK, transient=50, spread=0.5, size=SIZE)),
    ("steady table", ls.Plan(ls.NOT_LEAK, steady=100, size=SIZE)),
)


def rounds(plan: ls.Plan, runs: int, rng: np.random.Generator) -> np.ndarray:
    """Each run's verdict at each round (runs × rounds), the window sliding by one dump."""
    s = ls.simulate(plan, DUMPS, PERIOD, runs, rng)
    c = s.counts.astype(float)
    out = []
    for end in range(WINDOW, DUMPS + 1):
        w = c[:, end - WINDOW:end]
        out.append(trend.judge_counts(w, w * (s.size / s.p), w / s.p).verdict)
    return np.asarray(out).T


def held(verdicts: np.ndarray) -> np.ndarray:
    """The gauge with the hold, runs × rounds."""
    out = np.zeros(verdicts.shape, dtype=np.bool_)
    for r, row in enumerate(verdicts):
        kept: frozenset[int] = frozenset()
        for i, v in enumerate(row):
            kept = hold(kept, [(0, str(v))])
            out[r, i] = 0 in kept
    return out


def fired(gauge: np.ndarray) -> np.ndarray:
    """Per run: True when the gauge stayed 1 for FOR rounds in a row somewhere."""
    out = np.zeros(gauge.shape[0], dtype=np.bool_)
    for r, row in enumerate(gauge):
        run = 0
        for x in row:
            run = run + 1 if x else 0
            if run >= FOR:
                out[r] = True
                break
    return out


