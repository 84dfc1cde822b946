"""Select stacks, frames and threads: ``--focus``/``--ignore`` and ``--hide``/``--show``
regular expressions, and ``--thread``.

Like jeprof, focus and ignore test every frame of a stack (its function name, ``file:line``
and ``module+0xoffset``) and keep or drop whole stacks. Like pprof, hide and show keep every
stack and change its frames: ``hide`` drops the frames that match, ``show`` keeps only those.
A frame matches by its function name or ``file:line``; a location's ``module+0xoffset``
matching stands for all its frames (as pprof's mapping file does). A stack keeps its values
whatever is dropped from it; one left with no frame at all is counted as ``[no stack]``
(pprof drops such a stack, and with it part of the total the percentages are of).
"""

from __future__ import annotations

import re

from heapscope.errors import UsageError
from heapscope.model import Frame, Location, Profile, Sample


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


def _frame_matches(frame: Frame, rx: re.Pattern[str]) -> bool:
    if rx.search(frame.function):
        return True
    return bool(frame.file) and rx.search(f"{frame.file}:{frame.line}") is not None


def kept_frames(loc: Location, rx: re.Pattern[str], show: bool) -> tuple[Frame, ...] | None:
    """The frames of ``loc`` that ``--show rx`` (``show``) or ``--hide rx`` leaves, or None
    when none is left and the location goes from the stacks."""
    whole = rx.search(loc.fallback_name) is not None
    if whole or not loc.frames:
        return loc.frames if whole == show else None
    frames = tuple(f for f in loc.frames if _frame_matches(f, rx) == show)
    return frames or None


def _reframe(profile: Profile, rx: re.Pattern[str], show: bool) -> Profile:
    """``profile`` with each location's frames as :func:`kept_frames` leaves them."""
    locations = dict(profile.locations)
    gone: set[int] = set()
    new_leaf: set[int] = set()  # addresses whose innermost frame went
    changed = False
    for a in profile.addresses():
        loc = profile.location(a)
        frames = kept_frames(loc, rx, show)
        if frames is None:
            gone.add(a)
        elif frames != loc.frames:
            locations[a] = loc._replace(frames=frames)
            changed = True
            if frames[0] is not loc.frames[0]:
                new_leaf.add(a)
    if not gone and not changed:
        return profile
    samples = []
    for s in profile.samples:
        stack = tuple(a for a in s.stack if a not in gone) if gone else s.stack
        if s.via and (not stack or stack[0] != s.stack[0] or stack[0] in new_leaf):
            # The frames folded into the site are no longer beside what is now the leaf.
            s = Sample(stack, s.values, s.threads)
        elif stack is not s.stack:
            s = Sample(stack, s.values, s.threads, s.via)
        samples.append(s)
    return profile.with_(samples=tuple(samples), locations=locations)


def hide(profile: Profile, rx: re.Pattern[str]) -> Profile:
    """Drop the frames matching ``rx`` from every stack (the stacks keep their values)."""
    return _reframe(profile, rx, show=False)


def show(profile: Profile, rx: re.Pattern[str]) -> Profile:
    """Keep only the frames matching ``rx`` in every stack (the stacks keep their values)."""
    return _reframe(profile, rx, show=True)


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
