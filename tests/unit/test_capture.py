"""Capture helpers: sizes, MALLOC_CONF presets, target inspection, session folders."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from heapscope.capture import session
from heapscope.capture.conf import build_conf, env_var, lg2
from heapscope.capture.jemalloc import JemallocLib, inspect_target
from heapscope.capture.runner import build_env
from heapscope.errors import InputError, UsageError
from heapscope.units import parse_size

DATA = Path(__file__).parent.parent / "data" / "symbols"


@pytest.mark.parametrize(("text", "value"), [("4096", 4096), ("512k", 524288),
                                             ("512KiB", 524288), ("1M", 1 << 20),
                                             ("2GB", 2 << 30), ("1.5k", 1536)])
def test_sizes(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["", "abc", "0", "-5", "12q"])
def test_bad_sizes(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_size(bad, "--sample")


def test_conf_presets() -> None:
    assert lg2(524288) == 19 and lg2(4096) == 12 and lg2(1) == 0 and lg2(6000) == 13
    conf = build_conf("/s/dumps/jeprof", sample=4096, interval=1 << 30, gdump=True, accum=True,
                      extra="prof_active:true")
    parts = conf.split(",")
    assert parts[0] == "prof:true"
    assert {"prof_final:true", "prof_leak:true", "lg_prof_sample:12", "lg_prof_interval:30",
            "prof_gdump:true", "prof_accum:true", "prof_prefix:/s/dumps/jeprof",
            "prof_active:true"} <= set(parts)
    assert "prof_leak_error" not in conf
    with pytest.raises(UsageError, match="prof_leak_error"):
        build_conf("/x", extra="prof_leak_error:true")


def test_env_keeps_users_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_CONF", "narenas:2")
    monkeypatch.setenv("LD_PRELOAD", "/opt/libother.so")
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xmx1g")
    lib = JemallocLib("/usr/lib/libjemalloc.so.2", "5.3.0", True)
    env = build_env(lib, "prof:true", java=True)
    assert env["MALLOC_CONF"] == "narenas:2,prof:true"
    assert env["LD_PRELOAD"] == "/usr/lib/libjemalloc.so.2 /opt/libother.so"
    assert env["JAVA_TOOL_OPTIONS"].startswith("-Xmx1g ")
    assert "-XX:+DumpPerfMapAtExit" in env["JAVA_TOOL_OPTIONS"]
    prefixed = build_env(JemallocLib("/bin/app", "", True, "_rjem_", preload=False), "prof:true",
                         java=False)
    assert prefixed["_RJEM_MALLOC_CONF"] == "prof:true"
    assert prefixed["LD_PRELOAD"] == "/opt/libother.so"
    assert env_var("_rjem_") == "_RJEM_MALLOC_CONF"


def test_prefixed_jemalloc_detected_in_executable(tmp_path: Path) -> None:
    if not shutil.which("gcc"):
        pytest.skip("gcc not installed: apt-get install gcc")
    exe = tmp_path / "rjem"
    subprocess.run(["gcc", "-O1", "-o", str(exe), str(DATA / "rjem_stub.c")], check=True)
    t = inspect_target(str(exe))
    assert t.elf and t.own_jemalloc and t.prefix == "_rjem_" and t.prof_symbols
    plain = inspect_target("true")
    assert plain.elf and not plain.own_jemalloc and plain.prefix == ""
    assert inspect_target("no-such-command-xyz").path is None


def test_session_folder_never_overwritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    a = session.create(None, ["/usr/bin/my prog"])
    assert Path(a, "dumps").is_dir() and Path(a).name.startswith("heapscope-my_prog-")
    Path(a, "x").write_text("data")
    b = session.create(None, ["/usr/bin/my prog"])
    assert a != b
    with pytest.raises(InputError, match="not empty"):
        session.create(a, ["x"])
    assert Path(a, "x").read_text() == "data"


def test_session_folder_must_be_the_callers_alone(tmp_path: Path) -> None:
    """An existing empty folder others can write to (or that someone else owns) could have
    links planted in it while the session is written: refused."""
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(InputError, match="not yours alone"):
        session.create(str(shared), ["x"])
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        with pytest.raises(InputError, match="owner uid 65534"):
            session.create(str(theirs), ["x"])
    mine = tmp_path / "mine"
    mine.mkdir()
    mine.chmod(0o755)
    assert session.create(str(mine), ["x"]) == str(mine)


def test_perf_map_copy_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    import os

    s = tmp_path / "s"
    session.create(str(s), ["x"])
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    pid = os.getpid()
    src = Path(f"/tmp/perf-{pid}.map")
    src.write_text("1000 10 f\n")
    try:
        (s / "dumps" / src.name).symlink_to(victim)  # planted before the copy
        assert session.collect_perf_maps(str(s), [pid]) == []
        assert victim.read_text() == "precious\n"
    finally:
        src.unlink()
