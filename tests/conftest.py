"""Shared test options: ``--update-golden`` rewrites golden files instead of comparing."""

from __future__ import annotations

from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "data" / "golden"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite golden files from the current output")


@pytest.fixture
def golden(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Compare text with tests/data/golden/NAME, or rewrite it under --update-golden."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if update or not path.exists():
            path.write_text(text)
            if not update:
                pytest.fail(f"golden file {name} was missing and has been written; re-run")
        assert text == path.read_text(), f"output differs from golden file {name}"

    return check
