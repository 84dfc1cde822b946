"""JIT frames: a real JVM under jemalloc, its perf map, and HotSpot's malloc wrappers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e

PROGRAM = Path(__file__).parent / "programs" / "Leak.java"


@pytest.fixture(scope="session")
def jvm_dump(tmp_path_factory: pytest.TempPathFactory, libjemalloc: Path) -> tuple[Path, Path]:
    """Run Leak.java under jemalloc; return (dump, perf map copied next to it)."""
    java, javac = shutil.which("java"), shutil.which("javac")
    if not java or not javac:
        pytest.skip("no JDK: apt-get install default-jdk-headless")
    work = tmp_path_factory.mktemp("jvm")
    shutil.copy(PROGRAM, work / "Leak.java")
    subprocess.run([javac, "Leak.java"], cwd=work, check=True, timeout=120)
    env = dict(os.environ, LD_PRELOAD=str(libjemalloc),
               MALLOC_CONF=f"prof:true,prof_final:true,lg_prof_sample:16,prof_prefix:{work}/jeprof")
    env.pop("JAVA_TOOL_OPTIONS", None)
    proc = subprocess.run([java, "-XX:+UnlockDiagnosticVMOptions", "-XX:+DumpPerfMapAtExit",
                           "-Xmx256m", "Leak"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    for dump in sorted(work.glob("jeprof.*.f.heap"), key=lambda p: -p.stat().st_size):
        pid = dump.name.split(".")[1]
        perf = Path(f"/tmp/perf-{pid}.map")
        if perf.exists():
            local = work / perf.name
            shutil.move(str(perf), local)  # ours, made by this run: keep /tmp clean
            return dump, local
    pytest.fail("the JVM wrote no perf map next to its dump")


def test_jit_frame_named_from_perf_map(jvm_dump: tuple[Path, Path], tmp_path: Path) -> None:
    dump, _perf = jvm_dump
    out = subprocess.run([sys.executable, "-m", "heapscope.cli.main", "top", "--format",
                          "json", "-n", "0", str(dump)], capture_output=True, text=True,
                         env=dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path)), check=True)
    rows: list[dict[str, Any]] = json.loads(out.stdout)["rows"]
    jit = [r for r in rows if r["module"] == "[jit]"]
    assert any("Unsafe.allocateMemory0" in r["name"] for r in jit), [r["name"] for r in jit]
    flat = [r["name"] for r in rows if r["flat"] > 0]
    assert "os::malloc" not in flat and "AllocateHeap" not in flat
    top = max(rows, key=lambda r: r["flat"])
    assert top["name"] == "Unsafe_AllocateMemory0"
    assert je.find_libjemalloc() is not None
