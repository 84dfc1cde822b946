"""The compiled per-stack loops (``heapscope._native``), or None when they were not built.

Reading a 20 MB dump and reducing it to a table means several passes over 65,000 stacks of
about 20 frames; in C each pass takes milliseconds instead of a few hundred. Every caller
keeps its Python loop as the reference and the fallback: the extension is optional at
install time (it needs a C compiler and Python's headers), and ``HEAPSCOPE_PURE_PYTHON=1``
turns it off, which the tests use to compare the two on the same inputs.
"""

from __future__ import annotations

import os

__all__ = ["core", "describe"]

# Typed by _native.pyi; None when not built (no compiler or headers at install) or turned off.
try:
    from heapscope import _native as core
except ImportError:
    core = None  # type: ignore[assignment]
if os.environ.get("HEAPSCOPE_PURE_PYTHON"):
    core = None  # type: ignore[assignment]


def describe() -> str:
    """Whether the compiled loops are in use, and if not, why and how to get them."""
    if core is not None:
        return f"compiled ({core.__file__})"
    if os.environ.get("HEAPSCOPE_PURE_PYTHON"):
        return "pure Python (HEAPSCOPE_PURE_PYTHON is set)"
    return "pure Python: heapscope._native was not built (install gcc and python3-dev, then " \
           "reinstall heapscope); dumps load several times slower"
