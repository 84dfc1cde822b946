"""Which dumps a folder stands for: jemalloc's numeric order, and the latest per process."""

from __future__ import annotations

from pathlib import Path

import pytest

from heapscope.errors import InputError
from heapscope.prepare import expand_inputs

NAMES = ["jeprof.7.0.m10.heap", "jeprof.7.0.m9.heap", "jeprof.7.1.f.heap",
         "jeprof.5.0.i2.heap", "jeprof.5.0.i11.heap.gz"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for name in NAMES:
        (tmp_path / name).write_text("heap_v2/1\n")
    return tmp_path


def test_numeric_order_per_process(folder: Path) -> None:
    got = [Path(p).name for p in expand_inputs([str(folder)])]
    assert got == ["jeprof.5.0.i2.heap", "jeprof.5.0.i11.heap.gz", "jeprof.7.0.m9.heap",
                   "jeprof.7.0.m10.heap", "jeprof.7.1.f.heap"]


def test_latest_dump_of_each_process(folder: Path) -> None:
    got = [Path(p).name for p in expand_inputs([str(folder)], latest=True)]
    assert got == ["jeprof.5.0.i11.heap.gz", "jeprof.7.1.f.heap"]


def test_files_are_taken_as_given(folder: Path) -> None:
    files = [str(folder / n) for n in NAMES[:2]]
    assert expand_inputs(files, latest=True) == files


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"no \.heap dumps"):
        expand_inputs([str(tmp_path)])
