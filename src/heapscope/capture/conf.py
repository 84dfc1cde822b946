"""MALLOC_CONF for heap profiling: presets, sizes, and the variable a jemalloc reads."""

from __future__ import annotations

import math

from heapscope.errors import UsageError

DEFAULT_SAMPLE = 1 << 19  # jemalloc's default and the seeds' choice: one sample per 512 KiB

def lg2(nbytes: int) -> int:
    """The power of two nearest to ``nbytes`` (jemalloc takes sizes as log2)."""
    return max(0, round(math.log2(nbytes)))


def env_var(prefix: str) -> str:
    """The environment variable a jemalloc built with ``prefix`` reads its options from."""
    return f"{prefix.upper()}MALLOC_CONF" if prefix else "MALLOC_CONF"


def build_conf(
    prefix_path: str,
    *,
    sample: int | None = None,
    interval: int | None = None,
    gdump: bool = False,
    accum: bool = False,
    final: bool = True,
    leak: bool = True,
    thread_names: bool = True,
    extra: str = "",
) -> str:
    """A MALLOC_CONF value that turns on heap profiling with dumps under ``prefix_path``.

    Never sets ``prof_leak_error``: it calls ``_exit`` and loses the program's buffered output;
    heapscope decides about leaks itself (``--fail-on-leak``).
    """
    parts = ["prof:true"]
    if final:
        parts.append("prof_final:true")
    if leak and final:
        parts.append("prof_leak:true")
    parts.append(f"lg_prof_sample:{lg2(sample or DEFAULT_SAMPLE)}")
    if interval:
        parts.append(f"lg_prof_interval:{lg2(interval)}")
    if gdump:
        parts.append("prof_gdump:true")
    if accum:
        parts.append("prof_accum:true")
    if thread_names:
        parts.append("prof_sys_thread_name:true")
    parts.append(f"prof_prefix:{prefix_path}")
    if extra:
        if "prof_leak_error" in extra:
            raise UsageError("prof_leak_error is not supported: it exits with _exit and loses "
                             "the program's output; use --fail-on-leak")
        parts.append(extra.strip(","))
    return ",".join(parts)
