"""Folding stacks to their site: the first frame of the program's own code, with a via chain."""

from __future__ import annotations

import pytest

from heapscope.analysis.aggregate import aggregate, sort_rows
from heapscope.analysis.classify import is_constructor_name
from heapscope.analysis.fold import FramePolicy, fold
from heapscope.errors import UsageError
from heapscope.model import INUSE_SPACE, Profile, Sample
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


def test_two_callers_of_own_code_are_enough() -> None:
    b = Builder()
    folded = fold(_wrapper_profile(b, 2))
    assert [_site(folded.profile, i) for i in range(3)] == [
        "caller0:40", "caller1:41", "make_record:63"]
    assert folded.wrappers.found == {"checked_alloc": 2}
    assert folded.wrappers.describe() == \
        "folded as allocation wrappers: checked_alloc (2 callers)"


def test_one_caller_without_a_constructor_name_stays_the_site() -> None:
    b = Builder()
    # Thin, but with one caller and a name that says nothing: uncertain, so not folded
    # (its caller is still the next frame of its stack).
    folded = fold(b.profile(b.sample("fill_buffer@f.c:12", "load@f.c:40", "main@f.c:70")))
    assert _site(folded.profile) == "fill_buffer:12"
    assert folded.wrappers.found == {}


def test_a_wrapper_the_series_showed_folds_in_a_dump_that_shows_one_caller() -> None:
    b = Builder()
    # At exit only one of mem_alloc's two callers still holds memory: alone, the dump keeps
    # mem_alloc as the site; told what the whole series showed, it folds it.
    p = b.profile(b.sample("mem_alloc@m.c:34", "remember_sessions@m.c:45", "main@m.c:70"))
    assert _site(fold(p).profile) == "mem_alloc:34"
    told = fold(p, FramePolicy(known=("mem_alloc",)))
    assert _site(told.profile) == "remember_sessions:45"
    assert told.wrappers.as_list() == [{"function": "mem_alloc", "why": "series"}]
    assert "mem_alloc (over the series)" in told.wrappers.describe()
    # The user's --not-alloc-fn still wins.
    vetoed = fold(p, FramePolicy(known=("mem_alloc",), not_alloc_fn=("^mem_alloc$",)))
    assert _site(vetoed.profile) == "mem_alloc:34"


def test_two_callers_of_a_dependency_are_not_enough() -> None:
    b = Builder()
    p = b.profile(b.sample("xml:xmlBufGrow", "xml:xmlParseA", "load@t.c:10"),
                  b.sample("xml:xmlBufGrow", "xml:xmlParseB", "load@t.c:11"))
    folded = fold(p, FramePolicy(own=("/srv/",)))
    assert folded.wrappers.found == {}


def test_a_constructor_name_over_a_wrapper_folds_with_one_caller() -> None:
    b = Builder()
    p = b.profile(b.sample("zmalloc@z.c:3", "node_new@n.c:5", "build_tree@n.c:30",
                           "main@n.c:50"),
                  b.sample("xmalloc@x.c:4;createObject@o.c:8", "add_key@db.c:12",
                           "main@n.c:51"))
    folded = fold(p)
    assert [_site(folded.profile, i) for i in range(2)] == ["build_tree:30", "add_key:12"]
    assert [(v.function, v.line, v.kind) for v in folded.profile.samples[0].via] == [
        ("zmalloc", 3, "wrapper"), ("node_new", 5, "wrapper")]
    assert folded.wrappers.found == {"node_new": 1, "createObject": 1}
    assert folded.wrappers.describe() == (
        "folded as allocation wrappers: xmalloc, zmalloc, createObject (1 caller, "
        "constructor name), node_new (1 caller, constructor name)")
    assert {"function": "node_new", "why": "profile", "callers": 1, "constructor": True} \
        in folded.wrappers.as_list()


def test_a_name_alone_does_not_fold_a_function_calling_the_allocator() -> None:
    b = Builder()
    # leaky.c's worker_alloc fills a table with calloc in a loop: from a dump it looks just
    # like a constructor with one caller. With a second caller it is folded.
    p = b.profile(b.sample("worker_alloc@l.c:81", "worker_main@l.c:88", "libc:start_thread"))
    folded = fold(p)
    assert _site(folded.profile) == "worker_alloc:81"
    assert folded.wrappers.found == {}
    p = b.profile(*p.samples, b.sample("worker_alloc@l.c:81", "reload@l.c:95", "main@l.c:99"))
    assert fold(p).wrappers.found == {"worker_alloc": 2}


def test_a_name_does_not_fold_into_main() -> None:
    b = Builder()
    # A constructor called by main, and one inlined into another constructor called by
    # main: main would be the site, which says nothing.
    p = b.profile(b.sample("zmalloc@z.c:3", "node_new@n.c:5", "main@n.c:50"),
                  b.sample("zmalloc@z.c:3", "inner_dup@n.c:9;outer_alloc@n.c:20",
                           "main@n.c:51"))
    folded = fold(p)
    assert [_site(folded.profile, i) for i in range(2)] == ["node_new:5", "inner_dup:9"]
    assert folded.wrappers.found == {}


def test_an_inlined_helper_with_two_callers_folds() -> None:
    b = Builder()
    # gcc -O2 inlines mem_alloc into both its callers: two addresses, one line.
    p = b.profile(b.sample("mem_alloc@m.c:9;remember@m.c:20", "main@m.c:51"),
                  b.sample("mem_alloc@m.c:9;handle@m.c:30", "main@m.c:52"))
    folded = fold(p)
    assert [_site(folded.profile, i) for i in range(2)] == ["remember:20", "handle:30"]
    assert [(v.function, v.line) for v in folded.profile.samples[0].via] == [("mem_alloc", 9)]
    assert folded.wrappers.found == {"mem_alloc": 2}


def test_new_inside_a_name_is_not_a_constructor() -> None:
    b = Builder()
    p = b.profile(b.sample("leak_new_sessions@s.c:20", "main@s.c:90"))
    assert _site(fold(p).profile) == "leak_new_sessions:20"


def test_a_constructor_name_with_several_call_sites_stays_the_site() -> None:
    b = Builder()
    # Allocates on two lines, for two callers: it does more than make one object.
    p = b.profile(b.sample("session_new@s.c:20", "accept_one@s.c:60", "main@s.c:90"),
                  b.sample("session_new@s.c:24", "accept_two@s.c:70", "main@s.c:91"))
    folded = fold(p)
    assert [_site(folded.profile, i) for i in range(2)] == ["session_new:20", "session_new:24"]
    assert folded.wrappers.found == {}


def test_one_line_at_two_addresses_is_one_call_site() -> None:
    b = Builder()
    p = _wrapper_profile(b, 2)
    # The compiler copied the call to malloc (an unrolled loop): a second address, same line.
    a = b.loc("checked_alloc@w.c:32")
    twin = a + 8
    b.locations[twin] = b.locations[a]._replace(address=twin)
    p = b.profile(*p.samples, Sample((twin, b.loc("caller0@w.c:40"), b.loc("main@w.c:70")),
                                     (1, 100, 1, 100)))
    assert fold(p).wrappers.found == {"checked_alloc": 2}


def test_helpers_over_wrappers_fold_level_by_level() -> None:
    b = Builder()
    # Redis's keyspace: zmalloc (a named wrapper) <- sdsnewlen (two callers) <- createObject
    # (a constructor name) <- dbAdd, whose line the report should name.
    p = b.profile(
        b.sample("zmalloc@zmalloc.c:10", "sdsnewlen@sds.c:20", "createObject@object.c:30",
                 "dbAdd@db.c:40", "setKey@db.c:50", "main@server.c:5"),
        b.sample("zmalloc@zmalloc.c:10", "sdsnewlen@sds.c:20", "sdsdup@sds.c:60",
                 "rdbLoad@rdb.c:70", "main@server.c:6"),
        b.sample("zmalloc@zmalloc.c:12", "dictAddRaw@dict.c:80", "dbAdd@db.c:41",
                 "setKey@db.c:50", "main@server.c:5"))
    folded = fold(p)
    assert [_site(folded.profile, i) for i in range(3)] == [
        "dbAdd:40", "rdbLoad:70", "dictAddRaw:80"]
    assert [v.function for v in folded.profile.samples[0].via] == [
        "zmalloc", "sdsnewlen", "createObject"]
    # dictAddRaw has one caller here and no constructor name: uncertain, so it stays the site.
    assert folded.wrappers.found == {"sdsnewlen": 2, "createObject": 1, "sdsdup": 1}
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
    # Made own by --own, libxml2 is read as its author would: xmlStrndup's name (a
    # constructor's) does not fold it into its one caller.
    assert _site(fold(p, FramePolicy(own=("libxml2",))).profile) == "xmlStrndup:0"


def test_a_leaf_that_allocates_in_several_places_is_not_a_wrapper() -> None:
    b = Builder()
    p = b.profile(*(b.sample(f"make_node@n.c:{10 + k % 2}", f"caller{k}@n.c:{40 + k}", "main")
                    for k in range(4)))
    folded = fold(p)
    assert _site(folded.profile) == "make_node:10"
    assert folded.wrappers.found == {}


@pytest.mark.parametrize("name", [
    "mem_alloc", "createObject", "strbuf_new", "new_node", "make_record", "xstrdup", "sdsdup",
    "kmalloc", "list_copy", "clone_tree", "allocate_table", "Session::create",
    "newSession", "zmalloc_usable"])
def test_constructor_names(name: str) -> None:
    assert is_constructor_name(name)


@pytest.mark.parametrize("name", [
    "leak_new_sessions", "init_table", "dictAddRaw", "sdsnewlen", "renew_lease", "parse_header",
    "main", "dbAdd", "Registry<int>::insert", "_PyBytes_FromSize", ""])
def test_not_constructor_names(name: str) -> None:
    assert not is_constructor_name(name)
