"""Capture: find a profiling jemalloc, configure it, launch programs, keep sessions."""
