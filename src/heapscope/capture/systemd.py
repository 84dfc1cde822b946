"""A systemd drop-in that runs a service under jemalloc's heap profiler.

``heapscope env --systemd UNIT`` writes ``<systemd dir>/UNIT.service.d/heapscope.conf``. The
file's first line is a marker; heapscope only ever replaces or deletes a file carrying it, so a
drop-in written by hand (or by another tool) under the same name is never touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
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


def is_ours(path: Path) -> bool:
    """True if ``path`` is a regular file whose first line is heapscope's marker."""
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            first = f.readline()
    except OSError:
        return False
    return first.startswith(MARKER)


def check_replaceable(path: Path) -> None:
    """Raise InputError unless ``path`` is absent or a drop-in heapscope wrote."""
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_file():
        raise InputError(str(path), "exists and is not a regular file; not touching it")
    if not is_ours(path):
        raise InputError(str(path), "exists and was not written by heapscope; not touching it")


def write_dropin(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (temporary file + rename), mode 0644.

    Refuses to replace a file that heapscope did not write.
    """
    check_replaceable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".heapscope-", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise InputError(str(path.parent), _reason(e)) from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        # Checked again right before the rename, in case someone wrote the file meanwhile.
        check_replaceable(path)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(e, OSError):
            raise InputError(str(path), _reason(e)) from None
        raise


def make_dump_dir(path: str) -> bool:
    """Create the dump folder with mode 1777 (any service user can write, like /tmp).

    An existing folder is left as it is (its mode is the owner's choice). Returns True if the
    folder was created.
    """
    p = Path(path)
    if p.is_dir():
        return False
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.mkdir()
        os.chmod(p, 0o1777)
    except FileExistsError:
        if p.is_dir():
            return False
        raise InputError(path, "exists and is not a folder") from None
    except OSError as e:
        raise InputError(path, _reason(e)) from None
    return True


def read_dump_dir(path: Path) -> str | None:
    """The dump folder named by our drop-in's ``ReadWritePaths=-`` line, if any."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("ReadWritePaths=-"):
            return line.removeprefix("ReadWritePaths=-").replace("%%", "%")
    return None


def remove_dropin(path: Path) -> bool:
    """Delete heapscope's drop-in at ``path``; False if there is none.

    Refuses (InputError) when the file exists but is not ours. Deletes nothing else: not the
    ``.d`` folder, not the dumps.
    """
    if not os.path.lexists(path):
        return False
    check_replaceable(path)
    try:
        path.unlink()
    except OSError as e:
        raise InputError(str(path), _reason(e)) from None
    return True


def _reason(e: OSError) -> str:
    reason = e.strerror or str(e)
    if isinstance(e, PermissionError):
        reason += " (run as root, or use --systemd-dir)"
    return reason
