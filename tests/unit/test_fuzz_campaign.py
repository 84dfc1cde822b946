"""A bounded slice of the fuzz campaign (tests/fuzz/campaign.py) runs with the tests.

The full campaign (2,000,000 inputs, run outside CI) is recorded in the closing notes; this
slice feeds every reader 2,000 mutated inputs from a fixed seed, so a reader that starts to
crash or hang on a kind of input the campaign covers fails the suite.
"""

from __future__ import annotations

from tests.fuzz.campaign import run_worker
from tests.fuzz.targets import TARGETS


def test_every_reader_survives_a_slice_of_the_campaign() -> None:
    result = run_worker((20261123, 2000 * len(TARGETS), 5.0))
    assert set(result.inputs) == {t.name for t in TARGETS}
    assert all(n == 2000 for n in result.inputs.values()), result.inputs
    assert result.crashes == {}, "\n\n".join(text for text, _ in result.crashes.values())
    assert result.hangs == {}, sorted(result.hangs)


def test_campaign_finding_corrupt_gzip_in_the_pprof_reader() -> None:
    """Found by the 7,000,000-input run: a gzip header with an unknown method made the
    profile.proto reader raise zlib.error; it is a ValueError like every other bad input."""
    import gzip

    import pytest

    from heapscope.formats.pprof import decode_profile

    for bad in (b"\x1f\x8b\x09\x00" + b"\x00" * 20, gzip.compress(b"\x08\x01" * 50)[:-9]):
        with pytest.raises(ValueError):
            decode_profile(bad)
