"""Fuzz the reader: any input either loads or raises InputError, never anything else."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heapscope.errors import InputError
from heapscope.formats.jemalloc import ParseCache
from heapscope.formats.load import load

DATA = Path(__file__).parent.parent / "data" / "dumps"
SEED = (DATA / "dialects.heap").read_bytes()
LEGACY = (DATA / "legacy_v2.heap").read_bytes()


def _check(content: bytes) -> None:
    with tempfile.NamedTemporaryFile(suffix=".heap") as f:
        f.write(content)
        f.flush()
        for kwargs in ({"threads": True}, {"cache": ParseCache()}):  # line and bulk parsers
            try:
                load(f.name, **kwargs)  # type: ignore[arg-type]
            except InputError as e:
                assert "\n" not in str(e)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes(content: bytes) -> None:
    _check(content)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from([SEED, LEGACY]),
    st.integers(min_value=0, max_value=len(SEED)),
    st.integers(min_value=0, max_value=60),
    st.binary(max_size=24),
)
def test_mutated_dumps(seed: bytes, cut: int, drop: int, insert: bytes) -> None:
    cut = min(cut, len(seed))
    _check(seed[:cut] + insert + seed[cut + drop :])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(SEED.splitlines(keepends=True)), max_size=30))
def test_shuffled_lines(lines: list[bytes]) -> None:
    _check(b"heap_v2/4096\n" + b"".join(lines))
