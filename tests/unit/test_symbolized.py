"""The self-contained profile format: a symbolized dump that needs no binaries to read."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from heapscope.errors import InputError
from heapscope.formats import symbolized
from heapscope.formats.load import load
from tests.unit.builders import Builder


def test_round_trip_keeps_everything(tmp_path: Path) -> None:
    b = Builder()
    p = b.profile(b.sample("helper@util.h:5;via_inline@leaky.c:50", "main@leaky.c:9",
                           values=(3, 300, 4, 400)),
                  b.sample("?anon", "main@leaky.c:9"), pid=42, seq=3, kind="m", time=123.5)
    path = tmp_path / "jeprof.42.3.m7.heap.json.gz"
    symbolized.write(p, str(path))
    q = load(str(path))
    assert q.samples == p.samples
    assert dict(q.locations) == dict(p.locations)
    assert q.mappings == p.mappings
    assert (q.pid, q.seq, q.kind, q.time, q.period, q.sampling) == (42, 3, "m", 123.5, 1, "none")
    assert not list(tmp_path.glob("*.tmp"))


@pytest.mark.parametrize(("content", "problem"), [
    (b'{"format": "something-else"}', "not a heapscope profile"),
    (b'{"format": "heapscope-profile", "version": 99}', "version 99"),
    (b'{"format": "heapscope-profile", "version": 1, "meta": {}}', "damaged"),
    (b'{"format": "heapscope-profile", "version": 1, "meta"', "invalid JSON"),
])
def test_damaged_files_are_one_line_errors(tmp_path: Path, content: bytes, problem: str) -> None:
    path = tmp_path / "x.heap.json.gz"
    path.write_bytes(gzip.compress(content))
    with pytest.raises(InputError, match=problem) as e:
        load(str(path))
    assert "\n" not in str(e.value)
