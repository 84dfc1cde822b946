"""Readers for heap dump formats."""

from __future__ import annotations

from heapscope.formats.load import DumpName, load, parse_dump_name

__all__ = ["DumpName", "load", "parse_dump_name"]
