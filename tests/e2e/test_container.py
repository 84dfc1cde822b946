"""Services in containers: a leaking service in its own mount and PID namespaces, chrooted into
a root built by the test (its binary exists only there), reached by ``attach`` and the agent
with no flag; nothing heapscope makes inside the root is left behind."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.e2e import jemalloc as je

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
SVC_C = HERE / "programs" / "container_svc.c"
LEAK_LINE = next(i for i, text in enumerate(SVC_C.read_text().splitlines(), 1)
                 if "/* LEAK:container */" in text)
EXE = "/app/container_svc"  # the service's path inside its root; nothing there on the host
HELPERS_C = HERE / "sites" / "codecallers.c"
HELPERS = "/app/codecallers"  # a helper with one caller at run time and four in its code


def _walk(root: Path) -> set[str]:
    """Every path under ``root`` (the namespace's /proc is mounted only inside it)."""
    out = set()
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


def _needed_files(binaries: list[str]) -> set[str]:
    """The shared libraries and loader the binaries need, as ldd names them."""
    out = set()
    for b in binaries:
        text = subprocess.run(["ldd", b], capture_output=True, text=True, check=True).stdout
        out.update(re.findall(r"(/\S+) \(0x", text))
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, gcc: Path, libjemalloc: Path) -> Path:
    """A root folder with the service (built -g straight into it), its libraries, jemalloc
    with profiling, the loader and env."""
    if os.geteuid() != 0:
        pytest.skip("mount and PID namespaces and chroot need root")
    if shutil.which("unshare") is None:
        pytest.skip("unshare not installed (util-linux)")
    probe = subprocess.run(["unshare", "--mount", "--pid", "--fork", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"unshare --mount --pid cannot run here: {probe.stderr.strip()}")
    assert not os.path.exists(EXE)
    top = tmp_path_factory.mktemp("container") / "root"
    env = shutil.which("env")
    assert env is not None
    for f in {*_needed_files([env, str(libjemalloc)]), env, str(libjemalloc)}:
        dst = top / f.lstrip("/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(f, dst)  # follows links: each file is a real one inside the root
    (top / "usr/bin").mkdir(parents=True, exist_ok=True)
    if env != "/usr/bin/env":
        shutil.copy(env, top / "usr/bin/env")
    for d in ("tmp", "proc"):
        (top / d).mkdir(exist_ok=True)
    (top / "tmp").chmod(0o1777)
    je.build([SVC_C], top / EXE.lstrip("/"), ("-O1", "-g"))
    je.build([HELPERS_C], top / HELPERS.lstrip("/"), ("-O1", "-g"))
    return top


class Service:
    """The service in new mount and PID namespaces: chrooted into ``root``, or (``private``)
    into a tmpfs copy of it mounted only inside its namespace, invisible to the host."""

    def __init__(self, root: Path, libjemalloc: Path, private: bool = False,
                 argv: tuple[str, ...] = (EXE,)) -> None:
        self.exe = argv[0]
        inner = ["/usr/bin/env", f"LD_PRELOAD={libjemalloc}",
                 "MALLOC_CONF=prof:true,lg_prof_sample:12", *argv]
        if private:
            self.root = root.parent / "private"
            self.root.mkdir(exist_ok=True)
            r = self.root
            script = (f"mount -t tmpfs none {r} && cp -a {root}/. {r}/ && "
                      f"mount -t proc proc {r}/proc && exec chroot {r} {' '.join(inner)}")
            argv = ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", script]
        else:
            self.root = root
            argv = ["unshare", "--mount", "--pid", "--fork", "--kill-child",
                    f"--mount-proc={root}/proc", "chroot", str(root), *inner]
        self.outer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                      text=True)
        self.pid = 0
        self.pid = self._find()

    def _find(self) -> int:
        """The host pid of the service: the descendant of unshare running EXE."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            todo = [self.outer.pid]
            while todo:
                pid = todo.pop()
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
                    kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                except OSError:
                    continue
                if cmd == self.exe.encode():
                    time.sleep(0.3)  # some allocations to see
                    return pid
                todo += [int(k) for k in kids]
            if self.outer.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise AssertionError(f"the service did not start: {self.outer.stderr}")

    def stop(self) -> None:
        # unshare ignores SIGTERM while it waits: the service ends on it (it handles it even
        # as its namespace's pid 1), and unshare with it.
        if self.outer.poll() is None and self.pid:
            os.kill(self.pid, signal.SIGTERM)
        elif self.outer.poll() is None:
            self.outer.kill()  # the service never started: unshare alone is left
        try:
            self.outer.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.kill(self.pid, signal.SIGKILL)
            self.outer.communicate(timeout=20)


@pytest.fixture(scope="module")
def service(root: Path, libjemalloc: Path) -> Iterator[Service]:
    svc = Service(root, libjemalloc)
    yield svc
    svc.stop()


def hs(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return je.run_heapscope(*args, cache=tmp / "cache", unprofiled=True, timeout=120)


def _top_row(text: str) -> str:
    return next((ln for ln in text.splitlines() if "leak_in_container" in ln), "")


def test_attach_dump_then_top_names_the_line(service: Service, tmp_path: Path) -> None:
    before = _walk(service.root)
    session = tmp_path / "s"
    p = hs("attach", str(service.pid), "dump", "-o", str(session), tmp=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == f"{session}/dumps/jeprof.{service.pid}.0.m0.heap"
    assert _walk(service.root) == before
    m = json.loads((session / "manifest.json").read_text())
    # The service is the first process of its new PID namespace: pid 1 there.
    assert m["processes"][0]["pid"] == service.pid and m["processes"][0]["nspid"] == 1
    assert m["container"]["root"] == str(service.root) and m["container"]["root_lasts"]
    assert m["modules"][EXE]["root"] == str(service.root)
    p = hs("top", "--lines", str(session), tmp=tmp_path)
    assert p.returncode == 0, p.stderr
    row = _top_row(p.stdout)
    assert f"container_svc.c:{LEAK_LINE}" in row, p.stdout + p.stderr
    assert p.stdout.splitlines()[1] == row  # the first row: it holds most of the heap
    assert "warning" not in p.stderr, p.stderr
    p = hs("attach", str(service.pid), "status", tmp=tmp_path)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("container "))
    assert line.startswith(f"container  pid 1 in its own namespace, root {service.root}")


def test_a_helper_is_folded_by_the_code_inside_the_container(root: Path, libjemalloc: Path,
                                                              tmp_path: Path) -> None:
    """buf_reserve has one caller in the dump and four in the program's code, which exists
    only inside the root: read there, it folds into keep_names."""
    assert not os.path.exists(HELPERS)
    svc = Service(root, libjemalloc, argv=(HELPERS, "120"))
    try:
        session = tmp_path / "s"
        p = hs("attach", str(svc.pid), "dump", "-o", str(session), tmp=tmp_path)
        assert p.returncode == 0, p.stderr
        p = hs("top", "--format", "json", "-n", "0", str(session), tmp=tmp_path)
        assert p.returncode == 0, p.stderr
    finally:
        os.kill(svc.pid, signal.SIGKILL)  # pid 1 of its namespace: it ignores SIGTERM
        svc.outer.communicate(timeout=20)
    rows = [r for r in json.loads(p.stdout)["rows"] if r["flat"] > 0]
    assert rows[0]["name"] == "keep_names", rows[:3]
    assert [v["function"] for v in rows[0]["via"]] == ["xmalloc", "buf_reserve"], rows[0]


def test_attach_watch_reports_the_leak(service: Service, tmp_path: Path) -> None:
    before = _walk(service.root)
    session = tmp_path / "s"
    p = hs("attach", str(service.pid), "watch", "--every", "0.5", "--count", "6",
           "--format", "json", "-o", str(session), tmp=tmp_path)
    assert p.returncode == 0, p.stderr
    assert _walk(service.root) == before
    doc = json.loads(p.stdout)
    assert doc["pid"] == service.pid and doc["nspid"] == 1
    first = doc["suspects"][0]
    assert (first["function"], first["line"], first["verdict"]) == (
        "leak_in_container", LEAK_LINE, "leak"), doc["suspects"][:2]
    assert len(list((session / "dumps").glob(f"jeprof.{service.pid}.*.heap"))) == 6


def _ppid(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _descendant(cmdline: str, ancestor: int) -> int | None:
    """The host pid of the descendant of ``ancestor`` whose whole command line is
    ``cmdline``."""
    want = cmdline.encode() + b"\0"
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read() != want:
                    continue
        except OSError:
            continue
        pid = int(name)
        while pid > 1 and pid != ancestor:
            pid = _ppid(pid)
        if pid == ancestor:
            return int(name)
    return None


def test_run_every_follows_a_child_into_its_root(root: Path, libjemalloc: Path,
                                                 tmp_path: Path) -> None:
    """heapscope run starts the container itself (unshare + chroot): the service, in its own
    root and PID namespace, gets its rounds of dumps and its dump at exit through a folder
    inside its root, named with the host's pid, and its code is named from the files in its
    root; nothing is left inside it."""
    before = _walk(root)
    session = tmp_path / "s"
    argv = [*je.HEAPSCOPE_CMD, "run", "-o", str(session), "--sample", "4k", "--every",
            "0.5", "--", "unshare", "--mount", "--pid", "--fork", "--kill-child",
            f"--mount-proc={root}/proc", "chroot", str(root), EXE]
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    env["HEAPSCOPE_CACHE_DIR"] = str(tmp_path / "cache")
    run = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    # Rounds every 0.5 s until four of them brought the service's dump (on a loaded machine
    # a round through gdb can take seconds: counted, not timed), then SIGTERM to it, as its
    # operator would (unshare --fork ignores SIGTERM while it waits): it writes its dump at
    # exit.
    deadline = time.monotonic() + 60
    try:
        while (svc := _descendant(EXE, run.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert svc is not None, "the service did not start"
        # (Its dumps wait in a folder inside its root until the run ends.)
        deadline = time.monotonic() + 60
        while len(list(root.rglob("jeprof.*.m*.heap"))) < 4 and \
                time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.2)
        os.kill(svc, signal.SIGTERM)
        _, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:  # a failure above: leave nothing running
            if (left := _descendant(EXE, run.pid)) is not None:
                os.kill(left, signal.SIGKILL)
            run.kill()
            run.communicate()
    assert "Traceback" not in err, err
    doc = json.loads((session / "report.json").read_text())
    svc = [p for p in doc["processes"] if p["exe"] == EXE or p["cmdline"][:1] == [EXE]]
    assert len(svc) == 1, (doc["processes"], err)
    pid = svc[0]["pid"]
    dumps = sorted(p.name for p in (session / "dumps").glob(f"jeprof.{pid}.*.heap"))
    # Named with the host pid (jemalloc named them with pid 1, its own), the exit dump too.
    assert len(dumps) >= 5 and any(".f.heap" in d for d in dumps), (dumps, err[-3000:])
    first = doc["suspects"][0]
    assert (first["function"], first["line"], first["pid"]) == \
        ("leak_in_container", LEAK_LINE, pid), (doc["suspects"][:2], err)
    assert first["verdict"] in ("leak", "growing"), first
    assert _walk(root) == before


def test_a_root_only_its_namespace_sees(root: Path, libjemalloc: Path, tmp_path: Path) -> None:
    """The service's root is a tmpfs mounted only in its namespace (the host sees an empty
    folder): modules are read through /proc/PID/root while it runs; after it exits the
    warning says so, and --sysroot with a copy of its files names the line again."""
    svc = Service(root, libjemalloc, private=True)
    session = tmp_path / "s"
    try:
        assert not any(svc.root.iterdir())  # the host sees nothing of it
        p = hs("attach", str(svc.pid), "dump", "-o", str(session), tmp=tmp_path)
        assert p.returncode == 0, p.stderr
        m = json.loads((session / "manifest.json").read_text())
        assert m["container"]["root"] == f"/proc/{svc.pid}/root"
        assert not m["container"]["root_lasts"]
        p = hs("top", "--lines", str(session), tmp=tmp_path)
        assert f"container_svc.c:{LEAK_LINE}" in _top_row(p.stdout), p.stdout + p.stderr
    finally:
        svc.stop()
    p = hs("top", "--lines", str(session), "--no-cache", tmp=tmp_path)
    assert "leak_in_container" not in p.stdout
    assert (f"heapscope: warning: container_svc: {EXE} was mapped inside a container; its "
            f"process has exited, and its root could only be read through /proc/{svc.pid}/root"
            " while it ran: pass --sysroot DIR (a copy of the container's files)"
            ) in p.stderr.splitlines()
    p = hs("top", "--lines", "--sysroot", str(root), str(session), tmp=tmp_path)
    assert f"container_svc.c:{LEAK_LINE}" in _top_row(p.stdout), p.stdout + p.stderr


def _cgroup_leaf(pid: int) -> str:
    """The last name of the service's cgroup as /proc says it (v2 entry, else the first v1
    controller's), "" at the root."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    v2 = [ln[3:] for ln in lines if ln.startswith("0::")]
    paths = [p for p in v2 if p != "/"] + [ln.split(":", 2)[2] for ln in lines
                                            if not ln.startswith("0::")]
    paths = [p for p in paths if p not in ("", "/")]
    return paths[0].rstrip("/").rsplit("/", 1)[-1] if paths else ""


def test_agent_watches_the_service_in_its_container(service: Service, tmp_path: Path) -> None:
    before = _walk(service.root)
    port = je.free_port()
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    agent = subprocess.Popen(
        [*je.HEAPSCOPE_CMD, "agent", "--match", f"^{EXE}$", "--every", "0.5", "--rounds", "30",
         "--listen", f"127.0.0.1:{port}", "--state", str(tmp_path / "state")],
        env={**env, "HEAPSCOPE_CACHE_DIR": str(tmp_path / "cache")},
        stderr=subprocess.PIPE, text=True)
    leak = info = None
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and leak is None and agent.poll() is None:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
            except OSError:
                continue
            m = re.search(r'^heapscope_site_leak\{[^}]*function="leak_in_container"[^}]*\} 1\.0$',
                          text, re.M)
            leak = m.group(0) if m else None
            info = re.search(r"^heapscope_process_container_info\{([^}]*)\} 1\.0$", text, re.M)
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=60)
    assert leak is not None, err
    assert f'pid="{service.pid}"' in leak and f'line="{LEAK_LINE}"' in leak
    assert agent.returncode == 0 and "Traceback" not in err, err
    leaf = _cgroup_leaf(service.pid)
    if leaf:
        assert info is not None
        labels = dict(re.findall(r'(\w+)="([^"]*)"', info.group(1)))
        assert labels == {"container": leaf, "pid": str(service.pid),
                          "service": "container_svc"}
    else:
        assert info is None
    assert _walk(service.root) == before
