"""The agent's TOML settings: what a file may say, and flags winning over it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from heapscope.agent.config import load, merge
from heapscope.errors import HeapscopeError, InputError


def test_file_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "a.toml"
    f.write_text('every = 30\nwindow = 40\nmax_disk = "2G"\npyroscope = "http://p:4040"\n'
                 '[[target]]\nmatch = "postgres: "\n[[target]]\nunit = "slapd"\n'
                 '[[target]]\npid = 7\n[[target]]\npidfile = "/run/x.pid"\n')
    s = merge(load(str(f)), {"every": 5.0, "pids": [9], "window": None})
    assert (s.every, s.window, s.max_disk, s.pyroscope) == (5.0, 40, 2 << 30, "http://p:4040")
    assert (s.pids, s.matches, s.units) == ([7, 9], ["postgres: "], ["slapd"])
    assert s.pidfiles == ["/run/x.pid"]
    assert s.problems() == []


@pytest.mark.parametrize(("text", "why"), [
    ("every = [", "not valid TOML"),
    ("evry = 3", "unknown setting 'evry'"),
    ('window = "ten"', "wrong type"),
    ("[[target]]\npid = 1\nunit = \"x\"", "names one of"),
    ("[[target]]\nname = \"x\"", "want pid = N"),
    ("max_disk = \"lots\"", "not a size"),
])
def test_bad_files_are_one_line_errors(tmp_path: Path, text: str, why: str) -> None:
    f = tmp_path / "a.toml"
    f.write_text(text)
    with pytest.raises(HeapscopeError, match=re.escape(why)) as e:
        load(str(f))
    assert "\n" not in str(e.value)


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"a\.toml"):
        load(str(tmp_path / "a.toml"))


def test_problems() -> None:
    assert "nothing to watch" in merge({}, {}).problems()[0]
    assert "match '('" in merge({"matches": ["("]}, {}).problems()[0]
    assert "http://" in merge({"pids": [1], "pyroscope": "p:4040"}, {}).problems()[0]


@pytest.mark.parametrize(("text", "why"), [
    ("every = inf", "finite"),
    ("every = nan", "finite"),
    ("timeout = inf", "finite"),
    ("every = 1e12", "at most 86400 s"),
    ("timeout = 0", "timeout must be positive"),
])
def test_times_that_would_stop_the_agent_are_refused(tmp_path: Path, text: str,
                                                     why: str) -> None:
    """TOML allows inf and nan: such an `every` passed validation and killed the agent with
    OverflowError on its next sleep (a config read again on SIGHUP goes the same way)."""
    f = tmp_path / "agent.toml"
    f.write_text(f"{text}\n[[target]]\npid = 1\n")
    problems = merge(load(str(f)), {}).problems()
    assert any(why in p for p in problems), problems


def test_a_listen_address_beyond_this_machine_is_flagged() -> None:
    from heapscope.netaddr import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.1.2.3") and not is_loopback("")
    assert not is_loopback("example.org")
