"""heapscope: find memory leaks in native processes with jemalloc's heap profiler."""

from __future__ import annotations

__version__ = "0.1.0"
