"""``heapscope env``: shell lines, java prefix, systemd drop-in (preview, --install, --remove)."""

from __future__ import annotations

import os
import stat

import pytest

from heapscope.capture import systemd
from heapscope.cli.main import main
from heapscope.errors import UsageError

LIB = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
needs_lib = pytest.mark.skipif(not os.path.exists(LIB), reason=f"{LIB} not installed")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["env", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str) -> None:
    assert err.startswith("heapscope: error: "), err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err


# --- printed forms (golden) ------------------------------------------------------------------

@needs_lib
def test_shell_lines(capsys, golden) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = run(capsys, "--jemalloc", LIB, "--dir", "/srv/dumps")
    assert rc == 0 and err == ""
    golden("env_shell.txt", out)
    assert f"export LD_PRELOAD={LIB}\n" in out
    assert "export MALLOC_CONF=prof:true," in out
    assert "prof_prefix:/srv/dumps/jeprof" in out
    assert "mkdir -p /srv/dumps\n" in out
    assert "heapscope top /srv/dumps" in out


@needs_lib
def test_java_prefix(capsys, golden) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = run(capsys, "--java", "--jemalloc", LIB, "--dir", "/srv/dumps")
    assert rc == 0
    golden("env_java.txt", out)
    assert (f"LD_PRELOAD={LIB} MALLOC_CONF=prof:true,"
            in out)
    assert "java -XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit\n" in out
    assert "/tmp/perf-<pid>.map" in out


def test_prefixed_form(capsys, golden) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = run(capsys, "--prefixed", "--dir", "/srv/dumps", "--interval", "1G",
                     "--gdump", "--accum")
    assert rc == 0
    golden("env_prefixed.txt", out)
    assert "LD_PRELOAD" not in out
    assert "export _RJEM_MALLOC_CONF=" in out
    assert "\nexport MALLOC_CONF" not in out
    assert "lg_prof_interval:30" in out and "prof_gdump:true" in out
    assert "prof_accum:true" in out
    assert "unset _RJEM_MALLOC_CONF" in out


@needs_lib
def test_systemd_preview(capsys, golden) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = run(capsys, "--systemd", "dirsrv@inst", "--jemalloc", LIB, "--dir",
                     "/srv/dumps")
    assert rc == 0
    golden("env_systemd.txt", out)
    path = "/etc/systemd/system/dirsrv@inst.service.d/heapscope.conf"
    assert f"cat > {path} <<'EOF'\n{systemd.MARKER}" in out
    assert "systemctl daemon-reload\nsystemctl restart dirsrv@inst.service\n" in out
    assert not os.path.exists(path)  # a preview writes nothing


def test_systemd_preview_default_dump_dir(capsys) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = run(capsys, "--systemd", "nginx", "--prefixed")
    assert rc == 0
    assert "ReadWritePaths=-/var/lib/heapscope/nginx\n" in out
    assert "prof_prefix:/var/lib/heapscope/nginx/jeprof" in out


def test_default_dir_is_made_absolute(capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run(capsys, "--prefixed")
    assert rc == 0
    assert f"prof_prefix:{tmp_path}/heapscope-dumps/jeprof" in out
    assert f"mkdir -p {tmp_path}/heapscope-dumps\n" in out
    assert not (tmp_path / "heapscope-dumps").exists()  # printing creates nothing


def test_dump_dir_with_space_is_shell_quoted(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = run(capsys, "--prefixed", "--dir", "/srv/my dumps")
    assert rc == 0
    assert "export _RJEM_MALLOC_CONF='prof:true," in out
    assert "mkdir -p '/srv/my dumps'\n" in out


# --- sizes --------------------------------------------------------------------------------

@pytest.mark.parametrize(("size", "lg"), [("512k", 19), ("1M", 20), ("2MiB", 21), ("4096", 12)])
def test_sizes(capsys, size: str, lg: int) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = run(capsys, "--prefixed", "--dir", "/d", "--sample", size)
    assert rc == 0 and err == ""
    assert f"lg_prof_sample:{lg}," in out


def test_size_not_power_of_two_is_rounded_with_a_note(capsys) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = run(capsys, "--prefixed", "--dir", "/d", "--sample", "500k")
    assert rc == 0
    assert "lg_prof_sample:19," in out
    assert "rounded to 2^19" in err


@pytest.mark.parametrize("size", ["lots", "-5", "1X", ""])
def test_bad_size(capsys, size: str) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = run(capsys, "--prefixed", "--dir", "/d", "--sample", size)
    assert rc == 2 and out == ""
    one_line_error(err)


# --- option errors ------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["--install"],
    ["--remove"],
    ["--systemd-dir", "/tmp/x"],
    ["--java", "--prefixed"],
    ["--prefixed", "--jemalloc", LIB],
    ["--java", "--systemd", "foo"],
    ["--prefixed", "--dir", "/srv/a,b"],
])
def test_contradictory_options(capsys, argv: list[str]) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    one_line_error(err)


def test_missing_library_is_a_tool_error(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = run(capsys, "--jemalloc", str(tmp_path / "nope.so"), "--dir", "/d")
    assert rc == 4 and out == ""
    one_line_error(err)


# --- unit names ---------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "unit"), [
    ("foo", "foo.service"),
    ("foo.service", "foo.service"),
    ("dirsrv@inst", "dirsrv@inst.service"),
    ("dirsrv@inst.service", "dirsrv@inst.service"),
    ("my-app_2:x", "my-app_2:x.service"),
    ("postgresql@15-main", "postgresql@15-main.service"),
])
def test_unit_names(name: str, unit: str) -> None:
    assert systemd.normalize_unit(name) == unit


@pytest.mark.parametrize("name", [
    "", ".service", "foo/bar", "../etc", "/etc/passwd", "foo.socket", "foo.timer", "dirsrv@",
    "dirsrv@.service", "-foo", ".hidden", "a b", "x@y@z", "foo;rm", "é", "a" * 300,
])
def test_bad_unit_names(capsys, tmp_path, name: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError):
        systemd.normalize_unit(name)
    rc, out, err = run(capsys, f"--systemd={name}", "--install", "--prefixed",
                       "--systemd-dir", str(tmp_path / "sys"), "--dir", str(tmp_path / "d"))
    assert rc == 2 and out == ""
    one_line_error(err)
    assert list(tmp_path.iterdir()) == []  # nothing created


# --- --install / --remove -----------------------------------------------------------------

@needs_lib
def test_install_then_remove(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sysdir, dumps = tmp_path / "sys", tmp_path / "dumps"
    base = ["--systemd", "nginx", "--systemd-dir", str(sysdir), "--dir", str(dumps)]
    rc, out, err = run(capsys, *base, "--install", "--jemalloc", LIB)
    assert rc == 0 and err == ""
    dropin = sysdir / "nginx.service.d" / "heapscope.conf"
    text = dropin.read_text()
    lines = text.splitlines()
    assert lines[0] == ("# written by heapscope env --systemd; remove with: "
                        "heapscope env --systemd nginx.service --remove")
    assert lines[1] == "[Service]"
    assert f"Environment=LD_PRELOAD={LIB}" in lines
    assert (f'Environment="MALLOC_CONF=prof:true,prof_final:true,prof_leak:true,'
            f'lg_prof_sample:19,prof_sys_thread_name:true,prof_prefix:{dumps}/jeprof"') in lines
    assert f"ReadWritePaths=-{dumps}" in lines
    assert stat.S_IMODE(dropin.stat().st_mode) == 0o644
    assert stat.S_IMODE(dumps.stat().st_mode) == 0o1777
    assert f"wrote {dropin}" in out
    assert "systemctl daemon-reload\nsystemctl restart nginx.service\n" in out
    assert sorted(p.name for p in dropin.parent.iterdir()) == ["heapscope.conf"]  # no temp file

    # Installing again replaces our own file.
    rc, out, _ = run(capsys, *base, "--install", "--prefixed", "--sample", "1M")
    assert rc == 0 and f"updated {dropin}" in out
    assert "lg_prof_sample:20" in dropin.read_text()
    assert "_RJEM_MALLOC_CONF" in dropin.read_text()
    assert "LD_PRELOAD" not in dropin.read_text()

    (dumps / "jeprof.1.0.f.heap").write_text("dump")
    neighbour = dropin.parent / "custom.conf"
    neighbour.write_text("[Service]\nEnvironment=FOO=1\n")
    rc, out, err = run(capsys, "--systemd", "nginx.service", "--systemd-dir", str(sysdir),
                       "--remove")
    assert rc == 0 and err == ""
    assert not dropin.exists()
    assert neighbour.read_text() == "[Service]\nEnvironment=FOO=1\n"
    assert (dumps / "jeprof.1.0.f.heap").exists()
    assert f"dumps stay in {dumps}" in out
    assert "systemctl daemon-reload\nsystemctl restart nginx.service\n" in out

    rc, out, _ = run(capsys, "--systemd", "nginx", "--systemd-dir", str(sysdir), "--remove")
    assert rc == 0 and "nothing to remove" in out


def test_install_keeps_mode_of_existing_dump_dir(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dumps = tmp_path / "dumps"
    dumps.mkdir(mode=0o750)
    rc, out, _ = run(capsys, "--systemd", "app", "--install", "--prefixed",
                     "--systemd-dir", str(tmp_path / "sys"), "--dir", str(dumps))
    assert rc == 0
    assert stat.S_IMODE(dumps.stat().st_mode) == 0o750
    assert "must be able to write there" in out


def test_install_refuses_to_overwrite_a_file_it_did_not_write(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sysdir, dumps = tmp_path / "sys", tmp_path / "dumps"
    dropin = sysdir / "app.service.d" / "heapscope.conf"
    dropin.parent.mkdir(parents=True)
    mine = "[Service]\nEnvironment=LD_PRELOAD=/opt/mine.so\n"
    dropin.write_text(mine)
    rc, out, err = run(capsys, "--systemd", "app", "--install", "--prefixed",
                       "--systemd-dir", str(sysdir), "--dir", str(dumps))
    assert rc == 3 and out == ""
    one_line_error(err)
    assert "not written by heapscope" in err
    assert dropin.read_text() == mine
    assert not dumps.exists()  # refused before changing anything
    assert sorted(p.name for p in dropin.parent.iterdir()) == ["heapscope.conf"]


def test_remove_refuses_a_file_it_did_not_write(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dropin = tmp_path / "app.service.d" / "heapscope.conf"
    dropin.parent.mkdir()
    dropin.write_text("[Service]\n# " + systemd.MARKER + " (not on the first line)\n")
    rc, out, err = run(capsys, "--systemd", "app", "--systemd-dir", str(tmp_path), "--remove")
    assert rc == 3 and out == ""
    one_line_error(err)
    assert dropin.exists()


def test_symlink_is_never_followed(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "elsewhere.conf"
    target.write_text(systemd.MARKER + "\n")  # marked, but reached through a link
    dropin = tmp_path / "sys" / "app.service.d" / "heapscope.conf"
    dropin.parent.mkdir(parents=True)
    dropin.symlink_to(target)
    for action in ("--install", "--remove"):
        rc, _, err = run(capsys, "--systemd", "app", action, "--prefixed",
                         "--systemd-dir", str(tmp_path / "sys"), "--dir", str(tmp_path / "d"))
        assert rc == 3
        one_line_error(err)
    assert dropin.is_symlink() and target.read_text() == systemd.MARKER + "\n"


def test_dropin_escapes_systemd_specifiers() -> None:
    d = systemd.DropIn("a.service", "/opt/lib%x.so", "MALLOC_CONF", 'prof:true,x:"%', "/d")
    text = d.text()
    assert "Environment=LD_PRELOAD=/opt/lib%%x.so\n" in text
    assert 'Environment="MALLOC_CONF=prof:true,x:\\"%%"\n' in text


def test_dropin_rejects_dump_dir_with_space(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rc, _, err = run(capsys, "--systemd", "app", "--install", "--prefixed",
                     "--systemd-dir", str(tmp_path / "sys"), "--dir", str(tmp_path / "a b"))
    assert rc == 2
    one_line_error(err)
    assert list(tmp_path.iterdir()) == []


def test_write_dropin_is_atomic_on_failure(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dropin = tmp_path / "app.service.d" / "heapscope.conf"
    dropin.parent.mkdir()
    old = systemd.MARKER + "\nold\n"
    dropin.write_text(old)

    def boom(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(systemd.os, "replace", boom)
    with pytest.raises(Exception, match="No space left"):
        systemd.write_dropin(dropin, systemd.MARKER + "\nnew\n")
    assert dropin.read_text() == old
    assert sorted(p.name for p in dropin.parent.iterdir()) == ["heapscope.conf"]


def test_systemd_values_with_control_characters_are_refused() -> None:
    """A newline in --conf would become a unit directive of its own (ExecStartPre=…)."""
    import pytest

    from heapscope.capture.systemd import DropIn
    from heapscope.errors import UsageError

    for conf, dump_dir in (("prof:true\nExecStartPre=/bin/sh -c id", "/var/tmp/d"),
                           ("prof:true", "/var/tmp/d\nExecStart=/x"),
                           ("prof:true\r", "/var/tmp/d")):
        d = DropIn("app.service", "/usr/lib/libjemalloc.so.2", "MALLOC_CONF", conf, dump_dir)
        with pytest.raises(UsageError, match="control characters"):
            d.text()


def test_run_refuses_a_session_folder_with_a_comma(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest

    from heapscope.capture.runner import RunOptions, run_session
    from heapscope.errors import UsageError

    with pytest.raises(UsageError, match="comma"):
        run_session(["/bin/true"], RunOptions(output=str(tmp_path / "a,b")))
    assert not (tmp_path / "a,b").exists()
