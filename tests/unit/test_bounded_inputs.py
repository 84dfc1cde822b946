"""Small inputs beside the dumps read in memory bounded by what they hold, not by their size:
a suppressions file of blank lines, an ``rss.csv`` with a damaged row."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from heapscope.analysis.suppress import read_file
from heapscope.errors import InputError
from heapscope.render.timeline import read_rss


def test_suppressions_full_of_blank_lines(tmp_path: Path) -> None:
    """8 MiB of blank lines around two rules: both read, with their true line numbers, in
    less memory than a list of the blank lines alone would take (64 MiB)."""
    path = tmp_path / "supp.txt"
    blank = b"\n" * (8 << 20)
    path.write_bytes(b"leak:first_fn\n" + blank + b"leak:second_fn\n" + b"oops\n")
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as bad:
            read_file(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"line {(8 << 20) + 3}: expected 'leak:PATTERN', got 'oops'" in str(bad.value)
    assert peak < 40 << 20, f"peak {peak >> 20} MiB"
    path.write_bytes(b"leak:first_fn\n" + blank + b"leak:second_fn # why\n")
    rules = read_file(str(path))
    assert [r.pattern for r in rules] == ["first_fn", "second_fn"]
    assert rules[1].origin == f"{path}:{(8 << 20) + 2}"


def test_rss_csv_with_a_field_past_the_csv_limit(tmp_path: Path) -> None:
    """A row with a 200 KB field (csv refuses fields over 128 KiB): the rows before it are
    kept, and nothing is raised."""
    path = tmp_path / "rss.csv"
    path.write_text("t_seconds,pid,rss_bytes\n0.5,7,4096\n1.0,7,8192\n"
                    + "2.0,7," + "9" * 200_000 + "\n3.0,7,1\n")
    assert read_rss(str(path)) == {7: [(0.5, 4096.0), (1.0, 8192.0)]}
