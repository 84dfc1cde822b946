"""``import heapscope.jemalloc``: a Python program controls its own jemalloc's profiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = r"""
import json, sys
import heapscope.jemalloc as je
out = {"version": je.version(), "enabled": je.enabled(), "active_before": je.active()}
outside = [bytearray(8192) for _ in range(500)]      # not sampled: profiling inactive
inside = []
with je.profiling():
    for _ in range(3000):
        inside.append(bytearray(4096))               # sampled
je.dump(sys.argv[1])
out["active_after"] = je.active()
out["stats"] = je.stats()
out["period"] = je.sample_period()
je.reset(1 << 16)
out["period_after_reset"] = je.sample_period()
print(json.dumps(out))
"""


def _run(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_profile_a_block_and_dump(libjemalloc: Path, tmp_path: Path) -> None:
    env = dict(os.environ, LD_PRELOAD=str(libjemalloc),
               MALLOC_CONF=f"prof:true,prof_active:false,lg_prof_sample:12,"
                           f"prof_prefix:{tmp_path}/jeprof")
    dump = tmp_path / "block.heap"
    p = _run(SCRIPT, env, str(dump))
    assert p.returncode == 0, p.stderr
    out: dict[str, Any] = json.loads(p.stdout)
    assert out["version"].startswith("5.") and out["enabled"] is True
    assert out["active_before"] is False and out["active_after"] is False
    assert out["period"] == 4096 and out["period_after_reset"] == 65536
    assert out["stats"]["allocated"] > 3000 * 4096
    assert out["stats"]["resident"] >= out["stats"]["active"] > 0
    top = subprocess.run([sys.executable, "-m", "heapscope.cli.main", "top", "--format", "json",
                          str(dump)], capture_output=True, text=True, check=True,
                         env=dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c")))
    total = json.loads(top.stdout)["total"]
    # What the block allocated (3000 x ~4 KiB), not what was allocated while inactive.
    assert 0.8 * 3000 * 4096 < total < 1.5 * 3000 * 4128


def test_clear_errors_without_profiling(libjemalloc: Path, tmp_path: Path) -> None:
    code = ("import heapscope.jemalloc as je\n"
            "try:\n    je.dump('/tmp/never.heap')\n"
            "except je.JemallocError as e:\n    print(e)\n")
    bare = _run(code, dict(os.environ, LD_PRELOAD="", MALLOC_CONF=""))
    assert bare.returncode == 0 and "no jemalloc in this process" in bare.stdout
    noprof = _run(code, dict(os.environ, LD_PRELOAD=str(libjemalloc), MALLOC_CONF=""))
    assert "started without prof:true" in noprof.stdout
    assert not Path("/tmp/never.heap").exists()
