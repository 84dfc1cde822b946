"""Folding a generated wide profile: thousands of functions, shallow stacks, every rule of the
wrapper search at once, with what each stack must become worked out from how it was built.

The profile (``W`` of each kind of helper, callers ``a0``, ``a1``… each at its own line, then
``main``):

- ``thin{i}``: one allocating line, called from ``a{i}`` and ``a{i+1}``: own code with two
  callers, a wrapper; its stacks are cut at the caller, ``via thin{i}``.
- ``lone{i}``: called from ``a{i}`` alone, no constructor's name: stays the site.
- ``node_new{i}`` over ``xmalloc`` (a well-known wrapper), from ``a{i}`` alone: a
  constructor's name allocating through a wrapper, folded with one caller.
- ``cfg_new{i}`` over ``xmalloc``, from ``main``: folding it would make main the site, so
  it stays the site, ``via xmalloc``.
- ``twice{i}``: allocates at two lines, three callers: does more than wrap, stays.
- ``core_alloc`` under every ``layer{i}``, each called from ``a{i}`` and ``a{i+1}``:
  ``core_alloc`` (``W`` callers) is found first, then each ``layer{i}`` over it, one level
  later; the stacks are cut at ``a{j}``, ``via core_alloc, layer{i}``.
- ``both``: a thin leaf with three callers that is also seen calling ``lone_extra``: not
  only ever a head, so not a wrapper.
"""

from __future__ import annotations

import pytest

from heapscope import native
from heapscope.analysis import fold
from heapscope.analysis.fold import FramePolicy
from heapscope.model import Profile, ViaFrame
from tests.unit.builders import Builder

W = 400
MAIN = "main@main.c:10"


def _a(j: int) -> str:
    return f"a{j}@a.c:{j + 1}"


def _wide() -> tuple[Profile, list[tuple[str, list[str]]]]:
    """The profile, and per sample what folding must make of it by the rules above: (the
    site's function, the via chain's functions)."""
    b = Builder()
    stacks: list[tuple[str, ...]] = []
    want: list[tuple[str, list[str]]] = []

    def add(*stack: str, site: str, via: list[str]) -> None:
        stacks.append(stack)
        want.append((site, via))

    for i in range(W):
        for j in (i, i + 1):
            add(f"thin{i}@b.c:{i + 1}", _a(j), MAIN, site=f"a{j}", via=[f"thin{i}"])
        add(f"lone{i}@c.c:{i + 1}", _a(i), MAIN, site=f"lone{i}", via=[])
        add("xmalloc@x.c:5", f"node_new{i}@n.c:{i + 1}", _a(i), MAIN, site=f"a{i}",
            via=["xmalloc", f"node_new{i}"])
        add("xmalloc@x.c:5", f"cfg_new{i}@g.c:{i + 1}", MAIN, site=f"cfg_new{i}",
            via=["xmalloc"])
        for j in range(3):
            add(f"twice{i}@t.c:{2 * i + 1 + j % 2}", _a(i + j), MAIN, site=f"twice{i}", via=[])
        for j in (i, i + 1):
            add("core_alloc@k.c:1", f"layer{i}@l.c:{i + 1}", _a(j), MAIN, site=f"a{j}",
                via=["core_alloc", f"layer{i}"])
    for j in range(3):
        add("both@z.c:1", _a(j), MAIN, site="both", via=[])
    add("lone_extra@c.c:9999", "both@z.c:7", MAIN, site="lone_extra", via=[])
    return b.profile(*(b.sample(*st) for st in stacks)), want


@pytest.mark.parametrize("compiled", [True, False])
def test_a_wide_profile_folds_as_its_shape_says(compiled: bool,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    if not compiled:
        monkeypatch.setattr(fold, "core", None)
    elif native.core is None:
        pytest.skip("the compiled loops are not built")
    p, want = _wide()
    got = fold.fold(p)
    w = got.wrappers
    assert w.named == {"xmalloc"} and not w.user and not w.series
    assert w.found == {**{f"thin{i}": 2 for i in range(W)},
                       **{f"node_new{i}": 1 for i in range(W)},
                       "core_alloc": W, **{f"layer{i}": 2 for i in range(W)}}
    constructors = [e["function"] for e in w.as_list() if e.get("constructor")]
    assert sorted(constructors) == sorted(f"node_new{i}" for i in range(W))
    for raw, s, (site, via) in zip(p.samples, got.profile.samples, want, strict=True):
        assert got.profile.location(s.stack[0]).frames[0].function == site
        assert [v.function for v in s.via] == via
        assert all(v.kind == "wrapper" for v in s.via)
        # The cut keeps the rest of the stack: the site, then its callers up to main.
        assert raw.stack[len(raw.stack) - len(s.stack):] == s.stack
        assert len(raw.stack) - len(s.stack) == len(via)
    # The raw view changes nothing.
    assert fold.fold(p, FramePolicy(mode="raw")).profile is p


def test_a_wide_profile_folded_twice_through_one_memo_is_the_same() -> None:
    # The dumps of one process share a memo: the second fold reads every stack from it.
    p, _ = _wide()
    memo: dict[tuple[int, ...], tuple[tuple[int, ...], int, tuple[ViaFrame, ...]]] = {}
    first = fold.fold(p, memo=memo)
    again = fold.fold(p, memo=memo)
    assert again.profile.samples == first.profile.samples
    assert again.wrappers.found == first.wrappers.found
    assert all(x.via is y.via for x, y in zip(first.profile.samples, again.profile.samples,
                                               strict=True))
