"""Select stacks and threads: ``--focus``/``--ignore`` regular expressions and ``--thread``.

Like jeprof, focus and ignore test every frame of a stack (its function name, ``file:line``
and ``module+0xoffset``) and keep or drop whole stacks.
"""

from __future__ import annotations

import re

from heapscope.errors import UsageError
from heapscope.model import Location, Profile, Sample


def compile_re(pattern: str, option: str) -> re.Pattern[str]:
    """Compile a user's regular expression, or fail with a one-line usage error."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise UsageError(f"{option} {pattern!r}: invalid regular expression: {e}") from None


def location_texts(loc: Location) -> list[str]:
    """The strings a focus/ignore pattern is matched against for one location."""
    out = [loc.fallback_name]
    for f in loc.frames:
        out.append(f.function)
        if f.file:
            out.append(f"{f.file}:{f.line}")
    return out


def _matcher(profile: Profile, rx: re.Pattern[str]) -> dict[int, bool]:
    hits: dict[int, bool] = {}
    for a in profile.addresses():
        hits[a] = any(rx.search(t) for t in location_texts(profile.location(a)))
    return hits


def focus(profile: Profile, rx: re.Pattern[str]) -> Profile:
    """Keep only stacks with at least one frame matching ``rx``."""
    hits = _matcher(profile, rx)
    kept = tuple(s for s in profile.samples if any(hits[a] for a in s.stack))
    return profile.with_(samples=kept)


def ignore(profile: Profile, rx: re.Pattern[str]) -> Profile:
    """Drop stacks with any frame matching ``rx``."""
    hits = _matcher(profile, rx)
    kept = tuple(s for s in profile.samples if not any(hits[a] for a in s.stack))
    return profile.with_(samples=kept)


def thread_ids(profile: Profile, selector: str) -> set[int]:
    """Thread uids chosen by ``selector``: a number, an exact name, or a name regex."""
    if selector.isdigit():
        return {int(selector)}
    exact = {t.id for t in profile.threads if t.name == selector}
    if exact:
        return exact
    rx = compile_re(selector, "--thread")
    return {t.id for t in profile.threads if t.name and rx.search(t.name)}


def select_threads(profile: Profile, selector: str) -> Profile:
    """Keep only the values that the chosen threads allocated (needs per-thread values)."""
    ids = thread_ids(profile, selector)
    if not ids:
        known = ", ".join(f"{t.id}" + (f" ({t.name})" if t.name else "") for t in profile.threads)
        raise UsageError(
            f"{profile.source}: no thread matches {selector!r}; threads: {known or 'none'}"
        )
    width = len(profile.sample_types)
    out: list[Sample] = []
    for s in profile.samples:
        vals = [0.0] * width
        found = False
        for tv in s.threads:
            if tv.thread in ids:
                found = True
                for k in range(width):
                    vals[k] += tv.values[k]
        if found:
            out.append(Sample(s.stack, tuple(vals), ()))
    return profile.with_(samples=tuple(out))  # fewer stacks: address sets recomputed
