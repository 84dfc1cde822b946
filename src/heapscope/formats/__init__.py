"""Readers for heap dump formats (:mod:`heapscope.formats.load` opens any of them)."""
