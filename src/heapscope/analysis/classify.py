"""Whose code a frame is: the program's own, a language's standard library, or a dependency.

Every frame of a pruned stack gets one class:

- ``library``: a language's runtime and standard library: C++ ``std::``/``__gnu_cxx::``
  names and code inlined from the toolchain's headers (``/usr/include/c++/…``); Rust's
  ``alloc``/``core``/``std``/``hashbrown`` crates (by name, by ``<T as Trait>`` impl, or by
  a source file in the Rust library sources); glibc, the dynamic loader, libstdc++, libgcc;
  an interpreter or virtual machine running the program (python, java, node…) with the
  libraries it ships, and JIT code.
- ``dependency``: third-party code: a shared library from a system library folder
  (libz, libxml2, libssl, libsqlite3…), a Python package's extension module in
  site-packages, Rust crates built from a cargo registry, headers of other libraries.
- ``own``: everything else: the program and the libraries installed with it (a PostgreSQL
  extension under the server's own folder, a plugin next to the binary, a library built in
  the project tree, anything in a folder the program's own RUNPATH names, such as
  389-ds's ``/usr/lib/x86_64-linux-gnu/dirsrv``).

The class is decided from the frame's name, its source file and its module, in that order,
and never from a list of programs. ``--own RE`` makes any module or source file the user's
own code (for someone debugging a library itself).

An allocation *wrapper* (``xmalloc``, ``g_malloc``, Redis's ``zmalloc``, CPython's
``PyMem_RawMalloc``…) is a function whose only job is to call the allocator; its frames are
folded like the allocator's (:mod:`heapscope.analysis.fold`). Well-known wrappers are named
here; others are recognised from the profile itself, helped by a *constructor* name
(``createObject``, ``strbuf_new``: :func:`is_constructor_name`).
"""

from __future__ import annotations

import os
import re
from functools import lru_cache

from heapscope.model import Frame, Location

OWN = "own"
LIBRARY = "library"
DEPENDENCY = "dependency"
CLASSES = (OWN, DEPENDENCY, LIBRARY)

# C++ runtime and standard library namespaces, and the ABI's helpers.
_CXX_LIBRARY = re.compile(
    r"^(?:std|__gnu_cxx|__cxxabiv1|__gnu_debug|__pstl|__cxx11)::|^__cxa_|^__dynamic_cast$"
)
# Rust's standard crates. hashbrown is std's HashMap; the others appear only inside std.
_RUST_CRATES = frozenset(
    "alloc core std hashbrown std_detect compiler_builtins panic_unwind panic_abort unwind "
    "rustc_demangle".split()
)
_RUST_PATH = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)::")
# Sources of a toolchain's headers and language libraries.
_LIBRARY_FILE = re.compile(
    r"(?:^|/)include/c\+\+/"          # libstdc++ and libc++ headers
    r"|/usr/lib/gcc/|/usr/lib/llvm-[^/]+/lib/clang/"
    r"|^bits/|^ext/"                  # libstdc++ headers named relative to their folder
    r"|^/rustc/[0-9a-f]+/library/|/rustc-[^/]*/library/|/lib/rustlib/src/rust/library/"
    r"|^library/(?:alloc|core|std)/src/"
    # the C library's headers: /usr/include/stdlib.h, <triplet>/bits/…, bits/…, sys/…
    r"|^/usr/include/(?:[\w-]+-linux-gnu\w*/|bits/|sys/|[\w.-]+\.h$)"
)
# Third-party sources compiled into the program: cargo's registry and git checkouts
# (Debian's librust-*-dev crates too), other libraries' headers.
_DEPENDENCY_FILE = re.compile(
    r"/\.cargo/registry/src/|/cargo/registry/src/|/\.cargo/git/checkouts/"
    r"|^/usr/share/cargo/registry/|^/usr/(?:local/)?include/[\w.+-]+/"
)
# Modules that are the C/C++ runtime on every Linux system.
_RUNTIME_LIB = re.compile(
    r"^(?:lib(?:c|m|dl|rt|pthread|resolv|util|anl|nsl|crypt|mvec|BrokenLocale|thread_db"
    r"|c_malloc_debug|memusage|SegFault|stdc\+\+|c\+\+|c\+\+abi|gcc_s|atomic|unwind|asan"
    r"|ubsan|lsan|tsan)(?:[-.].*)?\.so(?:\.[\d.]+)?|ld-linux[-\w.]*\.so(?:\.\d+)*"
    r"|ld-[\d.]+\.so|linux-vdso\.so\.1|linux-gate\.so\.1)$"
)
# Programs that run other code (an interpreter or virtual machine), and their libraries:
# for these the user's code is the script, so their own C code is a runtime, not "own".
_RUNTIME_EXE = re.compile(
    r"^(?:python[\d.]*[dmu]*|pypy[\d.]*|java|node(?:js)?|ruby[\d.]*|perl[\d.]*"
    r"|php[\d.]*(?:-fpm[\d.]*|-cgi)?|lua(?:jit)?[\d.]*|beam\.smp|dotnet|mono(?:-sgen)?"
    r"|R|Rscript|guile[\d.]*|tclsh[\d.]*|wish[\d.]*)$"
)
_RUNTIME_LIB_OF_VM = re.compile(
    r"^lib(?:python\d[\d.]*[dmu]*|jvm|ruby[\d.-]*|perl|node|lua(?:jit)?[\d.-]*|R|mono[\w.-]*"
    r"|coreclr|php[\d.]*)\.so(?:\.[\d.]+)?$"
)
_RUNTIME_DIR = re.compile(r"/lib(?:64)?/jvm/|/lib/python\d[\d.]*/lib-dynload/|/lib/R/")
# Folders a system's package manager installs shared libraries into.
_SYSTEM_DIR = re.compile(
    r"^/(?:usr/(?:local/)?)?lib(?:32|64|x32)?/|^/opt/homebrew/|^/nix/store/|^/gnu/store/"
)
_PACKAGES_DIR = re.compile(r"/(?:site|dist)-packages/")
# Folders too general to say that two files came from one package.
_GENERIC_DIR = re.compile(
    r"^/(?:usr(?:/local)?(?:/(?:lib(?:32|64|x32)?(?:/[\w-]+-linux-gnu\w*)?|bin|sbin|libexec"
    r"|share))?|lib(?:32|64)?(?:/[\w-]+-linux-gnu\w*)?|bin|sbin|opt|home|tmp|var|srv|root"
    r"|snap|nix/store|gnu/store)?/?$"
)
# Well-known allocation wrappers: functions whose only job is to call malloc (or a memory
# pool's allocator) for their caller. Names of this shape are wrappers in whichever library
# defines them; the list is of library conventions, not of programs under test.
_WRAPPER_NAMES = re.compile(
    r"""^(?:
        x(?:m|c|re|z|nm|2n|2|n)alloc\w* | xstrn?dup | xmemdup\w* | xzalloc | xalloc\w*
      | g_(?:try_)?(?:malloc|malloc0|realloc|malloc_n|malloc0_n|realloc_n)
      | g_(?:strn?dup|memdup2?|slice_alloc0?|new\d*)
      | av_(?:malloc|mallocz|realloc|calloc|strdup|fast_realloc|fast_malloc|realloc_f
             |malloc_array|mallocz_array|realloc_array)
      | sqlite3(?:Malloc|MallocZero|Realloc|DbMallocRaw|DbMallocRawNN|DbMallocZero|DbRealloc
                 |DbReallocOrFree|MemMalloc|MemRealloc|_malloc|_malloc64|_realloc
                 |_realloc64)
      | dbMallocRawFinish | mallocWithAlarm
      | z(?:try)?(?:malloc|calloc|realloc)(?:_usable)?(?:_internal)?
      | zmalloc_no_tcache | zcalloc_num | zstrdup | extend_to_usable
      | _?PyMem_(?:Raw)?(?:Malloc|Calloc|Realloc) | _PyMem_Debug\w+
      | _?PyObject_(?:Malloc|Calloc|Realloc) | pymalloc_(?:alloc|realloc)
      | _PyObject_(?:GC_)?New(?:Var)? | gc_alloc | _PyObject_GC_Malloc
      | PyType_GenericAlloc | _PyType_AllocNoTrack
      | CRYPTO_(?:malloc|zalloc|realloc|clear_realloc|strn?dup|memdup|secure_malloc
                 |secure_zalloc)
      | ngx_(?:alloc|calloc|palloc|pnalloc|pcalloc|palloc_small|palloc_large|palloc_block)
      | apr_p(?:c)?alloc | ruby_x(?:m|c|re)alloc2? | objspace_x(?:m|c|re)alloc\w*
      | Perl_safesys(?:m|c|re)alloc | _?emalloc | _?ecalloc | _?erealloc | _?safe_emalloc
      | luaM_(?:malloc_|realloc_|growaux_) | l_alloc
      | mem_(?:alloc|calloc|realloc)_wrapper | tor_(?:malloc|calloc|realloc)_\w*
    )$""",
    re.VERBOSE,
)
_JNI_ENTRY = re.compile(r"^Java_[A-Za-z0-9_]+$")
# Words that name a function returning new memory, when they are the first or the last word
# of its name (its verb or its suffix: make_node, node_new, createObject, list_dup). Not
# "init": init functions often build whole tables, and their caller is not the story.
_CONSTRUCTOR_WORDS = frozenset(
    "alloc allocate malloc calloc realloc zalloc new create dup strdup strndup memdup make "
    "copy clone".split())
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _rust_impl_crates(name: str) -> set[str]:
    """The crates a ``<Type as Trait>::method`` (or ``<Type>::method``) name involves: the
    Type's, when it is a path (not a primitive like ``u8`` or ``[T]``), and the Trait's."""
    depth = 0
    inner = ""
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
            if depth == 0:
                inner = name[1:i]
                break
    self_type, _, trait = inner.partition(" as ")
    crates = set()
    for part in (self_type.lstrip("&*[( "), trait):
        m = _RUST_PATH.match(part.removeprefix("mut ").removeprefix("dyn "))
        if m is not None:
            crates.add(m.group(1))
    return crates


@lru_cache(maxsize=1 << 16)  # a program's addresses share names and files
def name_class(name: str) -> str | None:
    """The class a function's name alone proves (C++ and Rust standard libraries), or None."""
    if not name:
        return None
    if _CXX_LIBRARY.match(name):
        return LIBRARY
    if name.startswith("<"):
        # std's impl (of a std trait, or for a primitive type) unless a crate of the
        # program's is named: <app::Config as core::clone::Clone> is the program's code.
        return LIBRARY if _rust_impl_crates(name) <= _RUST_CRATES else None
    m = _RUST_PATH.match(name)
    if m is not None and m.group(1) in _RUST_CRATES:
        return LIBRARY
    return None


@lru_cache(maxsize=1 << 16)  # a program's addresses share names and files
def file_class(path: str) -> str | None:
    """The class a frame's source file proves (a toolchain header, the Rust library, a
    cargo registry), or None."""
    if not path:
        return None
    if _LIBRARY_FILE.search(path):
        return LIBRARY
    if _DEPENDENCY_FILE.search(path):
        return DEPENDENCY
    return None


@lru_cache(maxsize=1 << 16)  # a program's addresses share names and files
def is_wrapper_name(name: str) -> bool:
    """True for a well-known allocation wrapper's name (xmalloc, g_malloc, zmalloc…)."""
    return _WRAPPER_NAMES.match(name) is not None


@lru_cache(maxsize=1 << 16)  # a program's addresses share names and files
def is_constructor_name(name: str) -> bool:
    """True for a name that says the function makes something new: its first or last word
    (split at ``_``, ``::``, digits and camelCase) is a constructor word (alloc, new,
    create, dup, make, copy, clone…) or ends in ``alloc``/``dup`` (``kmalloc``, ``sdsdup``).
    ``leak_new_sessions`` is not one: ``new`` is neither its first nor its last word."""
    base = name.rsplit("::", 1)[-1].split("(", 1)[0].split("<", 1)[0]
    words = [w.lower() for w in _WORD.findall(base) if not w.isdigit()]
    if not words:
        return False
    return any(w in _CONSTRUCTOR_WORDS or w.endswith(("alloc", "dup"))
               for w in {words[0], words[-1]})


@lru_cache(maxsize=1 << 16)  # a program's addresses share names and files
def is_jni_entry(name: str) -> bool:
    """True for a JNI function (``Java_<class>_<method>``): native code a Java method called."""
    return _JNI_ENTRY.match(name) is not None


def _package_root(path: str) -> str:
    """The deepest folder of ``path`` that is more specific than a system-wide one."""
    parts = os.path.dirname(path).split("/")
    for k in range(2, len(parts) + 1):
        head = "/".join(parts[:k])
        if not _GENERIC_DIR.match(head + "/"):
            return head
    return ""


# Written by hand, not as a dataclass: `heapscope top` must not import dataclasses
# (start-up time).
class Classifier:
    """Classifies modules and frames of one program (``main``: its executable's path)."""

    __slots__ = ("_modules", "main", "own", "private", "private_dirs", "root", "runtime")

    def __init__(self, main: str = "", own: tuple[re.Pattern[str], ...] = (),
                 private: tuple[str, ...] = ()) -> None:
        self.main = main
        self.own = own
        self.private = private  # folders the program's RUNPATH names
        self._modules: dict[str, str] = {}
        base = os.path.basename(self.main)
        self.runtime = bool(base) and _RUNTIME_EXE.match(base) is not None
        self.root = _package_root(self.main) if self.main else ""
        # A RUNPATH entry that is a system-wide folder says nothing about who owns a file.
        self.private_dirs = tuple(d.rstrip("/") + "/" for d in self.private
                                  if not _GENERIC_DIR.match(d.rstrip("/") + "/"))

    def _own_match(self, text: str) -> bool:
        return any(rx.search(text) for rx in self.own)

    def module_class(self, path: str, module: str) -> str:
        """The class of code in a module (``path``: the mapped file, ``module``: its name)."""
        key = path or module
        got = self._modules.get(key)
        if got is None:
            got = self._modules[key] = self._module_class(path, module)
        return got

    def _module_class(self, path: str, module: str) -> str:
        if self.own and (self._own_match(path) or self._own_match(module)):
            return OWN
        if not path or path.startswith("["):
            return LIBRARY  # JIT code and anonymous memory: the runtime's, never a site
        base = os.path.basename(path)
        if path == self.main:
            return LIBRARY if self.runtime else OWN
        if _RUNTIME_LIB.match(base) or _RUNTIME_LIB_OF_VM.match(base):
            return LIBRARY
        if self.root and (path + "/").startswith(self.root + "/"):
            return LIBRARY if self.runtime else OWN  # installed with the program
        if any(path.startswith(d) for d in self.private_dirs):
            return LIBRARY if self.runtime else OWN  # where the program looks for its own
        if _RUNTIME_DIR.search(path):
            return LIBRARY
        if _SYSTEM_DIR.match(path) or _PACKAGES_DIR.search(path):
            return DEPENDENCY
        return OWN

    def frame_class(self, loc: Location, frame: Frame | None) -> str:
        """The class of one frame of a location (``None``: the location has no symbol)."""
        path = loc.mapping.path if loc.mapping is not None else ""
        if frame is not None:
            if self.own and frame.file and self._own_match(frame.file):
                return OWN
            got = name_class(frame.function) or file_class(frame.file)
            if got is not None:
                return got
        return self.module_class(path, loc.module)
