"""``heapscope run``: launching real programs, the session folder, and every bad case."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e

PY = sys.executable


def hs(*args: str, cache: Path, stdin: str | None = None, cwd: Path | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope(*args, cache=cache, stdin=stdin, cwd=cwd, timeout=timeout)


def report(session: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((session / "report.json").read_text())
    return data


def test_c_program_session(leaky_c_build: Any, libjemalloc: Path, tmp_path: Path) -> None:
    s = tmp_path / "s"
    p = hs("run", "-o", str(s), "--sample", "1", "--", str(leaky_c_build.binary),
           cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    r = report(s)
    first = r["suspects"][0]
    # One dump, at exit: what is live is listed biggest first; it cannot say what grows.
    assert first["function"] == "leak_big" and first["verdict"] == "live"
    assert first["bytes"] == pytest.approx(8 * 1048576, rel=1e-6)
    assert first["file"].endswith("leaky.c")
    assert first["line"] == je.source_line(je.PROGRAMS_DIR / "leaky.c", "big")
    assert first["stack"][1].startswith("main ")
    names = [x["function"] for x in r["suspects"] if x["verdict"] == "live"]
    assert {"leak_small", "worker_alloc", "copy_names", "inline_alloc"} <= set(names)
    assert any(n.startswith("libhelper.so+0x") for n in names)
    expected = [x for x in r["suspects"] if x["verdict"] == "expected"]
    assert expected and all(x["bytes"] < 100_000 for x in expected)
    (proc,) = r["processes"]
    assert proc["role"] == "main" and proc["verdict"] == "unjudged"
    assert proc["pid"] == first["pid"] and not proc["leaks"]
    assert proc["left_bytes"] >= 8 * 1048576
    manifest = json.loads((s / "manifest.json").read_text())
    assert manifest["exit_status"] == 0
    assert "prof:true" in manifest["malloc_conf"] and "lg_prof_sample:0" in manifest["malloc_conf"]
    # The library preloaded is the one the tests found, and its version is the one the
    # library itself carries (its version string, read from the file here).
    assert manifest["jemalloc"]["path"] == str(libjemalloc), manifest["jemalloc"]
    assert manifest["jemalloc"]["preloaded"] is True
    version = manifest["jemalloc"]["version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+-\d+-g[0-9a-f]+", version), version
    assert version.encode() in libjemalloc.read_bytes()
    assert str(leaky_c_build.binary) in manifest["modules"]
    assert list((s / "symbolized").glob("*.json.gz"))
    assert "Leak approximation summary" in (s / "leak-summaries.txt").read_text()
    assert (s / "rss.csv").read_text().count("\n") >= 2
    # The printed report names the leak and says what to run next.
    assert "leak_big" in p.stderr and "heapscope top --lines" in p.stderr


def test_session_opens_without_binaries(leaky_c_build: Any, tmp_path: Path) -> None:
    s = tmp_path / "s"
    hs("run", "-o", str(s), "--sample", "1", "--", str(leaky_c_build.binary),
       cache=tmp_path / "c")
    for dump in (s / "dumps").glob("*.heap"):
        text = dump.read_text()
        dump.write_text(text.replace(str(leaky_c_build.binary), "/gone/leaky"))
    top = hs("top", "--format", "json", "-n", "3", str(s), cache=tmp_path / "c2")
    assert top.returncode == 0, top.stderr
    assert json.loads(top.stdout)["rows"][0]["name"] == "leak_big"


def test_stdio_passthrough_and_wrapper(libjemalloc: Path, tmp_path: Path) -> None:
    s = tmp_path / "s"
    script = "read x; echo got:$x; echo to-stderr >&2; " + PY + " -c 'print(42)'"
    p = hs("run", "-o", str(s), "--", "sh", "-c", script, cache=tmp_path / "c", stdin="hi\n")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[:2] == ["got:hi", "42"]
    assert "to-stderr" in p.stderr
    r = report(s)
    roles = {x["role"] for x in r["processes"]}
    assert "wrapper" in roles and "child" in roles


def test_exit_status_and_fail_on_leak(leaky_c_build: Any, libjemalloc: Path,
                                      tmp_path: Path) -> None:
    p = hs("run", "-o", str(tmp_path / "a"), "--", PY, "-c", "import sys; sys.exit(3)",
           cache=tmp_path / "c")
    assert p.returncode == 3
    # Only an exit dump: nothing to judge a leak on, so --fail-on-leak fails closed (11)...
    leak = hs("run", "-o", str(tmp_path / "b"), "--fail-on-leak", "--",
              str(leaky_c_build.binary), cache=tmp_path / "c")
    assert leak.returncode == 11 and "needs a series" in leak.stderr, leak.stderr
    # ... and --fail-on-live acts on what was left live at exit (the 8 MiB leak_big and more).
    live = hs("run", "-o", str(tmp_path / "e"), "--fail-on-live", "1M", "--",
              str(leaky_c_build.binary), cache=tmp_path / "c")
    assert live.returncode == 10 and "still live" in live.stderr, live.stderr
    ok = hs("run", "-o", str(tmp_path / "d"), "--fail-on-live", "1G", "--",
            str(leaky_c_build.binary), cache=tmp_path / "c")
    assert ok.returncode == 0, ok.stderr


def test_sigterm_is_forwarded_and_final_dump_written(libjemalloc: Path, tmp_path: Path) -> None:
    s = tmp_path / "s"
    code = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
            "keep = [bytearray(100000) for _ in range(50)]\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    env = dict(os.environ, HEAPSCOPE_CACHE_DIR=str(tmp_path / "c"))
    proc = subprocess.Popen([sys.executable, "-m", "heapscope.cli.main", "run", "-o", str(s),
                             "--", PY, "-c", code], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert list((s / "dumps").glob("jeprof.*.f.heap"))


def test_crash_is_explained(libjemalloc: Path, tmp_path: Path) -> None:
    p = hs("run", "-o", str(tmp_path / "s"), "--", PY, "-c",
           "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", cache=tmp_path / "c")
    assert p.returncode == 128 + signal.SIGSEGV
    assert "killed by SIGSEGV" in p.stderr and "--interval" in p.stderr
    assert (tmp_path / "s" / "manifest.json").exists()


def _one_error_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("heapscope: error: ")
    return lines[0]


def test_command_not_found(tmp_path: Path) -> None:
    p = hs("run", "-o", str(tmp_path / "s"), "--", "no-such-command-xyz", cache=tmp_path)
    assert p.returncode == 127
    assert "no-such-command-xyz: command not found" in _one_error_line(p)
    assert not (tmp_path / "s").exists()


def test_no_jemalloc_and_jemalloc_without_profiling(tmp_path: Path, gcc: Path) -> None:
    p = hs("run", "--jemalloc", str(tmp_path / "missing.so"), "--", "true", cache=tmp_path)
    assert p.returncode == 4
    line = _one_error_line(p)
    assert "apt-get install libjemalloc2" in line and "dnf install jemalloc" in line
    fake = tmp_path / "libjemalloc-noprof.so"
    je.build([je.PROGRAMS_DIR / "fake_jemalloc.c"], fake, ("-shared", "-fPIC", "-O1"))
    p = hs("run", "--jemalloc", str(fake), "-o", str(tmp_path / "s"), "--", "true",
           cache=tmp_path)
    assert p.returncode == 4
    assert "without profiling" in _one_error_line(p)
    assert not (tmp_path / "s").exists()


def test_unwritable_or_existing_output(libjemalloc: Path, tmp_path: Path) -> None:
    p = hs("run", "-o", "/proc/heapscope-cannot-write-here", "--", "true", cache=tmp_path)
    assert p.returncode == 3 and "cannot write the session" in _one_error_line(p)
    used = tmp_path / "used"
    used.mkdir()
    (used / "precious.txt").write_text("keep me")
    p = hs("run", "-o", str(used), "--", "true", cache=tmp_path)
    assert p.returncode == 3 and "not empty" in _one_error_line(p)
    assert [x.name for x in used.iterdir()] == ["precious.txt"]
    assert (used / "precious.txt").read_text() == "keep me"


def test_default_session_name(libjemalloc: Path, tmp_path: Path) -> None:
    p = hs("run", "--", "true", cache=tmp_path / "c", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    (session,) = [d for d in tmp_path.iterdir() if d.name.startswith("heapscope-true-")]
    assert (session / "manifest.json").exists()


def test_statically_linked_jemalloc_needs_no_preload(gcc: Path, tmp_path: Path) -> None:
    static = Path("/usr/lib/x86_64-linux-gnu/libjemalloc_pic.a")
    if not static.exists():
        pytest.skip("no static jemalloc: apt-get install libjemalloc-dev")
    prog = tmp_path / "leaky-static"
    je.build([je.PROGRAMS_DIR / "leaky.c", je.PROGRAMS_DIR / "helper.c"], prog,
             ("-O1", "-g", "-pthread"), link_flags=(str(static), "-ldl", "-lstdc++", "-lm"))
    s = tmp_path / "s"
    p = hs("run", "-o", str(s), "--sample", "1", "--", str(prog), cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    manifest = json.loads((s / "manifest.json").read_text())
    assert manifest["jemalloc"]["preloaded"] is False
    assert manifest["conf_variable"] == "MALLOC_CONF"
    r = report(s)
    assert r["suspects"][0]["function"] == "leak_big"
    leaves = {x["function"] for x in r["suspects"]}
    assert not any(n.startswith(("je_", "prof_", "imalloc", "malloc")) for n in leaves), leaves


def test_html_pictures_and_commands(leaky_c_build: Any, tmp_path: Path) -> None:
    s = tmp_path / "s"
    p = hs("run", "-o", str(s), "--sample", "4k", "--interval", "1M", "--html", "--",
           str(leaky_c_build.binary), cache=tmp_path / "c")
    assert p.returncode == 0, p.stderr
    flame = (s / "flamegraph.html").read_text()
    assert "<canvas" in flame and "leak_big" in flame and "https://" not in flame
    assert "<svg" in (s / "timeline.html").read_text()
    for cmd in ("heapscope flamegraph", "heapscope timeline", "heapscope graph",
                "heapscope export"):
        assert cmd in p.stderr
    leaks = hs("leaks", str(s), cache=tmp_path / "c")
    assert "pictures:" in leaks.stdout and "heapscope timeline" in leaks.stdout


def test_every_dumps_from_outside_make_a_series(gcc: Path, libjemalloc: Path,
                                                tmp_path: Path) -> None:
    if not shutil.which("gdb"):
        pytest.skip("gdb not installed: apt-get install gdb")
    prog = tmp_path / "slow_leak"
    je.build([je.PROGRAMS_DIR / "slow_leak.c"], prog, ("-O1", "-g"))
    s = tmp_path / "s"
    p = hs("run", "-o", str(s), "--sample", "4k", "--every", "0.25", "--", str(prog),
           cache=tmp_path / "c", timeout=300)
    assert p.returncode == 0, p.stderr
    dumps = sorted((s / "dumps").glob("jeprof.*.heap"))
    manual = [d for d in dumps if ".m" in d.name]
    assert len(manual) >= 3, [d.name for d in dumps]
    r = report(s)
    first = r["suspects"][0]
    assert first["function"] == "slow_leak" and first["verdict"] == "leak", first
    assert first["growth_bytes_per_dump"] > 0
