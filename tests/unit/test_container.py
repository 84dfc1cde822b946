"""Targets in containers: the container's identity from its cgroup, paths resolved inside its
root without leaving it, the private dump folder made there, and modules found in it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from heapscope.capture.container import (
    PREFIX,
    ContainerError,
    Drop,
    cgroup_path,
    confinement,
    container_identity,
)
from heapscope.model import Mapping
from heapscope.symbols.elf import ElfInfo
from heapscope.symbols.locate import Locator, Module
from heapscope.symbols.options import ModuleFacts, SymbolOptions
from heapscope.symbols.rooted import resolve_in_root

CID = "4f1c9a0be37d2c5a8e6b1f0d9c8a7b6e5d4c3b2a1f0e9d8c7b6a5f4e3d2c1b0a"


# ---- the container's identity ---------------------------------------------------------------


def test_kubernetes_systemd_cgroup_names_pod_and_container() -> None:
    path = ("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            "1b2c3d4e_5f60_7182_93a4_b5c6d7e8f901.slice/cri-containerd-" + CID + ".scope")
    assert container_identity(path) == {"pod_uid": "1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901",
                                        "container": "4f1c9a0be37d"}


def test_kubernetes_cgroupfs_driver_on_cgroup_v1() -> None:
    lines = ["12:pids:/kubepods/besteffort/pod0f9e8d7c-6b5a-4938-2716-a5b4c3d2e1f0/" + CID,
             "11:memory:/kubepods/besteffort/pod0f9e8d7c-6b5a-4938-2716-a5b4c3d2e1f0/" + CID,
             "1:name=systemd:/", "0::/"]
    path = cgroup_path(lines)
    assert path == "/kubepods/besteffort/pod0f9e8d7c-6b5a-4938-2716-a5b4c3d2e1f0/" + CID
    assert container_identity(path) == {"pod_uid": "0f9e8d7c-6b5a-4938-2716-a5b4c3d2e1f0",
                                        "container": "4f1c9a0be37d"}


def test_docker_and_podman_scopes() -> None:
    assert container_identity(f"/system.slice/docker-{CID}.scope") == {
        "container": "4f1c9a0be37d"}
    # podman under systemd puts the payload in a "container" child of its scope.
    assert container_identity(f"/machine.slice/libpod-{CID}.scope/container") == {
        "container": "4f1c9a0be37d"}


def test_other_cgroups_give_their_last_name_and_the_root_gives_nothing() -> None:
    assert container_identity("/system.slice/nginx.service") == {"container": "nginx.service"}
    assert container_identity("/") == {}
    assert container_identity("") == {}
    # cgroup v2 only: the one line is the answer.
    assert cgroup_path(["0::/system.slice/nginx.service"]) == "/system.slice/nginx.service"
    assert cgroup_path(["0::/"]) == "/"
    assert cgroup_path(["garbage"]) == ""


def test_this_process_is_not_confined() -> None:
    assert confinement(os.getpid()) is None


# ---- paths inside another root -------------------------------------------------------------


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "usr/lib").mkdir(parents=True)
    (root / "usr/lib/libx.so").write_bytes(b"inside")
    (root / "lib").symlink_to("/usr/lib")  # absolute, as merged-/usr images ship it
    (root / "evil").symlink_to("/etc")  # planted: on the host it would be /etc
    (root / "up").symlink_to("../../../../../etc")
    return root


def test_absolute_links_resolve_inside_the_root(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert resolve_in_root(str(root), "/lib/libx.so") == str(root / "usr/lib/libx.so")
    assert resolve_in_root(str(root), "/usr/lib/../lib/libx.so") == str(
        root / "usr/lib/libx.so")


def test_links_never_lead_out_of_the_root(tmp_path: Path) -> None:
    root = _root(tmp_path)
    assert os.path.exists("/etc/hostname") or os.path.exists("/etc/passwd")
    for path in ("/evil/passwd", "/evil/hostname", "/up/passwd", "/../../etc/passwd"):
        assert resolve_in_root(str(root), path) is None, path
    (root / "loop").symlink_to("/loop")
    assert resolve_in_root(str(root), "/loop/x") is None


def test_a_module_of_a_container_is_read_from_its_root_only(tmp_path: Path) -> None:
    """A recorded root: the file inside it is used (build-id checked), never the host's
    file at the same path, and a missing one says so."""
    root = tmp_path / "root"
    (root / "usr/bin").mkdir(parents=True)
    shutil.copy("/usr/bin/true", root / "usr/bin/true")
    elf = ElfInfo.read("/usr/bin/true")
    code = next(seg for seg in elf.segments if seg.flags & 1)

    def module(path: str) -> Module:
        return Module(path, [Mapping(0x55E000000000 + code.offset, 0x55E000010000,
                                     code.offset, path, "r-xp")])

    facts = {"/usr/bin/true": ModuleFacts(elf.build_id, root=str(root)),
             "/usr/bin/gone": ModuleFacts(elf.build_id, root=str(root))}
    opts = SymbolOptions(cache_dir=None, recorded=facts)
    m = module("/usr/bin/true")
    loc = Locator(opts, [m], "/usr/bin/true")
    assert loc.candidates(m) == [str(root / "usr/bin/true")]
    loc.locate(m)
    assert m.elf is not None and m.elf.path == str(root / "usr/bin/true")
    assert not m.diagnostics
    gone = module("/usr/bin/gone")
    Locator(opts, [gone], "/usr/bin/true").locate(gone)
    assert gone.elf is None
    assert [d.message for d in gone.diagnostics] == [
        f"/usr/bin/gone was mapped inside a container; not found in its root {root}: pass "
        "--sysroot DIR (a copy of the container's files)"]
    # --sysroot wins over the recorded root.
    opts = SymbolOptions(cache_dir=None, recorded=facts, sysroot="/elsewhere")
    assert Locator(opts, [m], "/usr/bin/true").candidates(m) == ["/elsewhere/usr/bin/true"]


def test_a_root_seen_through_proc_of_an_exited_process() -> None:
    """The root of a process gone: the warning says why and what to pass."""
    facts = {"/app/svc": ModuleFacts("ab" * 20, root="/proc/999999999/root")}
    m = Module("/app/svc", [Mapping(0x1000, 0x2000, 0, "/app/svc", "r-xp")])
    Locator(SymbolOptions(cache_dir=None, recorded=facts), [m], "/app/svc").locate(m)
    assert [d.message for d in m.diagnostics] == [
        "/app/svc was mapped inside a container; its process has exited, and its root could "
        "only be read through /proc/999999999/root while it ran: pass --sysroot DIR (a copy "
        "of the container's files)"]


# ---- the private folder inside the root ----------------------------------------------------


def test_drop_is_made_private_read_back_and_removed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    dest = tmp_path / "out.heap"
    with Drop(os.getpid(), None, str(root)) as drop:
        (made,) = list((root / "tmp").iterdir())
        assert made.name.startswith(PREFIX) and drop.path("a.heap") == f"/tmp/{made.name}/a.heap"
        assert made.stat().st_mode & 0o777 == 0o700 and made.stat().st_uid == os.geteuid()
        (made / "a.heap").write_bytes(b"heap_v2/524288\n")  # as the target would
        (made / "stray").write_bytes(b"x")
        assert drop.collect("a.heap", str(dest))
        assert not drop.collect("missing.heap", str(tmp_path / "none.heap"))
    assert dest.read_bytes() == b"heap_v2/524288\n" and dest.stat().st_mode & 0o777 == 0o600
    assert not (tmp_path / "none.heap").exists()
    assert list((root / "tmp").iterdir()) == []  # the folder and what was left in it


def test_drop_refuses_planted_links_and_tries_the_next_folder(tmp_path: Path) -> None:
    """``/tmp -> /`` planted in the container: heapscope must not make its folder in the
    host's root; it takes /var/tmp instead, and says why none would do."""
    root = tmp_path / "root"
    (root / "var/tmp").mkdir(parents=True)
    (root / "tmp").symlink_to("/")
    before = set(os.listdir("/"))
    with Drop(os.getpid(), None, str(root)) as drop:
        assert drop.inside.startswith("/var/tmp/" + PREFIX)
        assert set(os.listdir("/")) == before
    assert list((root / "var/tmp").iterdir()) == []
    (root / "var/tmp").rmdir()
    (root / "var/tmp").symlink_to("/tmp")
    with pytest.raises(ContainerError) as e:
        Drop(os.getpid(), None, str(root))
    assert str(e.value).startswith("no folder inside its root takes a new entry (/tmp: ")
    assert "/var/tmp: " in str(e.value) and "/dev/shm: No such file or directory" in str(e.value)


def test_drop_removes_everything_on_an_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "tmp").mkdir(parents=True)
    with pytest.raises(KeyboardInterrupt), Drop(os.getpid(), None, str(root)) as drop:
        (root / "tmp" / drop.inside.rsplit("/", 1)[1] / "half.heap").write_bytes(b"x")
        raise KeyboardInterrupt
    assert list((root / "tmp").iterdir()) == []
