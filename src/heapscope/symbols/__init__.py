"""Symbolization: turn raw addresses in a Profile into modules, functions, files and lines.

Public entry point: :func:`symbolize` (implemented in :mod:`heapscope.symbols.resolve`, which
is imported on first use: :mod:`heapscope.symbols.ahead` runs before the rest is loaded).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from heapscope.symbols.options import Diagnostic, Symbolized, SymbolOptions

if TYPE_CHECKING:
    from heapscope.symbols.resolve import symbolize

__all__ = ["Diagnostic", "SymbolOptions", "Symbolized", "symbolize"]


def __getattr__(name: str) -> Any:
    if name == "symbolize":
        from heapscope.symbols.resolve import symbolize

        return symbolize
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
