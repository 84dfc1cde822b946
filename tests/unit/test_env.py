"""``heapscope env``: shell lines, java prefix, systemd drop-in (preview, --install, --remove)."""

from __future__ import annotations

import grp
import os
import pwd
import stat
from pathlib import Path

import pytest

from heapscope.capture import systemd
from heapscope.cli.main import main
from heapscope.errors import UsageError

LIB = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
needs_lib = pytest.mark.skipif(not os.path.exists(LIB), reason=f"{LIB} not installed")


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to a user needs root")
NOBODY = pwd.getpwnam("nobody") if "nobody" in {p.pw_name for p in pwd.getpwall()} else None
needs_nobody = pytest.mark.skipif(NOBODY is None, reason="no user nobody")
REAL_QUERY = systemd.query_unit  # the autouse fixture below replaces it
NO_SYSTEMD = ("# heapscope: could not ask systemd who {unit} runs as; the dump folder is "
              "root's: pass --user NAME if the service has User=\n")


@pytest.fixture(autouse=True)
def no_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never ask the host's systemd: by default it cannot be asked (as in a container)."""
    monkeypatch.setattr(systemd, "query_unit", lambda unit: None)


def systemd_says(monkeypatch: pytest.MonkeyPatch, **props: str) -> None:
    monkeypatch.setattr(systemd, "query_unit",
                        lambda unit: {"LoadState": "loaded", "User": "", "Group": "",
                                      "DynamicUser": "no", **props})


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
    assert NO_SYSTEMD.format(unit="dirsrv@inst.service") in out
    assert "install -d -m 0700 -o root -g root /srv/dumps\n" in out
    assert "1777" not in out
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
    ["--prefixed", "--user", "root"],
    ["--prefixed", "--systemd", "foo", "--user", "a\nb"],
    ["--prefixed", "--systemd", "foo", "--user=-rf"],
    ["--prefixed", "--systemd", "foo", "--user", "no such user"],
    ["--prefixed", "--systemd", "foo", "--user", "heapscope-no-such-user"],
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
@as_root
@needs_nobody
def test_install_then_remove(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert NOBODY is not None
    sysdir, dumps = tmp_path / "sys", tmp_path / "dumps"
    base = ["--systemd", "nginx", "--systemd-dir", str(sysdir), "--dir", str(dumps)]
    rc, out, err = run(capsys, *base, "--install", "--jemalloc", LIB, "--user", "nobody")
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
    st = os.stat(dumps)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert (st.st_uid, st.st_gid) == (NOBODY.pw_uid, NOBODY.pw_gid)
    assert f"created {dumps} (mode 0700, owner nobody) for the dumps" in out
    assert "could not ask systemd" not in out  # --user: systemd is not asked
    assert f"wrote {dropin}" in out
    assert "systemctl daemon-reload\nsystemctl restart nginx.service\n" in out
    assert sorted(p.name for p in dropin.parent.iterdir()) == ["heapscope.conf"]  # no temp file

    # Installing again replaces our own file.
    rc, out, _ = run(capsys, *base, "--install", "--prefixed", "--sample", "1M",
                     "--user", "nobody")
    assert rc == 0 and f"updated {dropin}" in out
    assert "lg_prof_sample:20" in dropin.read_text()
    assert "_RJEM_MALLOC_CONF" in dropin.read_text()
    assert "LD_PRELOAD" not in dropin.read_text()

    assert os.stat(dumps).st_uid == NOBODY.pw_uid  # the existing folder is left as it is
    assert f"dumps go to {dumps} (it exists, owned by nobody, mode 0700; left as it is)" in out
    assert "WARNING" not in out

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
    assert f"dumps go to {dumps} (it exists, owned by root, mode 0750; left as it is)" in out
    assert "WARNING" not in out


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

    def boom(src: str, dst: str, **kw: object) -> None:
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


# --- who owns the dump folder -------------------------------------------------------------

def _install(capsys: pytest.CaptureFixture[str], tmp_path: Path, *more: str,
             unit: str = "app") -> tuple[int, str, str]:
    return run(capsys, "--systemd", unit, "--install", "--prefixed",
               "--systemd-dir", str(tmp_path / "sys"), "--dir", str(tmp_path / "dumps"), *more)


@needs_nobody
def test_preview_names_the_owner(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert NOBODY is not None
    group = grp.getgrgid(NOBODY.pw_gid).gr_name
    dumps = tmp_path / "dumps"
    rc, out, _ = run(capsys, "--systemd", "app", "--prefixed", "--dir", str(dumps),
                     "--user", "nobody")
    assert rc == 0
    assert f"install -d -m 0700 -o nobody -g {group} {dumps}\n" in out
    assert "could not ask systemd" not in out
    assert "1777" not in out and "mkdir -p -m" not in out
    assert not dumps.exists()


def test_unknown_systemd_is_root_with_a_note(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rc, out, err = _install(capsys, tmp_path)
    assert rc == 0 and err == ""
    assert out.startswith(NO_SYSTEMD.format(unit="app.service"))
    dumps = tmp_path / "dumps"
    st = os.stat(dumps)
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert st.st_uid == os.geteuid()
    assert f"created {dumps} (mode 0700, owner {pwd.getpwuid(os.geteuid()).pw_name})" in out


@as_root
@needs_nobody
def test_user_and_group_come_from_systemd(capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    assert NOBODY is not None
    systemd_says(monkeypatch, User="nobody", Group="root")
    rc, out, err = _install(capsys, tmp_path)
    assert rc == 0 and err == ""
    st = os.stat(tmp_path / "dumps")
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (NOBODY.pw_uid, 0, 0o700)
    assert "owner nobody" in out and "could not ask" not in out


def test_empty_user_means_root(capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    systemd_says(monkeypatch, User="")
    rc, out, _ = run(capsys, "--systemd", "app", "--prefixed", "--dir", str(tmp_path / "d"))
    assert rc == 0
    assert f"install -d -m 0700 -o root -g {grp.getgrgid(0).gr_name} {tmp_path / 'd'}\n" in out
    assert "heapscope: could not ask" not in out


def test_unit_systemd_does_not_know_is_root_with_a_note(capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    systemd_says(monkeypatch, LoadState="not-found")
    rc, out, _ = run(capsys, "--systemd", "app", "--prefixed", "--dir", str(tmp_path / "d"))
    assert rc == 0
    assert "systemd does not know app.service (yet); the dump folder is root's" in out


def test_unknown_user_from_systemd_is_named(capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    systemd_says(monkeypatch, User="heapscope-no-such-user")
    rc, out, err = _install(capsys, tmp_path)
    assert rc == 2 and out == ""
    one_line_error(err)
    assert "heapscope-no-such-user" in err
    assert list(tmp_path.iterdir()) == []


def test_dynamic_user_needs_user_or_an_existing_dir(capsys, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    systemd_says(monkeypatch, User="app", DynamicUser="yes")
    for argv in (["--install"], []):
        rc, out, err = run(capsys, "--systemd", "app", "--prefixed", *argv,
                           "--systemd-dir", str(tmp_path / "sys"),
                           "--dir", str(tmp_path / "dumps"))
        assert rc == 2 and out == ""
        one_line_error(err)
        assert "DynamicUser=yes" in err and "at each start" in err
        assert "--user" in err and "StateDirectory" in err
    assert list(tmp_path.iterdir()) == []

    # A folder the service can already write (its StateDirectory) is used as it is.
    state = tmp_path / "state"
    state.mkdir(mode=0o750)
    rc, out, err = run(capsys, "--systemd", "app", "--prefixed", "--install",
                       "--systemd-dir", str(tmp_path / "sys"), "--dir", str(state))
    assert rc == 0 and err == ""
    assert "DynamicUser=yes" in out and f"dumps go to {state}" in out
    assert stat.S_IMODE(state.stat().st_mode) == 0o750

    # --user names who it will be.
    rc, out, _ = run(capsys, "--systemd", "app", "--prefixed", "--dir", str(tmp_path / "d"),
                     "--user", "root")
    assert rc == 0 and "install -d -m 0700 -o root" in out


@as_root
@needs_nobody
def test_existing_unsafe_dump_dir_is_left_with_a_warning(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert NOBODY is not None
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dumps.chmod(0o1777)  # what an older heapscope made
    rc, out, _ = _install(capsys, tmp_path)
    assert rc == 0
    assert stat.S_IMODE(dumps.stat().st_mode) == 0o1777
    warning = [line for line in out.splitlines() if "WARNING" in line]
    assert len(warning) == 1
    assert "writable by other users (mode 1777)" in warning[0]
    assert "plant or read dumps" in warning[0] and "fresh --dir" in warning[0]
    # The preview warns too.
    rc, out, _ = run(capsys, "--systemd", "app", "--prefixed", "--dir", str(dumps))
    assert "WARNING" in out and "mode 1777" in out

    dumps.chmod(0o700)
    os.chown(dumps, NOBODY.pw_uid, NOBODY.pw_gid)
    rc, out, _ = _install(capsys, tmp_path)  # the service runs as root
    assert rc == 0
    assert "WARNING" in out and "owned by nobody, not root:" in out
    assert os.stat(dumps).st_uid == NOBODY.pw_uid


@pytest.mark.parametrize("kind", ["symlink", "file"])
def test_dump_dir_that_is_no_folder_is_refused(capsys, tmp_path, kind: str) -> None:  # type: ignore[no-untyped-def]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    dumps = tmp_path / "dumps"
    if kind == "symlink":
        dumps.symlink_to(elsewhere)
    else:
        dumps.write_text("x")
    rc, out, err = _install(capsys, tmp_path)
    assert rc == 3 and out == ""
    one_line_error(err)
    assert ("symbolic link" if kind == "symlink" else "not a folder") in err
    assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o755
    assert elsewhere.stat().st_uid == os.geteuid()
    assert not (tmp_path / "sys" / "app.service.d" / "heapscope.conf").exists()


# --- the drop-in: never through a link, never someone else's ------------------------------

def test_symlink_at_the_dropin_is_refused_and_its_target_untouched(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    victim = tmp_path / "victim"
    victim.write_text("root::0:0::/:/bin/sh\n")
    dropin = tmp_path / "sys" / "app.service.d" / "heapscope.conf"
    dropin.parent.mkdir(parents=True)
    dropin.symlink_to(victim)
    rc, out, err = _install(capsys, tmp_path)
    assert rc == 3 and out == ""
    one_line_error(err)
    assert "symbolic link" in err
    assert victim.read_text() == "root::0:0::/:/bin/sh\n"
    assert dropin.is_symlink()
    assert sorted(p.name for p in dropin.parent.iterdir()) == ["heapscope.conf"]
    assert not (tmp_path / "dumps").exists()  # refused before changing anything


def test_dot_d_folder_that_is_a_symlink_is_refused(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "sys").mkdir()
    (tmp_path / "sys" / "app.service.d").symlink_to(real)
    for action in ("--install", "--remove"):
        rc, out, err = run(capsys, "--systemd", "app", action, "--prefixed",
                           "--systemd-dir", str(tmp_path / "sys"),
                           "--dir", str(tmp_path / "dumps"))
        assert rc == 3 and out == ""
        one_line_error(err)
        assert "symbolic link" in err
    assert list(real.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777])
def test_dot_d_folder_others_can_write_is_refused(capsys, tmp_path, mode: int) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "sys" / "app.service.d"
    folder.mkdir(parents=True)
    folder.chmod(mode)
    rc, out, err = _install(capsys, tmp_path)
    assert rc == 3 and out == ""
    one_line_error(err)
    assert "writable by other users" in err
    assert list(folder.iterdir()) == []
    assert not (tmp_path / "dumps").exists()


@as_root
@needs_nobody
def test_dot_d_folder_owned_by_another_user_is_refused(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert NOBODY is not None
    folder = tmp_path / "sys" / "app.service.d"
    folder.mkdir(parents=True)
    os.chown(folder, NOBODY.pw_uid, NOBODY.pw_gid)
    rc, out, err = _install(capsys, tmp_path)
    assert rc == 3 and out == ""
    one_line_error(err)
    assert "owned by nobody" in err
    assert list(folder.iterdir()) == []


def test_new_dot_d_folder_is_0755(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rc, _, _ = _install(capsys, tmp_path)
    assert rc == 0
    folder = tmp_path / "sys" / "app.service.d"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert stat.S_IMODE((folder / "heapscope.conf").stat().st_mode) == 0o644


def test_foreign_dropin_is_refused(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dropin = tmp_path / "sys" / "app.service.d" / "heapscope.conf"
    dropin.parent.mkdir(parents=True)
    dropin.write_text("[Service]\nEnvironment=A=1\n")
    for action in ("--install", "--remove"):
        rc, out, err = run(capsys, "--systemd", "app", action, "--prefixed",
                           "--systemd-dir", str(tmp_path / "sys"),
                           "--dir", str(tmp_path / "dumps"))
        assert rc == 3 and out == ""
        assert "not written by heapscope" in err
    assert dropin.read_text() == "[Service]\nEnvironment=A=1\n"


def test_a_folder_at_the_dropin_is_refused(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    dropin = tmp_path / "sys" / "app.service.d" / "heapscope.conf"
    dropin.mkdir(parents=True)
    rc, _, err = _install(capsys, tmp_path)
    assert rc == 3 and "not a regular file" in err
    assert dropin.is_dir()


def test_dropin_appearing_while_writing_is_not_replaced(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    dropin = tmp_path / "app.service.d" / "heapscope.conf"
    real_link = os.link

    def planted_first(src: str, dst: str, **kw: object) -> None:
        dropin.write_text("someone else's\n")
        real_link(src, dst, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(systemd.os, "link", planted_first)
    with pytest.raises(Exception, match="appeared while heapscope was writing"):
        systemd.write_dropin(dropin, systemd.MARKER + "\nnew\n")
    assert dropin.read_text() == "someone else's\n"
    assert sorted(p.name for p in dropin.parent.iterdir()) == ["heapscope.conf"]


def test_install_twice_replaces_ours_and_leaves_no_temp(tmp_path) -> None:  # type: ignore[no-untyped-def]
    dropin = tmp_path / "app.service.d" / "heapscope.conf"
    assert systemd.write_dropin(dropin, systemd.MARKER + "\none\n") is False
    inode = dropin.stat().st_ino
    assert systemd.write_dropin(dropin, systemd.MARKER + "\ntwo\n") is True
    assert dropin.read_text() == systemd.MARKER + "\ntwo\n"
    assert dropin.stat().st_ino != inode  # a new file renamed over, not rewritten in place
    assert sorted(p.name for p in dropin.parent.iterdir()) == ["heapscope.conf"]
    assert systemd.is_ours(dropin)
    systemd.check_replaceable(dropin)


def test_remove_takes_only_ours(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    folder = tmp_path / "sys" / "app.service.d"
    rc, _, _ = _install(capsys, tmp_path)
    assert rc == 0
    (folder / "other.conf").write_text("[Service]\n")
    rc, out, _ = run(capsys, "--systemd", "app", "--remove", "--systemd-dir",
                     str(tmp_path / "sys"))
    assert rc == 0 and "removed" in out and f"dumps stay in {tmp_path / 'dumps'}" in out
    assert sorted(p.name for p in folder.iterdir()) == ["other.conf"]
    assert (tmp_path / "dumps").is_dir()


def test_remove_without_a_dot_d_folder_is_nothing(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    rc, out, _ = run(capsys, "--systemd", "app", "--remove", "--systemd-dir", str(tmp_path))
    assert rc == 0 and "nothing to remove" in out
    assert list(tmp_path.iterdir()) == []


def test_newline_in_conf_is_refused(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for install in ([], ["--install"]):
        rc, out, err = run(capsys, "--systemd", "app", "--prefixed", *install,
                           "--conf", "stats_print:true\nExecStartPre=/bin/sh -c id",
                           "--systemd-dir", str(tmp_path / "sys"),
                           "--dir", str(tmp_path / "dumps"))
        assert rc == 2 and out == ""
        one_line_error(err)
        assert "control characters" in err
    assert list(tmp_path.iterdir()) == []


# --- asking systemctl ---------------------------------------------------------------------

def _fake_systemctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "systemctl"
    exe.write_text("#!/bin/sh\n" + script)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    return bindir


def test_query_unit_parses_key_value_lines(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _fake_systemctl(tmp_path, monkeypatch, 'echo "$@" > "${0%/*}/args"\n'
                    "printf 'User=postgres\\nGroup=\\nDynamicUser=no\\nLoadState=loaded\\n'\n")
    assert REAL_QUERY("pg.service") == {"User": "postgres", "Group": "", "DynamicUser": "no",
                                        "LoadState": "loaded"}
    args = (tmp_path / "bin" / "args").read_text().split()
    assert "show" in args and "pg.service" in args
    assert {"User", "Group", "DynamicUser"} <= set(args)


@pytest.mark.parametrize("script", ["echo 'Failed to connect to bus' >&2\nexit 1\n",
                                    "kill -9 $$\n", "exec /bin/sleep 30\n"])
def test_query_unit_failure_is_none(tmp_path, monkeypatch, script: str) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(systemd, "_SYSTEMCTL_TIMEOUT", 0.5)
    _fake_systemctl(tmp_path, monkeypatch, script)
    assert REAL_QUERY("pg.service") is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert REAL_QUERY("pg.service") is None
