"""Frame classes: the program's own code, a language's library, or a dependency."""

from __future__ import annotations

import re

import pytest

from heapscope.analysis.classify import (
    DEPENDENCY,
    LIBRARY,
    OWN,
    Classifier,
    file_class,
    is_jni_entry,
    is_wrapper_name,
    name_class,
)


@pytest.mark.parametrize("name", [
    "std::vector<char, std::allocator<char> >::_M_realloc_insert<char const&>",
    "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >::_M_create",
    "__gnu_cxx::__normal_iterator<int*, std::vector<int> >::operator++",
    "__cxa_allocate_exception",
    "<u8 as alloc::vec::spec_from_elem::SpecFromElem>::from_elem",
    "<alloc::string::String as core::clone::Clone>::clone",
    "<[T]>::to_vec",
    "<&str as core::fmt::Display>::fmt",
    "alloc::fmt::format",
    "core::option::Option<T>::map_or_else",
    "hashbrown::raw::RawTable<T,A>::reserve_rehash",
    "std::thread::Builder::spawn_unchecked_::{{closure}}",
])
def test_standard_library_names(name: str) -> None:
    assert name_class(name) == LIBRARY


@pytest.mark.parametrize("name", [
    "store::Registry<std::__cxx11::basic_string<char> >::insert",  # a user template of std
    "app::tree::Tree::add_child",
    "<app::Config as core::clone::Clone>::clone",  # the user's impl of a std trait
    "<alloc::vec::Vec<u8> as app::Encode>::encode",  # the user's trait, for a std type
    "<app::Foo>::new",
    "standalone_helper",
    "std_like::thing",  # a crate whose name merely starts with std
    "main",
])
def test_names_that_prove_nothing(name: str) -> None:
    assert name_class(name) is None


@pytest.mark.parametrize(("path", "want"), [
    ("/usr/include/c++/12/bits/stl_vector.h", LIBRARY),
    ("/usr/lib/llvm-14/include/c++/v1/vector", LIBRARY),
    ("bits/basic_string.tcc", LIBRARY),
    ("/rustc/90b35a6239c3d8bdabc530a6a0816f7ff89a0aaf/library/alloc/src/vec/mod.rs", LIBRARY),
    ("/usr/src/rustc-1.63.0/library/core/src/option.rs", LIBRARY),
    ("/root/.rustup/toolchains/stable-x86_64-unknown-linux-gnu/lib/rustlib/src/rust/library/"
     "std/src/io/mod.rs", LIBRARY),
    ("/usr/include/x86_64-linux-gnu/bits/stdlib.h", LIBRARY),
    ("/usr/include/stdlib.h", LIBRARY),
    ("/home/u/.cargo/registry/src/index.crates.io-6f17d22bba15001f/serde_json-1.0.1/src/de.rs",
     DEPENDENCY),
    ("/usr/share/cargo/registry/libc-0.2.139/src/unix/mod.rs", DEPENDENCY),
    ("/usr/include/libxml2/libxml/tree.h", DEPENDENCY),
    ("/usr/include/boost/container/vector.hpp", DEPENDENCY),
])
def test_source_files(path: str, want: str) -> None:
    assert file_class(path) == want


@pytest.mark.parametrize("path", ["src/main.rs", "/srv/app/src/registry.cpp", "",
                                  "./build-debug/../Objects/bytesobject.c"])
def test_source_files_that_prove_nothing(path: str) -> None:
    assert file_class(path) is None


def test_a_server_and_its_extensions_are_own() -> None:
    c = Classifier("/usr/lib/postgresql/15/bin/postgres")
    assert c.module_class("/usr/lib/postgresql/15/bin/postgres", "postgres") == OWN
    assert c.module_class("/usr/lib/postgresql/15/lib/leakext.so", "leakext.so") == OWN
    assert c.module_class("/usr/lib/x86_64-linux-gnu/libxml2.so.2.9.14", "") == DEPENDENCY
    assert c.module_class("/usr/lib/x86_64-linux-gnu/libssl.so.3", "") == DEPENDENCY
    assert c.module_class("/lib/x86_64-linux-gnu/libc.so.6", "") == LIBRARY
    assert c.module_class("/usr/lib/x86_64-linux-gnu/libstdc++.so.6.0.30", "") == LIBRARY
    assert c.module_class("/lib64/ld-linux-x86-64.so.2", "") == LIBRARY


def test_a_program_built_in_a_project_owns_its_libraries() -> None:
    c = Classifier("/home/dev/proj/build/server")
    assert c.module_class("/home/dev/proj/build/server", "") == OWN
    assert c.module_class("/home/dev/proj/build/libplugin.so", "") == OWN
    assert c.module_class("/opt/vendor/lib/libthing.so", "") == OWN  # not a system folder
    assert c.module_class("/usr/lib/x86_64-linux-gnu/libsqlite3.so.0.8.6", "") == DEPENDENCY


def test_an_interpreter_is_a_runtime_and_its_extensions_are_too() -> None:
    c = Classifier("/usr/bin/python3.11")
    assert c.module_class("/usr/bin/python3.11", "") == LIBRARY
    assert c.module_class(
        "/usr/lib/python3.11/lib-dynload/zlib.cpython-311-x86_64-linux-gnu.so", "") == LIBRARY
    assert c.module_class("/usr/lib/x86_64-linux-gnu/libz.so.1.2.13", "") == DEPENDENCY
    assert c.module_class("/tmp/work/libcleak.so", "") == OWN  # the user's ctypes library
    assert c.module_class("/srv/venv/lib/python3.11/site-packages/lxml/etree.so", "") \
        == DEPENDENCY
    jvm = Classifier("/usr/lib/jvm/java-17-openjdk-amd64/bin/java")
    assert jvm.module_class("/usr/lib/jvm/java-17-openjdk-amd64/lib/libzip.so", "") == LIBRARY
    assert jvm.module_class("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so", "") \
        == LIBRARY
    assert jvm.module_class("", "[jit]") == LIBRARY


def test_own_option_claims_a_library() -> None:
    c = Classifier("/srv/app", (re.compile(r"libxml2"),))
    assert c.module_class("/usr/lib/x86_64-linux-gnu/libxml2.so.2.9.14", "") == OWN
    assert c.module_class("/usr/lib/x86_64-linux-gnu/libz.so.1", "") == DEPENDENCY


@pytest.mark.parametrize("name", [
    "xmalloc", "xcalloc", "xrealloc", "xstrdup", "g_malloc", "g_malloc0", "g_try_malloc",
    "av_mallocz", "sqlite3Malloc", "sqlite3DbMallocRawNN", "zmalloc", "zmalloc_usable",
    "ztrymalloc_usable_internal", "_PyMem_RawMalloc", "_PyMem_RawCalloc", "PyObject_Malloc",
    "CRYPTO_zalloc", "ngx_palloc", "ruby_xmalloc",
])
def test_wrapper_names(name: str) -> None:
    assert is_wrapper_name(name)


@pytest.mark.parametrize("name", ["make_record", "xml_alloc_node", "malloc_trim",
                                  "g_hash_table_insert", "zmalloc_stats", "PyList_New"])
def test_not_wrapper_names(name: str) -> None:
    assert not is_wrapper_name(name)


def test_jni_entry() -> None:
    assert is_jni_entry("Java_java_util_zip_Inflater_init")
    assert not is_jni_entry("Unsafe_AllocateMemory0")


def test_libraries_in_the_programs_runpath_are_its_own() -> None:
    c = Classifier("/usr/sbin/ns-slapd", (), ("/usr/lib/x86_64-linux-gnu/dirsrv", "/usr/lib"))
    assert c.module_class("/usr/lib/x86_64-linux-gnu/dirsrv/libslapd.so.0.1.0", "") == OWN
    assert c.module_class("/usr/lib/x86_64-linux-gnu/dirsrv/plugins/libback-ldbm.so", "") \
        == OWN
    # A system-wide folder in the RUNPATH claims nothing.
    assert c.module_class("/usr/lib/libfoo.so.1", "") == DEPENDENCY
