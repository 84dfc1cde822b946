"""A systemd drop-in that runs a service under jemalloc's heap profiler.

``heapscope env --systemd UNIT`` writes ``<systemd dir>/UNIT.service.d/heapscope.conf``. The
file's first line is a marker; heapscope only ever replaces or deletes a file carrying it, so a
drop-in written by hand (or by another tool) under the same name is never touched.

heapscope runs as root here, in folders other local users may reach, so every step assumes one
of them is trying to redirect it: the drop-in is written and deleted through the ``.d``
folder's descriptor without following links, and the dump folder belongs to the one user the
service runs as (mode 0700) rather than being open to everyone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from heapscope.errors import InputError, UsageError

SYSTEMD_DIR = "/etc/systemd/system"
DUMP_ROOT = "/var/lib/heapscope"
DROPIN_NAME = "heapscope.conf"
MARKER = "# written by heapscope env --systemd"

# systemd's unit-name alphabet (src/basic/unit-name.c): letters, digits and ":-_.\"; "@" splits a
# template from its instance. Names are at most 255 characters with the type suffix.
_NAME = re.compile(r"[A-Za-z0-9:_.\\-]+")
_MAX_NAME = 255
_OTHER_TYPES = ("socket", "device", "mount", "automount", "swap", "target", "path", "timer",
                "slice", "scope")


def normalize_unit(name: str) -> str:
    """``foo`` → ``foo.service``; validate ``foo[.service]`` and ``tmpl@inst[.service]``.

    Raises UsageError for anything systemd would not accept as a service name, for other unit
    types (only services take ``Environment=``) and for a bare template (``tmpl@``).
    """
    base = name.removesuffix(".service")
    suffix = base.rpartition(".")[2]
    if "." in base and suffix in _OTHER_TYPES:
        raise UsageError(f"{name!r} is a .{suffix} unit; only a .service runs a program")
    prefix, at, instance = base.partition("@")
    ok = (bool(prefix) and _NAME.fullmatch(prefix) is not None
          and not prefix.startswith(("-", "."))
          and (not at or (_NAME.fullmatch(instance) is not None)))
    if at and not instance:
        raise UsageError(f"{name!r} is a template; name one instance, e.g. {prefix}@INSTANCE")
    if not ok:
        raise UsageError(f"{name!r} is not a systemd service name (foo, foo.service, "
                         "foo@instance, foo@instance.service)")
    unit = base + ".service"
    if len(unit) > _MAX_NAME:
        raise UsageError(f"unit name too long ({len(unit)} > {_MAX_NAME} characters)")
    return unit


def unit_stem(unit: str) -> str:
    """The unit name without ``.service`` (used to name the default dump folder)."""
    return unit.removesuffix(".service")


def default_dump_dir(unit: str) -> str:
    """Where a service's dumps go unless ``--dir`` says otherwise."""
    return f"{DUMP_ROOT}/{unit_stem(unit)}"


def dropin_path(unit: str, systemd_dir: str = SYSTEMD_DIR) -> Path:
    """``<systemd_dir>/<unit>.d/heapscope.conf``."""
    return Path(systemd_dir) / f"{unit}.d" / DROPIN_NAME


def _escape(value: str) -> str:
    """Escape for systemd: ``%`` starts a specifier; ``\\`` and ``"`` are C-style in quotes."""
    return value.replace("%", "%%").replace("\\", "\\\\").replace('"', '\\"')


def _environment(name: str, value: str, *, quote: bool) -> str:
    """One ``Environment=`` line; quoted when asked or when the value needs it."""
    assignment = f"{name}={_escape(value)}"
    if quote or any(c.isspace() or c in "\"'\\" for c in value):
        return f'Environment="{assignment}"'
    return f"Environment={assignment}"


@dataclass(frozen=True)
class DropIn:
    """What the drop-in sets: the library to preload (None if linked in), MALLOC_CONF, dumps."""

    unit: str
    preload: str | None
    conf_var: str
    conf: str
    dump_dir: str

    def text(self) -> str:
        """The drop-in file's contents, marker first."""
        for what, value in (("unit", self.unit), ("library", self.preload or ""),
                            ("MALLOC_CONF", self.conf), ("dump folder", self.dump_dir)):
            # A newline would start a directive of its own (ExecStartPre=…): never written.
            if any(ord(c) < 32 or ord(c) == 127 for c in value):
                raise UsageError(f"{value!r}: the {what} for a systemd drop-in must not contain "
                                 "control characters (a newline would add a unit directive)")
        if any(c.isspace() or c in "\"'\\" for c in self.dump_dir):
            raise UsageError(f"{self.dump_dir!r}: a dump folder for systemd must not contain "
                             "spaces, quotes or backslashes")
        lines = [f"{MARKER}; remove with: heapscope env --systemd {self.unit} --remove",
                 "[Service]"]
        if self.preload is not None:
            lines.append(_environment("LD_PRELOAD", self.preload, quote=False))
        lines.append(_environment(self.conf_var, self.conf, quote=True))
        # "-": a dump folder that does not exist (yet) must not stop the service from starting.
        lines.append(f"ReadWritePaths=-{_escape(self.dump_dir)}")
        return "\n".join(lines) + "\n"


# --- who the service runs as ---------------------------------------------------------------

# A user or group name as useradd and systemd accept it (plus "@" for directory users), or a
# numeric id. It is printed into a shell command and compared, never written into the unit.
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.@-]*\$?|[0-9]+")
_MAX_USER = 256
_SYSTEMCTL_TIMEOUT = 5.0
_YES = ("yes", "true", "on", "1")


@dataclass(frozen=True)
class ServiceUser:
    """The user (and group) a service runs as: who owns its dump folder."""

    name: str
    uid: int
    gid: int
    group: str


def check_user_name(name: str, what: str = "--user") -> None:
    """Raise UsageError unless ``name`` is a plausible user or group name (or number)."""
    if (not name or len(name) > _MAX_USER or any(ord(c) < 32 or ord(c) == 127 for c in name)
            or _USER_NAME.fullmatch(name) is None):
        raise UsageError(f"{what} {name!r}: not a valid user name")


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def user_name(uid: int) -> str:
    """A user's name (``uid N`` when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def lookup_user(name: str, group: str | None = None, *, what: str = "--user") -> ServiceUser:
    """Resolve a user name (or uid) and optionally a group (else the user's primary group).

    Raises UsageError naming a user or group this host does not know.
    """
    check_user_name(name, what)
    try:
        pw = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, OverflowError):
        raise UsageError(f"{what} {name}: no such user on this host") from None
    if not group:
        return ServiceUser(pw.pw_name, pw.pw_uid, pw.pw_gid, _group_name(pw.pw_gid))
    check_user_name(group, "Group=")
    try:
        gr = grp.getgrgid(int(group)) if group.isdigit() else grp.getgrnam(group)
    except (KeyError, OverflowError):
        raise UsageError(f"Group={group}: no such group on this host") from None
    return ServiceUser(pw.pw_name, pw.pw_uid, gr.gr_gid, gr.gr_name)


def query_unit(unit: str) -> dict[str, str] | None:
    """``systemctl show UNIT -p User -p Group -p DynamicUser -p LoadState`` as a dict.

    None when systemctl is missing, fails (no systemd running) or does not answer in time.
    """
    exe = shutil.which("systemctl")
    if exe is None:
        return None
    cmd = [exe, "--no-pager", "show", unit, "-p", "User", "-p", "Group", "-p", "DynamicUser",
           "-p", "LoadState"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                           stdin=subprocess.DEVNULL, timeout=_SYSTEMCTL_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    props: dict[str, str] = {}
    for line in p.stdout.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            props[key.strip()] = value.strip()
    return props


def _root() -> ServiceUser:
    try:
        return lookup_user("0", what="root")
    except UsageError:  # no passwd entry for uid 0 (a minimal container)
        return ServiceUser("root", 0, 0, "root")


def service_user(unit: str, user: str | None, *,
                 existing_dir: bool = False) -> tuple[ServiceUser | None, str | None]:
    """Who should own the dump folder of ``unit``, and a note to print (or None).

    ``user`` (``--user``) wins; otherwise systemd is asked. A service systemd cannot tell us
    about is taken to run as root, and the note says so. With ``DynamicUser=yes`` no user
    can own the folder in advance: that is a UsageError, unless ``existing_dir`` (the user
    named a folder that exists, which is then used as it is): the user is then None.
    """
    if user is not None:
        return lookup_user(user), None
    props = query_unit(unit)
    if props is None:
        return _root(), (f"could not ask systemd who {unit} runs as; the dump folder is "
                         "root's: pass --user NAME if the service has User=")
    if props.get("LoadState") == "not-found":
        return _root(), (f"systemd does not know {unit} (yet); the dump folder is root's: "
                         "pass --user NAME if the service will have User=")
    if props.get("DynamicUser", "").lower() in _YES:
        if existing_dir:
            return None, (f"{unit} has DynamicUser=yes: the folder is used as it is; the "
                          "service's user must be able to write there")
        raise UsageError(
            f"{unit} has DynamicUser=yes: systemd chooses its user id at each start, so no "
            "user can own a dump folder made now; pass --user NAME if its user is in fact "
            "fixed, or --dir naming an existing folder the service can write (e.g. under its "
            "StateDirectory=, /var/lib/private/NAME)")
    name = props.get("User", "")
    if not name:
        return _root(), None
    return lookup_user(name, props.get("Group") or None, what="User="), None


# --- the dump folder -----------------------------------------------------------------------

@dataclass(frozen=True)
class DumpDir:
    """The dump folder as heapscope found or made it."""

    path: str
    created: bool
    uid: int
    mode: int  # permission bits (with setuid/setgid/sticky)


def dump_dir_warnings(d: DumpDir, owner: ServiceUser | None) -> list[str]:
    """Why an existing dump folder is unsafe (other users could plant or read dumps)."""
    out = []
    fresh = "heapscope leaves it as it is: use a fresh --dir"
    if d.mode & 0o022:
        out.append(f"WARNING: {d.path} is writable by other users (mode {d.mode:04o}): they "
                   f"could plant or read dumps there; {fresh}")
    # With a DynamicUser (owner None) the service's own uid is not known, so only the mode
    # can be judged.
    if owner is not None and d.uid not in (0, owner.uid):
        allowed = "root" if owner.uid == 0 else f"root or {owner.name}"
        out.append(f"WARNING: {d.path} is owned by {user_name(d.uid)}, not {allowed}: that "
                   f"user could plant or read dumps there; {fresh}")
    return out


def peek_dump_dir(path: str) -> DumpDir | str | None:
    """The dump folder as it is now without changing it: None if absent, a reason string if
    it is a symlink or not a folder."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return e.strerror or str(e)
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return "exists and is not a folder"
    return DumpDir(path, False, st.st_uid, stat.S_IMODE(st.st_mode))


def _make_parents(path: str) -> None:
    """Create ``path`` and its missing parents, mode 0755 (``mkdir -p``)."""
    missing: list[str] = []
    p = path
    while not os.path.isdir(p):
        missing.append(p)
        up = os.path.dirname(p)
        if up == p:
            break
        p = up
    for d in reversed(missing):
        try:
            os.mkdir(d, 0o755)
        except FileExistsError:
            if not os.path.isdir(d):
                raise InputError(d, "exists and is not a folder") from None


def make_dump_dir(path: str, owner: ServiceUser | None) -> DumpDir:
    """Create the dump folder for ``owner``: mode 0700, owned by that user and group.

    An existing folder is never changed (see :func:`dump_dir_warnings`); a symlink or a
    non-folder there is an InputError. ``owner`` None (a DynamicUser service) only accepts an
    existing folder.
    """
    parent, name = os.path.split(os.path.abspath(path))
    try:
        _make_parents(parent)
        # Through the parent's descriptor, so the folder made is the folder opened.
        pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise InputError(parent, _reason(e, "run as root")) from None
    try:
        created = False
        if owner is not None:
            try:
                os.mkdir(name, 0o700, dir_fd=pfd)
                created = True
            except FileExistsError:
                pass
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=pfd)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                what = peek_dump_dir(path)
                why = what if isinstance(what, str) else "is not a folder"
                raise InputError(path, f"{why}; give a real folder with --dir") from None
            if isinstance(e, FileNotFoundError) and owner is None:
                raise InputError(path, "does not exist (a DynamicUser service needs a folder "
                                       "it can already write)") from None
            raise
        try:
            st = os.fstat(fd)
            if created:
                if st.st_uid != os.geteuid():
                    raise InputError(path, "was replaced while heapscope created it; not "
                                           "touching it")
                # On the descriptor, never by path: a path can be swapped for a link meanwhile.
                assert owner is not None
                os.fchown(fd, owner.uid, owner.gid)
                os.fchmod(fd, 0o700)
                return DumpDir(path, True, owner.uid, 0o700)
            return DumpDir(path, False, st.st_uid, stat.S_IMODE(st.st_mode))
        finally:
            os.close(fd)
    except OSError as e:
        raise InputError(path, _reason(e, "run as root")) from None
    finally:
        os.close(pfd)


# --- the drop-in ---------------------------------------------------------------------------

_NOFOLLOW_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_MAX_DROPIN = 1 << 20


def _read_ours(fd: int) -> str | None:
    """The text of the open file ``fd`` if it is a regular file that starts with the marker."""
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        return None
    with os.fdopen(os.dup(fd), "rb") as f:
        raw = f.read(_MAX_DROPIN)
    text = raw.decode("utf-8", errors="replace")
    return text if text.startswith(MARKER) else None


def is_ours(path: Path) -> bool:
    """True if ``path`` is a regular file (not a link) whose first line is heapscope's marker."""
    try:
        fd = os.open(path, _NOFOLLOW_READ)
    except OSError:
        return False
    try:
        return _read_ours(fd) is not None
    except OSError:
        return False
    finally:
        os.close(fd)


def _open_dropin_dir(folder: Path, *, create: bool) -> int | None:
    """A descriptor of the ``UNIT.service.d`` folder, made (0755) if missing and ``create``;
    None if missing otherwise.

    Refuses (InputError) a symlink, a non-folder, and a folder another user could change:
    owned by someone other than root or the caller, or writable by group or others.
    """
    if create:
        try:
            _make_parents(str(folder.parent))
            os.mkdir(folder, 0o755)
        except FileExistsError:
            pass
        except OSError as e:
            raise InputError(str(folder), _reason(e)) from None
    try:
        dfd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        if create:
            raise InputError(str(folder), "vanished while heapscope created it") from None
        return None
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):
            what = "is a symbolic link" if os.path.islink(folder) else "is not a folder"
            raise InputError(str(folder), f"{what}; not touching it") from None
        raise InputError(str(folder), _reason(e)) from None
    try:
        st = os.fstat(dfd)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, os.geteuid()):
            raise InputError(str(folder), f"is owned by {user_name(st.st_uid)}, not root or "
                                          "you: that user could swap the drop-in; not "
                                          "touching it")
        if mode & 0o022:
            raise InputError(str(folder), f"is writable by other users (mode {mode:04o}): "
                                          "they could swap the drop-in; not touching it")
    except BaseException:
        os.close(dfd)
        raise
    return dfd


def _current(dfd: int, path: Path) -> str | None:
    """Our drop-in's text in the folder ``dfd``; None if absent. InputError if something
    else is there (a link, a folder, a file heapscope did not write)."""
    try:
        fd = os.open(path.name, _NOFOLLOW_READ, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise InputError(str(path), "is a symbolic link; not touching it") from None
        raise InputError(str(path), _reason(e)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(str(path), "exists and is not a regular file; not touching it")
        text = _read_ours(fd)
    except OSError as e:
        raise InputError(str(path), _reason(e)) from None
    finally:
        os.close(fd)
    if text is None:
        raise InputError(str(path), "exists and was not written by heapscope; not touching it")
    return text


def check_replaceable(path: Path) -> None:
    """Raise InputError unless ``path`` is absent or a drop-in heapscope wrote, in a folder
    no other user can change."""
    dfd = _open_dropin_dir(path.parent, create=False)
    if dfd is None:
        return
    try:
        _current(dfd, path)
    finally:
        os.close(dfd)


def _write_temp(dfd: int, folder: Path, text: str) -> str:
    """A new file in the folder ``dfd`` holding ``text``, mode 0644, on disk; its name."""
    # A random name, created exclusively and never through a link. It does not end in
    # ".conf", so systemd ignores it should it ever be left behind.
    for _ in range(100):
        tmp = f".heapscope-{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise InputError(str(folder), _reason(e)) from None
    else:
        raise InputError(str(folder), "could not create a temporary file")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # whatever the umask
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        if isinstance(e, OSError):
            raise InputError(str(folder), _reason(e)) from None
        raise
    return tmp


def write_dropin(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` atomically, mode 0644; True if it replaced our older one.

    Everything happens relative to the ``.d`` folder's descriptor, under an exclusive lock
    on it, and never through a symlink. Refuses (InputError) to replace a file that heapscope
    did not write, or one that appears while it writes.
    """
    dfd = _open_dropin_dir(path.parent, create=True)
    assert dfd is not None
    try:
        tmp = _write_temp(dfd, path.parent, text)
        try:
            fcntl.flock(dfd, fcntl.LOCK_EX)  # two heapscopes at once: one after the other
            if _current(dfd, path) is None:
                try:
                    # link fails if the name exists: nothing appearing meanwhile is replaced.
                    os.link(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd,
                            follow_symlinks=False)
                except FileExistsError:
                    raise InputError(str(path), "appeared while heapscope was writing it; not "
                                                "touching it") from None
                os.unlink(tmp, dir_fd=dfd)
                return False
            os.replace(tmp, path.name, src_dir_fd=dfd, dst_dir_fd=dfd)
            return True
        except BaseException as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if isinstance(e, OSError):
                raise InputError(str(path), _reason(e)) from None
            raise
    finally:
        os.close(dfd)  # also releases the lock


def dump_dir_of(text: str) -> str | None:
    """The dump folder named by a drop-in's ``ReadWritePaths=-`` line, if any."""
    for line in text.splitlines():
        if line.startswith("ReadWritePaths=-"):
            return line.removeprefix("ReadWritePaths=-").replace("%%", "%")
    return None


def read_dump_dir(path: Path) -> str | None:
    """The dump folder named by our drop-in's ``ReadWritePaths=-`` line, if any."""
    try:
        fd = os.open(path, _NOFOLLOW_READ)
    except OSError:
        return None
    try:
        text = _read_ours(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if text is None else dump_dir_of(text)


def take_dropin(path: Path) -> str | None:
    """Delete heapscope's drop-in at ``path`` and return its text; None if there is none.

    Refuses (InputError) when something else is there. Deletes nothing else: not the ``.d``
    folder, not the dumps.
    """
    dfd = _open_dropin_dir(path.parent, create=False)
    if dfd is None:
        return None
    try:
        fcntl.flock(dfd, fcntl.LOCK_EX)
        text = _current(dfd, path)
        if text is not None:
            os.unlink(path.name, dir_fd=dfd)
        return text
    except OSError as e:
        raise InputError(str(path), _reason(e)) from None
    finally:
        os.close(dfd)


def remove_dropin(path: Path) -> bool:
    """Delete heapscope's drop-in at ``path``; False if there is none (see
    :func:`take_dropin`)."""
    return take_dropin(path) is not None


def _reason(e: OSError, hint: str = "run as root, or use --systemd-dir") -> str:
    reason = e.strerror or str(e)
    if isinstance(e, PermissionError):
        reason += f" ({hint})"
    return reason
