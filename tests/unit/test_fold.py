"""Folding stacks to their site: the first frame of the program's own code, with a via chain."""

from __future__ import annotations

import pytest

from heapscope.analysis.aggregate import aggregate, sort_rows
from heapscope.analysis.fold import FramePolicy, fold
from heapscope.errors import UsageError
from heapscope.model import INUSE_SPACE, Profile
from tests.unit.builders import Builder

VEC = "std::_Vector_base<char>::_M_allocate@/usr/include/c++/12/bits/stl_vector.h:378"
STR = "std::__cxx11::basic_string<char>::_M_construct@/usr/include/c++/12/bits/basic_string.tcc:225"


def _site(p: Profile, i: int = 0) -> str:
    loc = p.location(p.samples[i].stack[0])
    f = loc.frames[0] if loc.frames else None
    return f"{f.function}:{f.line}" if f else loc.fallback_name


def test_inlined_container_folds_into_the_users_line() -> None:
    b = Builder()
    p = b.profile(b.sample(f"{VEC};insert@reg.cpp:41", "main@reg.cpp:90"),
                  b.sample(f"{STR};insert@reg.cpp:41", "main@reg.cpp:90"))
    got = fold(p).profile
    assert [_site(got, i) for i in range(2)] == ["insert:41", "insert:41"]
    assert [v.function for v in got.samples[0].via] == ["std::_Vector_base<char>::_M_allocate"]
    assert got.samples[0].via[0].kind == "library"
    # One user line through two containers is one row with one total.
    rows = sort_rows(aggregate([got], INUSE_SPACE, "lines"))
    assert (rows[0].key.name, rows[0].key.line, rows[0].flat) == ("insert", 41, 200)


def test_dependency_frames_fold_into_their_caller() -> None:
    b = Builder()
    p = b.profile(b.sample("xml:xmlStrndup", "xml:xmlReadMemory", "keep_docs@t.c:70",
                           "main@t.c:100"))
    got = fold(p).profile
    assert _site(got) == "keep_docs:70"
    assert [(v.function, v.kind) for v in got.samples[0].via] == [
        ("xmlStrndup", "dependency"), ("xmlReadMemory", "dependency")]


def test_without_own_code_the_first_dependency_then_the_leaf() -> None:
    b = Builder()
    dep = b.profile(b.sample("libc:qsort", "xml:xmlParseChunk", "libc:__libc_start_main"))
    assert _site(fold(dep).profile) == "xmlParseChunk:0"
    lib = b.profile(b.sample("libc:__tzfile_read", "libc:tzset", "libc:__libc_start_main"))
    assert _site(fold(lib).profile) == "__tzfile_read:0"
    assert fold(lib).profile.samples[0].via == ()


def test_jni_entry_is_the_site_when_no_own_code() -> None:
    b = Builder()
    p = b.profile(b.sample("xml:inflateInit2_", "libc:Java_java_util_zip_Inflater_init",
                           "libc:JavaCalls"))
    assert _site(fold(p).profile) == "Java_java_util_zip_Inflater_init:0"


def test_raw_mode_changes_nothing() -> None:
    b = Builder()
    p = b.profile(b.sample(f"{VEC};insert@reg.cpp:41", "main@reg.cpp:90"))
    assert fold(p, FramePolicy(mode="raw")).profile is p


def _wrapper_profile(b: Builder, callers: int) -> Profile:
    samples = [b.sample("checked_alloc@w.c:32", f"caller{k}@w.c:{40 + k}", "main@w.c:70")
               for k in range(callers)]
    samples.append(b.sample("make_record@w.c:63", "main@w.c:72"))
    return b.profile(*samples)


def test_a_thin_leaf_called_from_three_functions_is_a_wrapper() -> None:
    b = Builder()
    folded = fold(_wrapper_profile(b, 3))
    assert [_site(folded.profile, i) for i in range(4)] == [
        "caller0:40", "caller1:41", "caller2:42", "make_record:63"]
    assert folded.profile.samples[0].via[0].kind == "wrapper"
    assert folded.wrappers.found == {"checked_alloc": 3}


def test_two_callers_are_not_enough() -> None:
    b = Builder()
    folded = fold(_wrapper_profile(b, 2))
    assert _site(folded.profile) == "checked_alloc:32"
    assert folded.wrappers.found == {}


def test_a_function_seen_as_a_caller_is_not_a_wrapper() -> None:
    b = Builder()
    p = _wrapper_profile(b, 3)
    # checked_alloc also calls something that allocates: it does more than wrap malloc.
    p = b.profile(*p.samples, b.sample("helper@w.c:5", "checked_alloc@w.c:33", "main@w.c:74"))
    assert _site(fold(p).profile) == "checked_alloc:32"


def test_user_says_what_is_and_is_not_a_wrapper() -> None:
    b = Builder()
    p = _wrapper_profile(b, 3)
    kept = fold(p, FramePolicy(not_alloc_fn=("^checked_alloc$",))).profile
    assert _site(kept) == "checked_alloc:32"
    named = fold(p, FramePolicy(alloc_fn=("^make_record$",)))
    assert _site(named.profile, 3) == "main:72"
    assert named.wrappers.user == {"make_record"}
    with pytest.raises(UsageError, match="--alloc-fn"):
        FramePolicy.from_env(alloc_fn=("(",))


def test_well_known_wrappers_fold_with_one_caller() -> None:
    b = Builder()
    folded = fold(b.profile(b.sample("xmalloc@x.c:10", "load@x.c:20", "main@x.c:30")))
    assert _site(folded.profile) == "load:20"
    assert folded.wrappers.named == {"xmalloc"}


def test_own_option_makes_a_dependency_the_site() -> None:
    b = Builder()
    p = b.profile(b.sample("xml:xmlStrndup", "xml:xmlReadMemory", "keep_docs@t.c:70"))
    assert _site(fold(p, FramePolicy(own=("libxml2",))).profile) == "xmlStrndup:0"


def test_a_leaf_that_allocates_in_several_places_is_not_a_wrapper() -> None:
    b = Builder()
    p = b.profile(*(b.sample(f"make_node@n.c:{10 + k % 2}", f"caller{k}@n.c:{40 + k}", "main")
                    for k in range(4)))
    folded = fold(p)
    assert _site(folded.profile) == "make_node:10"
    assert folded.wrappers.found == {}
