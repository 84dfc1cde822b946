"""Symbolization: turn raw addresses in a Profile into modules, functions, files and lines.

Public entry point: :func:`symbolize` (implemented in :mod:`heapscope.symbols.resolve`).
"""

from __future__ import annotations

from heapscope.symbols.options import Diagnostic, Symbolized, SymbolOptions
from heapscope.symbols.resolve import symbolize

__all__ = ["Diagnostic", "SymbolOptions", "Symbolized", "symbolize"]
