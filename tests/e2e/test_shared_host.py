"""Safe on a shared host: the attacks a second, unprivileged local user could try, run as a
real second user against heapscope running as root.

Two users are created with ``useradd`` for the module: ``hs-mallory`` (the attacker) and
``hs-service`` (the user a server drops to). Each attack must fail, nothing outside the
session may be written, planted files are left out and named, and the legitimate run still
produces its report.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
LEAKER_C = HERE / "sharedhost" / "leaker.c"
MALLORY, SERVICE = "hs-mallory", "hs-service"
LEAK_BYTES = 512 * 4096  # leak_here() in leaker.c


def hs(*args: str, cache: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope(*args, cache=cache, timeout=timeout, unprofiled=True)


def as_user(user: str, *cmd: str, stdin: str | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` as ``user`` (all privileges dropped)."""
    setpriv = shutil.which("setpriv")
    assert setpriv is not None
    return subprocess.run([setpriv, f"--reuid={user}", f"--regid={user}", "--init-groups",
                           "--", *cmd], capture_output=True, text=True, input=stdin,
                          timeout=60, check=False)


def one_line_error(p: subprocess.CompletedProcess[str]) -> str:
    assert p.returncode != 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("heapscope: error: "), p.stderr
    return lines[0]


@pytest.fixture(scope="module")
def users() -> Iterator[None]:
    if os.geteuid() != 0:
        pytest.skip("needs root: the attacks run as a second local user made with useradd")
    for tool in ("useradd", "userdel", "setpriv"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed: apt-get install passwd util-linux")
    made = []
    for user in (MALLORY, SERVICE):
        p = subprocess.run(["useradd", "--system", "--no-create-home", "--user-group",
                            "--shell", "/usr/sbin/nologin", user],
                           capture_output=True, text=True, check=False)
        if p.returncode == 0:
            made.append(user)
        elif p.returncode != 9:  # 9: the user exists (left by an interrupted run)
            raise AssertionError(f"useradd {user}: {p.stderr}")
    yield
    for user in made:
        subprocess.run(["userdel", user], capture_output=True, check=False)


@pytest.fixture(scope="module")
def base(users: None) -> Iterator[Path]:
    """A folder every user can enter (pytest's own is root's alone), with ``shared/`` in it:
    a sticky world-writable folder like /tmp."""
    path = Path(tempfile.mkdtemp(prefix="heapscope-shared-", dir="/tmp")).resolve()
    path.chmod(0o755)
    (path / "shared").mkdir()
    (path / "shared").chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def leaker(base: Path, gcc: Path) -> Path:
    out = base / "bin" / "leaker"
    out.parent.mkdir()
    out.parent.chmod(0o755)
    je.build([LEAKER_C], out, ("-O1", "-g", "-fno-omit-frame-pointer"))
    out.chmod(0o755)
    return out


@pytest.fixture(scope="module")
def service_run(base: Path, leaker: Path, libjemalloc: Path
                ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """root runs a server that drops to hs-service (``runuser -u``): the legitimate run."""
    session = base / "session"
    p = hs("run", "-o", str(session), "--sample", "4k", "--", "runuser", "-u", SERVICE, "--",
           str(leaker), cache=base / "cache")
    return session, p


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_service_run_is_private_and_reported(
        service_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    session, p = service_run
    assert p.returncode == 0, p.stderr
    report = json.loads((session / "report.json").read_text())
    first = report["suspects"][0]
    assert first["function"] == "leak_here", first
    assert first["bytes"] == pytest.approx(LEAK_BYTES, rel=0.2), first
    svc = os.stat(session / "dumps")
    entry = pwd.getpwnam(SERVICE)
    assert (svc.st_uid, _mode(session / "dumps")) == (entry.pw_uid, 0o700)
    assert _mode(session) == 0o710 and os.stat(session).st_gid == entry.pw_gid
    dumps = sorted((session / "dumps").glob("*.heap"))
    assert dumps and all(_mode(d) == 0o600 for d in dumps), [oct(_mode(d)) for d in dumps]
    for name in ("manifest.json", "report.json", "rss.csv", "jemalloc.log"):
        assert _mode(session / name) == 0o600, name
    access = json.loads((session / "manifest.json").read_text())["access"]
    assert access["dumps_owner"]["name"] == SERVICE
    assert set(access["readable_by"]) == {"root", SERVICE}


def test_second_user_cannot_read_or_plant(
        service_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    session, _ = service_run
    dump = next((session / "dumps").glob("*.heap"))
    for cmd in (["ls", str(session)], ["cat", str(session / "report.json")],
                ["cat", str(dump)], ["touch", str(session / "dumps" / "jeprof.1.0.f.heap")],
                ["ln", "-s", "/etc/shadow", str(session / "dumps" / "jeprof.2.0.f.heap")]):
        p = as_user(MALLORY, *cmd)
        assert p.returncode != 0 and "Permission denied" in p.stderr, (cmd, p.stderr)
    assert not (session / "dumps" / "jeprof.1.0.f.heap").exists()


def test_planted_output_folders_are_refused(base: Path, leaker: Path) -> None:
    shared = base / "shared"
    victim = base / "victim"  # root's, must stay empty
    victim.mkdir(exist_ok=True)
    assert as_user(MALLORY, "mkdir", str(shared / "planted")).returncode == 0
    assert as_user(MALLORY, "ln", "-s", str(victim), str(shared / "link")).returncode == 0
    assert as_user(MALLORY, "ln", "-s", str(victim / "nowhere"),
                   str(shared / "dangling")).returncode == 0
    for name, why in (("planted", "not yours alone"), ("link", "symbolic link"),
                      ("dangling", "symbolic link")):
        p = hs("run", "-o", str(shared / name), "--", str(leaker), cache=base / "cache")
        assert why in one_line_error(p), p.stderr
    assert list(victim.iterdir()) == [] and list((shared / "planted").iterdir()) == []
    assert not (victim / "nowhere").exists()


@pytest.fixture(scope="module")
def planted_folder(base: Path, service_run: tuple[Path, subprocess.CompletedProcess[str]]
                   ) -> tuple[Path, int]:
    """A world-writable dumps folder (like the 1777 folders older setups used) holding one
    real dump of root's, a fake dump hs-mallory wrote, and her link to /etc/shadow."""
    session, _ = service_run
    uid = pwd.getpwnam(SERVICE).pw_uid
    (real,) = [d for d in (session / "dumps").glob("*.f.heap") if d.stat().st_uid == uid]
    pid = int(real.name.split(".")[1])
    folder = base / "shared" / "dumps"
    folder.mkdir()
    folder.chmod(0o1777)
    shutil.copy(real, folder / real.name)
    fake = folder / "jeprof.424242.0.f.heap"
    text = real.read_text()  # the same content under another pid's name
    assert as_user(MALLORY, "sh", "-c", f"cat > {fake}", stdin=text).returncode == 0
    assert as_user(MALLORY, "ln", "-s", "/etc/shadow",
                   str(folder / "jeprof.424243.0.f.heap")).returncode == 0
    return folder, pid


def test_planted_dumps_are_left_out_and_named(base: Path,
                                              planted_folder: tuple[Path, int]) -> None:
    folder, pid = planted_folder
    p = hs("leaks", str(folder), "--format", "json", cache=base / "cache")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert [proc["pid"] for proc in report["processes"]] == [pid], report["processes"]
    left = [ln for ln in p.stderr.splitlines() if ln.startswith("heapscope: left out")]
    assert len(left) == 2, p.stderr
    assert any("424242" in ln and MALLORY in ln for ln in left), left
    assert any("424243" in ln and "symbolic link" in ln for ln in left), left
    assert any("left out" in n for n in report["notes"]), report["notes"]
    top = hs("top", str(folder), cache=base / "cache")
    assert top.returncode == 0 and "leak_here" in top.stdout, top.stderr
    assert "424242" not in top.stdout
    # Named by the user, her dumps are read; her link never is.
    trusted = hs("leaks", str(folder), "--format", "json", "--trust-owner", MALLORY,
                 cache=base / "cache")
    pids = {proc["pid"] for proc in json.loads(trusted.stdout)["processes"]}
    assert pids == {pid, 424242}, trusted.stderr


def test_output_link_is_replaced_not_written_through(
        base: Path, service_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    session, _ = service_run
    victim = base / "victim.txt"
    victim.write_text("keep\n")
    out = base / "shared" / "flame.html"
    assert as_user(MALLORY, "ln", "-s", str(victim), str(out)).returncode == 0
    # Something is at the name: refused (the one overwrite rule), nothing written through.
    p = hs("flamegraph", str(session), "-o", str(out), cache=base / "cache")
    assert p.returncode == 3 and "add --force" in p.stderr, p.stderr
    assert victim.read_text() == "keep\n" and os.path.islink(out)
    # With --force the link is replaced, still never written through.
    p = hs("flamegraph", str(session), "-o", str(out), "--force", cache=base / "cache")
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "keep\n"
    st = os.lstat(out)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
    assert "leak_here" in out.read_text()
    assert not [f for f in out.parent.iterdir() if f.name.endswith(".tmp")]


def test_attach_dump_of_a_service_process(base: Path, leaker: Path, libjemalloc: Path) -> None:
    if shutil.which("gdb") is None:
        pytest.skip("gdb not installed: apt-get install gdb")
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    env.update(LD_PRELOAD=str(libjemalloc), MALLOC_CONF="prof:true,lg_prof_sample:12")
    setpriv = shutil.which("setpriv")
    assert setpriv is not None
    proc = subprocess.Popen([setpriv, f"--reuid={SERVICE}", f"--regid={SERVICE}",
                             "--init-groups", "--", str(leaker), "wait"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
        # jemalloc's creat() follows links: a dump file in a folder others can write is
        # refused, whether or not a link is already planted there.
        victim = base / "victim-dump.txt"
        victim.write_text("keep\n")
        planted = base / "shared" / "x.heap"
        assert as_user(MALLORY, "ln", "-s", str(victim), str(planted)).returncode == 0
        for target in (planted, base / "shared" / "new.heap"):
            p = hs("attach", str(proc.pid), "dump", "-o", str(target), cache=base / "cache")
            assert "heapscope: error:" in p.stderr and p.returncode != 0, p.stderr
        assert victim.read_text() == "keep\n" and not (base / "shared" / "new.heap").exists()
        session = base / "attached"
        p = hs("attach", str(proc.pid), "dump", "-o", str(session), cache=base / "cache")
        assert p.returncode == 0, p.stderr
    finally:
        proc.communicate("bye\n", timeout=30)
    dumps = list((session / "dumps").glob("*.heap"))
    assert len(dumps) == 1 and _mode(dumps[0]) == 0o600
    assert os.stat(dumps[0]).st_uid == pwd.getpwnam(SERVICE).pw_uid
    assert _mode(session / "dumps") == 0o700 and _mode(session) == 0o710
    assert as_user(MALLORY, "cat", str(dumps[0])).returncode != 0
    top = hs("top", str(session), cache=base / "cache")
    assert top.returncode == 0 and "leak_here" in top.stdout, top.stderr


def test_systemd_install_refuses_planted_folders(base: Path) -> None:
    units = base / "shared" / "units"  # a careless, world-writable unit folder
    units.mkdir()
    units.chmod(0o1777)
    victim = base / "victim-units"
    victim.mkdir()
    assert as_user(MALLORY, "mkdir", str(units / "foo.service.d")).returncode == 0
    assert as_user(MALLORY, "ln", "-s", str(victim),
                   str(units / "bar.service.d")).returncode == 0
    for unit in ("foo", "bar"):
        dumps = base / f"dumps-{unit}"
        p = hs("env", "--systemd", unit, "--install", "--systemd-dir", str(units), "--dir",
               str(dumps), "--user", SERVICE, cache=base / "cache")
        one_line_error(p)
        assert not dumps.exists(), unit
    assert list((units / "foo.service.d").iterdir()) == [] and list(victim.iterdir()) == []


def test_systemd_install_for_the_service_user(base: Path) -> None:
    units = base / "units"
    units.mkdir()
    dumps = base / "dumps-svc"
    bad = hs("env", "--systemd", "svc", "--install", "--systemd-dir", str(units), "--dir",
             str(dumps), "--user", SERVICE, "--conf", "x:1\nExecStartPre=/bin/sh -c id",
             cache=base / "cache")
    assert "control characters" in one_line_error(bad)
    assert not (units / "svc.service.d" / "heapscope.conf").exists()
    p = hs("env", "--systemd", "svc", "--install", "--systemd-dir", str(units), "--dir",
           str(dumps), "--user", SERVICE, cache=base / "cache")
    assert p.returncode == 0, p.stderr
    dropin = units / "svc.service.d" / "heapscope.conf"
    assert os.lstat(dropin).st_uid == 0 and _mode(dropin) == 0o644
    assert f"ReadWritePaths=-{dumps}" in dropin.read_text()
    st = os.stat(dumps)
    assert (st.st_uid, _mode(dumps)) == (pwd.getpwnam(SERVICE).pw_uid, 0o700)
    assert as_user(SERVICE, "touch", str(dumps / "jeprof.1.0.f.heap")).returncode == 0
    p = as_user(MALLORY, "touch", str(dumps / "jeprof.2.0.f.heap"))
    assert p.returncode != 0 and "Permission denied" in p.stderr
