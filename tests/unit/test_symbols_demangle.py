"""Demangling and display-name shortening, on symbols taken from real g++ 12 / rustc 1.95 output."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heapscope.symbols.demangle import demangle, short_name

# (raw symbol, expected short display name); all from `nm` on g++ -O0/-O2 and rustc objects.
CASES = [
    # plain functions, namespaces, qualifiers
    ("_Z11get_handleri", "get_handler"),
    ("_ZNK2ns6Widget4growEi", "ns::Widget::grow"),
    ("_ZNO2ns6Widget8grow_refEi", "ns::Widget::grow_ref"),  # && qualifier
    ("_ZN12_GLOBAL__N_16hiddenEi", "(anonymous namespace)::hidden"),
    ("_ZN4BaseD0Ev", "Base::~Base"),
    # templates: return type removed, template arguments kept
    ("_ZN2ns4makeIlEEPT_i", "ns::make<long>"),
    ("_ZN6Holder7convertIlEET_S1_", "Holder::convert<long>"),
    ("_ZSt4moveIRN2ns6WidgetEEONSt16remove_referenceIT_E4typeEOS4_", "std::move<ns::Widget&>"),
    (
        "_ZSt3getILm0EJRKiEERNSt13tuple_elementIXT_ESt5tupleIJDpT0_EEE4typeERS6_",
        "std::get<0ul, int const&>",
    ),
    ("_ZNKSt6vectorIiSaIiEE4sizeEv", "std::vector<int, std::allocator<int> >::size"),
    # operators
    ("_ZNK2ns6WidgetclEi", "ns::Widget::operator()"),
    ("_ZNK2ns6WidgetltERKS0_", "ns::Widget::operator<"),
    ("_ZN2ns6WidgetlsEi", "ns::Widget::operator<<"),
    ("_ZN2ns6WidgetixEi", "ns::Widget::operator[]"),
    ("_ZN2ns6WidgetnwEm", "ns::Widget::operator new"),
    ("_ZN2ns6WidgetdaEPv", "ns::Widget::operator delete[]"),
    ("_ZnwmPv", "operator new"),
    ("_ZdlPvS_", "operator delete"),
    ("_ZNKSt9type_infoeqERKS_", "std::type_info::operator=="),
    ("_ZN2nsltIiEEbRKSt6vectorIT_SaIS2_EES6_", "ns::operator< <int>"),
    ("_ZN2nslsIiEERSoS1_RKSt6vectorIT_SaIS3_EE", "ns::operator<< <int>"),
    # conversion operators
    ("_ZNK2ns6WidgetcvbEv", "ns::Widget::operator bool"),
    (
        "_ZNK2ns6WidgetcvNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEEEv",
        "ns::Widget::operator std::__cxx11::basic_string<char, std::char_traits<char>, "
        "std::allocator<char> >",
    ),
    # lambdas and std::function
    ("_ZZ4mainENKUliE_clEi", "main::{lambda(int)#1}::operator()"),
    ("_ZZ4mainENKUliE0_clEi", "main::{lambda(int)#2}::operator()"),
    ("_Z3runIZ4mainEUliE_EPvT_", "run<main::{lambda(int)#1}>"),
    (
        "_ZNSt17_Function_handlerIFPviEZ4mainEUliE_E9_M_invokeERKSt9_Any_dataOi",
        "std::_Function_handler<void* (int), main::{lambda(int)#1}>::_M_invoke",
    ),
    ("_ZNKSt8functionIFPviEEclEi", "std::function<void* (int)>::operator()"),
    ("_ZNKSt8functionIFviEEclEi", "std::function<void (int)>::operator()"),
    # GCC clones and thunks
    ("_ZL3sum3Bigi.isra.0", "sum"),
    ("_ZL11alloc_constii.constprop.0", "alloc_const"),
    ("_Z3barv.constprop.0.isra.0", "bar"),
    ("_Z3fooi.cold", "foo"),
    ("_Z3bazv.lto_priv.0", "baz"),
    ("_ZThn8_N7Derived1fEi", "Derived::f"),
    # C names
    ("main", "main"),
    ("main.cold", "main"),
    ("lib_internal_alloc.constprop.0", "lib_internal_alloc"),
    ("lib_internal_alloc.part.0", "lib_internal_alloc"),
    # versioned names from static symbol tables (glibc, libstdc++ debug files)
    ("__libc_start_main@GLIBC_2.2.5", "__libc_start_main"),
    ("_IO_fclose@@GLIBC_2.2.5", "_IO_fclose"),
    ("_ZNKSt11logic_error4whatEv@@GLIBCXX_3.4", "std::logic_error::what"),
    # Rust legacy (hash removed) and v0
    ("_ZN1r15Widget$LT$T$GT$4grow17hd3b88eecdae347f1E", "r::Widget<T>::grow"),
    ("_ZN1r4main17h086b0cfd890a8ea9E", "r::main"),
    (
        "_ZN3std2rt10lang_start28_$u7b$$u7b$closure$u7d$$u7d$17ha86af84d9cc65291E",
        "std::rt::lang_start::{{closure}}",
    ),
    ("_ZN4core3ptr13drop_in_place17h0123456789abcdefE.llvm.1234", "core::ptr::drop_in_place"),
    ("_RNvMCs6GmmlP4bgsG_1rINtB2_6WidgetyE4growB2_", "<r::Widget<u64>>::grow"),
    ("_RNvCs6GmmlP4bgsG_1r4main", "r::main"),
    (
        "_RINvNtCsgEmfK2I1SDS_4core3ptr13drop_in_placeINtNtCslNYArtu3iFV_5alloc3vec3VecNtNtBL_6"
        "string6StringEECsjrHSEGnQ3l9_3std",
        "core::ptr::drop_in_place::<alloc::vec::Vec<alloc::string::String>>",
    ),
]


@pytest.mark.parametrize(("raw", "short"), CASES)
def test_short_names(raw: str, short: str) -> None:
    assert demangle(raw)[1] == short


def test_full_name_keeps_signature_and_clone_tag() -> None:
    assert demangle("_ZNK2ns6Widget4growEi")[0] == "ns::Widget::grow(int) const"
    assert demangle("_ZL3sum3Bigi.isra.0")[0] == "sum(Big, int) [clone .isra.0]"
    assert demangle("_ZN2ns4makeIlEEPT_i")[0] == "long* ns::make<long>(int)"


def test_undemanglable_names_are_kept() -> None:
    assert demangle("_Zbogus") == ("_Zbogus", "_Zbogus")
    assert demangle("_Rbogus") == ("_Rbogus", "_Rbogus")
    assert demangle("") == ("", "")
    assert demangle("JS:~ hot.js:1:1") == ("JS:~ hot.js:1:1", "JS:~ hot.js:1:1")


@pytest.mark.parametrize(
    ("full", "short"),
    [
        # shapes the table above does not reach through a real symbol
        ("void (*signal(int, void (*)(int)))(int)", "signal"),
        ("Foo::operator->() const", "Foo::operator->"),
        ("Foo::operator>>=(int)", "Foo::operator>>="),
        ("Foo::operator<=>(Foo const&) const", "Foo::operator<=>"),
        ('operator"" _km(unsigned long long)', 'operator"" _km'),
        (
            "std::__cxx11::basic_string<char>::_M_create[abi:cxx11](unsigned long&)",
            "std::__cxx11::basic_string<char>::_M_create",
        ),
        ("foo(int) [clone .isra.0] [clone .cold]", "foo"),
        ("virtual thunk to Base::~Base()", "Base::~Base"),
        ("my_operator(int)", "my_operator"),
        (
            "Foo::operator std::function<void (int)>() const",
            "Foo::operator std::function<void (int)>",
        ),
        (
            "f()::{lambda(std::function<void (int)>)#1}::operator()"
            "(std::function<void (int)>) const",
            "f()::{lambda(std::function<void (int)>)#1}::operator()",
        ),
    ],
)
def test_short_name_edge_cases(full: str, short: str) -> None:
    assert short_name(full) == short


def test_results_are_cached() -> None:
    first = demangle("_ZNK2ns6Widget4growEi")
    assert demangle("_ZNK2ns6Widget4growEi") is first


@given(st.text(max_size=80))
def test_never_raises_and_never_empties_a_name(raw: str) -> None:
    full, short = demangle(raw)
    assert isinstance(full, str) and isinstance(short, str)
    if raw:
        assert short
    assert short_name(raw) or not raw.strip()
