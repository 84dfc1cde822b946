"""``--focus`` and ``--ignore`` over a series: which sites a leak report or timeline keeps.

A site of a series is one distinct pruned stack, so choosing sites by their frames chooses
the same stacks ``top --focus`` would: a site is kept when a frame of its stack, or a frame
folded into it (its ``via``), matches the focus pattern, and dropped when one matches the
ignore pattern. Patterns are matched as in :mod:`heapscope.analysis.filter`: against a
frame's function and its ``file:line``, and a location's ``module+0xoffset`` name.
"""

from __future__ import annotations

import dataclasses
import re

from heapscope.analysis.filter import compile_re, location_texts
from heapscope.analysis.series import ProcessSeries, SiteKey


def _texts(series: ProcessSeries, key: SiteKey) -> list[str]:
    """The strings the patterns are matched against for one site."""
    out: list[str] = []
    profile = series.profile
    if profile is not None:
        for a in series.site_stacks.get(key, ()):
            out.extend(location_texts(profile.location(a)))
    for v in series.site_via.get(key, ()):
        out.append(v.function)
    return out


def select_sites(series: ProcessSeries, focus: str | None, ignore: str | None
                 ) -> ProcessSeries:
    """The series with only the sites the patterns keep (its dumps and times unchanged)."""
    if (not focus and not ignore) or not series.sites:
        return series
    keep_rx = compile_re(focus, "--focus") if focus else None
    drop_rx = compile_re(ignore, "--ignore") if ignore else None

    def kept(key: SiteKey) -> bool:
        texts = _texts(series, key)
        if keep_rx is not None and not _any(keep_rx, texts):
            return False
        return drop_rx is None or not _any(drop_rx, texts)

    rows = [i for i, key in enumerate(series.sites) if kept(key)]
    sites = [series.sites[i] for i in rows]
    chosen = set(sites)
    return dataclasses.replace(
        series, sites=sites, values=series.values[rows], objects=series.objects[rows],
        samples=series.samples[rows],
        site_stacks={k: v for k, v in series.site_stacks.items() if k in chosen},
        site_via={k: v for k, v in series.site_via.items() if k in chosen})


def _any(rx: re.Pattern[str], texts: list[str]) -> bool:
    return any(rx.search(t) for t in texts)
