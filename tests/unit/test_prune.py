"""Allocator frames are removed by module and by name; the caller that asked stays."""

from __future__ import annotations

import pytest

from heapscope.analysis.prune import is_allocator_name, prune
from tests.unit.builders import Builder


@pytest.mark.parametrize(
    "name",
    [
        "malloc", "calloc", "realloc", "posix_memalign", "operator new", "operator new[]",
        "je_prof_backtrace", "_rjem_je_prof_backtrace", "_rjem_malloc", "prof_backtrace_impl",
        "imalloc_body", "je_malloc_default", "__rust_alloc", "alloc::alloc::exchange_malloc",
        "alloc::raw_vec::finish_grow", "strdup", "__GI___strdup", "strndup",
        "<std::alloc::System as core::alloc::global::GlobalAlloc>::alloc",
        "std::__new_allocator<int>::allocate", "__gnu_cxx::new_allocator<char>::allocate",
    ],
)
def test_allocator_names(name: str) -> None:
    assert is_allocator_name(name)


@pytest.mark.parametrize("name", ["main", "leak_small", "mallocate_table", "profile_load",
                                  "app::Widget<int>::grow", "my_strdup_wrapper"])
def test_user_names_kept(name: str) -> None:
    assert not is_allocator_name(name)


def _names(b: Builder, p: object) -> list[list[str]]:
    from heapscope.model import Profile

    assert isinstance(p, Profile)
    return [[p.location(a).frames[0].function if p.location(a).frames else
             p.location(a).fallback_name for a in s.stack] for s in p.samples]


def test_prune_module_and_names() -> None:
    b = Builder()
    p = b.profile(
        b.sample("je:?internal", "je:prof_backtrace_impl", "je:malloc", "libc:strdup",
                 "copy_names", "main"),
        b.sample("je:?x", "operator new", "app::Widget<int>::grow", "main"),
    )
    out = prune(p)
    assert _names(b, out) == [["copy_names", "main"], ["app::Widget<int>::grow", "main"]]


def test_stops_at_first_user_frame() -> None:
    b = Builder()
    p = b.profile(b.sample("je:malloc", "user_fn", "libc:strdup", "main"))
    assert _names(b, prune(p)) == [["user_fn", "strdup", "main"]]


def test_all_allocator_keeps_outermost() -> None:
    b = Builder()
    p = b.profile(b.sample("je:a", "je:b"))
    assert len(prune(p).samples[0].stack) == 1


def test_inlined_allocator_shim_trimmed_from_leaf() -> None:
    b = Builder()
    p = b.profile(b.sample("je:malloc",
                           "std::__new_allocator<int>::allocate@new.h:9;fill@f.cc:3", "main"))
    out = prune(p)
    leaf = out.location(out.samples[0].stack[0])
    assert [f.function for f in leaf.frames] == ["fill"]


def test_unnamed_frames_inside_an_allocator_are_skipped() -> None:
    b = Builder()
    p = b.profile(
        b.sample("je:malloc", "pg:?AllocSetAlloc", "pg:palloc", "leak_top", "pg:ExecInterpExpr"),
        b.sample("je:malloc", "pg:?static_helper", "pg:ExecInterpExpr", "pg:palloc"),
    )
    out = _names(b, prune(p))
    assert out[0][0] == "leak_top"
    # An unnamed frame followed by a named program frame is the program's: kept as the leaf.
    assert out[1][0].startswith("postgres+0x")


def test_palloc_is_only_an_allocator_inside_postgres() -> None:
    b = Builder()
    p = b.profile(b.sample("je:malloc", "palloc", "main"))  # a program's own "palloc"
    assert _names(b, prune(p))[0][0] == "palloc"
