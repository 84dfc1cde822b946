"""The shipped deployment files are valid for the tools that read them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parent.parent.parent / "deploy"


def test_agent_unit_passes_systemd_analyze(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed: apt-get install systemd")
    heapscope = Path(sys.executable).parent / "heapscope"
    text = (DEPLOY / "systemd" / "heapscope-agent.service").read_text()
    assert "/usr/local/bin/heapscope agent --config" in text
    unit = tmp_path / "heapscope-agent.service"
    unit.write_text(text.replace("/usr/local/bin/heapscope", str(heapscope)))
    p = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                       timeout=60, check=False)
    assert p.returncode == 0 and not p.stderr.strip(), p.stderr
