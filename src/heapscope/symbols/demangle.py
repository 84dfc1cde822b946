"""Demangle raw symbols and derive the short display names reports print.

:func:`demangle` dispatches on the mangling scheme (Rust legacy and v0 to ``pyderust``, other
Itanium ``_Z`` names to ``cxxfilt``) and then post-processes the demangler's text into a short
name: no parameter list, no return type, no cv/ref qualifiers, no GCC clone suffixes, but
namespaces and template arguments kept. This is string surgery on demangler output, not a
demangler, so it must only be given text that a demangler produced (or plain C names).
"""

from __future__ import annotations

import re

_CACHE: dict[str, tuple[str, str]] = {}
_CACHE_LIMIT = 200_000

# GCC/LLVM suffixes on local clones of a function, in raw symbol names: foo.isra.0,
# foo.constprop.0.isra.0, main.cold, foo.part.0, foo.lto_priv.0, foo.llvm.1234567.
_RAW_CLONE = re.compile(
    r"(?:\.(?:isra|constprop|part|cold|hot|lto_priv|localalias|llvm|clone|specialized|"
    r"unlikely)(?:\.\d+)*)+$"
)
# The same suffixes as the Itanium demangler prints them: "foo(int) [clone .isra.0]".
_CLONE_TAGS = re.compile(r"(?:\s*\[clone [^\]]*\])+$")
_VERSION = re.compile(r"@@?[A-Za-z0-9_.]+$")
_ABI_TAG = re.compile(r"\[abi:[^\]]*\]")
_RUST_LEGACY = re.compile(r"^_ZN.*17h[0-9a-f]{16}E$")
_RUST_HASH = re.compile(r"::h[0-9a-f]{16}$")
_THUNK_PREFIXES = ("non-virtual thunk to ", "virtual thunk to ", "covariant return thunk to ")
# Qualifiers that may follow a member function's parameter list.
_TRAILING_QUALIFIERS = (
    " const",
    " volatile",
    " &&",
    " &",
    " noexcept",
    " transaction_safe",
    " throw()",
)
# Operator spellings, longest first so "operator<<=" is not read as "operator<".
_OPERATORS = sorted(
    "() [] ->* -> <=> <<= >>= << >> <= >= == != && || ++ -- += -= *= /= %= &= |= ^= "
    "< > = + - * / % & | ^ ! ~ ,".split(),
    key=len,
    reverse=True,
)
_IDENT = re.compile(r"[A-Za-z0-9_$]")
_OPEN = "(<{["
_CLOSE = ")>}]"


def demangle(raw: str) -> tuple[str, str]:
    """``(full, short)`` display names for a raw symbol; both are ``raw`` if it won't demangle.

    ``full`` is the demangler's complete output; ``short`` is what reports print.
    """
    hit = _CACHE.get(raw)
    if hit is not None:
        return hit
    result = _demangle(raw)
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()  # a crude bound; real profiles have far fewer distinct symbols
    _CACHE[raw] = result
    return result


def _demangle(raw: str) -> tuple[str, str]:
    if not raw:
        return "", ""
    # Static symbol tables spell versioned symbols "name@VERSION" / "name@@VERSION" (e.g.
    # glibc's __libc_start_main@GLIBC_2.2.5); the version is not part of the name.
    raw = _VERSION.sub("", raw) or raw
    clone = _RAW_CLONE.search(raw)
    base = raw[: clone.start()] if clone else raw
    if base.startswith("_R") or _RUST_LEGACY.match(base):
        import pyderust  # imported when a Rust name turns up: C programs never pay for it

        try:
            full = str(pyderust.demangle(base))
        except Exception:  # pyderust.DemangleError, or anything odd from the extension
            full = ""
        if full:
            return full, _RUST_HASH.sub("", full)
    if base.startswith("_Z"):
        import cxxfilt  # imported (it loads libstdc++) when a C++ name turns up

        try:
            full = str(cxxfilt.demangle(raw))
        except Exception:  # cxxfilt.InvalidName; keep the raw name rather than fail
            return raw, raw
        return full, short_name(full)
    # A plain C name, possibly with a clone suffix: main.cold -> main.
    return raw, base or raw


def short_name(full: str) -> str:
    """Reduce a demangled C++ name to namespaces, name and template arguments.

    ``void ns::foo<int>(int) const [clone .isra.0]`` becomes ``ns::foo<int>``.
    """
    s = _CLONE_TAGS.sub("", full).strip()
    for prefix in _THUNK_PREFIXES:
        if s.startswith(prefix):
            s = s[len(prefix) :]
            break
    s = _strip_parameters(s)
    s = _strip_return_type(s)
    s = _ABI_TAG.sub("", s)
    return s or full


def _strip_qualifiers(s: str) -> str:
    changed = True
    while changed:
        changed = False
        s = s.rstrip()
        for q in _TRAILING_QUALIFIERS:
            if s.endswith(q):
                s = s[: -len(q)]
                changed = True
    return s


def _strip_parameters(s: str) -> str:
    """Remove the top-level parameter list (and what follows it) from a function signature."""
    s = _strip_qualifiers(s)
    mask = _mask_operators(s)
    if not mask.endswith(")"):
        return s  # not a function signature (data symbol, special name, C name)
    start = _matching_open(mask, len(mask) - 1)
    if start <= 0:
        return s
    head = s[:start].rstrip()
    head_mask = mask[: len(head)]
    # A function returning a function pointer: "void (*foo(int))(double)" leaves
    # "void (*foo(int))"; the name and its own parameters are inside the parentheses.
    if head_mask.endswith(")"):
        inner_open = _matching_open(head_mask, len(head_mask) - 1)
        if inner_open >= 0 and head[inner_open + 1 : inner_open + 2] in ("*", "&"):
            inner = head[inner_open + 2 : -1]
            return _strip_parameters(inner)
    return head


def _strip_return_type(s: str) -> str:
    """Drop a leading return type: everything up to the last space at nesting depth 0."""
    mask = _mask_operators(s)
    depth = 0
    cut = -1
    for i, c in enumerate(mask):
        if c in _OPEN:
            depth += 1
        elif c in _CLOSE:
            depth = max(depth - 1, 0)
        elif c == " " and depth == 0:
            cut = i
    return s[cut + 1 :] if cut >= 0 else s


def _matching_open(mask: str, close: int) -> int:
    """Index of the "(" matching the ")" at ``close`` (round brackets only), or -1."""
    depth = 0
    for i in range(close, -1, -1):
        c = mask[i]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _mask_operators(s: str) -> str:
    """``s`` with each ``operator…`` token replaced by 'x's of the same length.

    Operator names contain brackets and spaces (``operator()``, ``operator<``,
    ``operator delete[]``, ``operator std::string``) that would otherwise confuse the
    bracket matching; masking keeps every index valid.
    """
    out = list(s)
    pos = 0
    while True:
        i = s.find("operator", pos)
        if i < 0:
            break
        end = i + len("operator")
        pos = end
        if (i > 0 and _IDENT.match(s[i - 1])) or (end < len(s) and _IDENT.match(s[end])):
            continue  # part of a longer identifier, e.g. "my_operator"
        end = _operator_end(s, end)
        # "operator< <int>": the space before template arguments belongs to the name.
        if end + 1 < len(s) and s[end] == " " and s[end + 1] == "<":
            end += 1
        for k in range(i, end):
            out[k] = "x"
        pos = end
    return "".join(out)


def _operator_end(s: str, at: int) -> int:
    """End index of the operator token whose symbol part starts at ``at``."""
    rest = s[at:]
    for op in _OPERATORS:
        if rest.startswith(op):
            return at + len(op)
    if rest.startswith('""'):  # user-defined literal: operator"" _km
        m = re.match(r'""\s*[A-Za-z0-9_]*', rest)
        return at + (m.end() if m else 2)
    m = re.match(r" (new|delete)(\[\])?", rest)
    if m:
        return at + m.end()
    if rest.startswith(" "):
        # Conversion operator: the target type runs to the top-level "(" of its parameters.
        depth = 0
        for k in range(at + 1, len(s)):
            c = s[k]
            if c == "(" and depth == 0:
                return k
            if c in "<[{(":
                depth += 1
            elif c in ">]})":
                depth -= 1
        return len(s)
    return at
