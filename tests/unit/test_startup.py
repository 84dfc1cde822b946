"""Start-up: each subcommand loads only what it uses (checked by module, not by clock)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DUMPS = Path(__file__).resolve().parent.parent / "data" / "dumps"

_PROBE = """
import contextlib, io, sys
from heapscope.cli.main import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
    main(sys.argv[1:])
sys.stderr.write("\\n".join(sys.modules))
"""


def _imported(*argv: str) -> set[str]:
    """The modules loaded once ``heapscope ARGV`` has run (in a fresh interpreter)."""
    p = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True,
                       text=True, timeout=60, check=False)
    return set(p.stderr.splitlines())


def test_version_loads_no_subcommand() -> None:
    mods = _imported("--version")
    assert not {m for m in mods if m.startswith(("heapscope.cli.", "heapscope.analysis"))
                and m not in ("heapscope.cli.main", "heapscope.cli.commands")}
    assert "numpy" not in mods


@pytest.mark.parametrize(("command", "absent"), [
    ("top", ("heapscope.capture.gdbctl", "prometheus_client", "heapscope.render.flamegraph",
             "heapscope.cli.attach", "heapscope.cli.agent")),
    ("env", ("numpy", "heapscope.analysis.leaks", "heapscope.capture.gdbctl")),
    ("agent", ("prometheus_client", "heapscope.render.flamegraph")),  # until it runs
])
def test_a_subcommand_loads_only_its_own(command: str, absent: tuple[str, ...]) -> None:
    mods = _imported(command, "--help")
    assert f"heapscope.cli.{command}" in mods
    assert not [m for m in absent if m in mods]


def test_top_of_a_plain_dump_loads_no_session_code(tmp_path: Path) -> None:
    dump = tmp_path / "jeprof.1.0.f.heap"
    shutil.copy(DUMPS / "dialects.heap", dump)
    mods = _imported("top", "--no-cache", str(dump))
    assert "heapscope.cli.top" in mods and "heapscope.symbols.resolve" in mods  # it ran
    assert not [m for m in ("heapscope.capture.session", "heapscope.capture.access")
                if m in mods]


@pytest.mark.parametrize("argv", [("run", "--help"), ("shell", "--help"),
                                  ("attach", "1", "watch", "--help")])
def test_the_viewer_is_loaded_only_when_asked_for(argv: tuple[str, ...]) -> None:
    """run --serve, attach watch --serve and the shell's web bring in the server; a command
    that does not ask for it starts without starlette and uvicorn."""
    mods = _imported(*argv)
    assert f"heapscope.cli.{argv[0]}" in mods  # the command's own module was loaded
    assert not [m for m in mods if m.split(".")[0] in ("starlette", "uvicorn")]
    assert "heapscope.serve.server" not in mods
