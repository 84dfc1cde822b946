"""Who writes a session's dumps: the user the profiled program runs as.

jemalloc writes each dump from inside the program, as the program's user. A server started
by root often drops to its own user (``runuser -u postgres -- postgres …``, a service's
``User=``); that user, and only that user, then needs to write the session's ``dumps/``
folder. Giving everyone write access (mode 1777, like ``/tmp``) would let any local user plant
files there, so the folder is handed to exactly one user instead.
"""

from __future__ import annotations

import grp
import os
import pwd
from typing import NamedTuple

from heapscope.errors import UsageError


# A NamedTuple, not a dataclass: `heapscope top` must not import dataclasses (start-up time).
class DumpOwner(NamedTuple):
    """The user that owns a ``dumps/`` folder (and so can write dumps into it)."""

    uid: int
    gid: int
    name: str

    def as_dict(self) -> dict[str, object]:
        """For the manifest."""
        return {"uid": self.uid, "gid": self.gid, "name": self.name}


def caller() -> DumpOwner:
    """The user heapscope runs as."""
    uid, gid = os.geteuid(), os.getegid()
    return DumpOwner(uid, gid, user_name(uid))


def user_name(uid: int) -> str:
    """A user's name (its number when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def resolve(user: str) -> DumpOwner:
    """A user name or numeric uid as a :class:`DumpOwner` (its primary group)."""
    if not user or any(ord(c) < 32 or ord(c) == 127 for c in user):
        raise UsageError(f"{user!r} is not a user name")
    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, OverflowError):
        raise UsageError(f"{user}: no such user on this host") from None
    return DumpOwner(entry.pw_uid, entry.pw_gid, entry.pw_name)


def group_name(gid: int) -> str:
    """A group's name (its number when it has none)."""
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _after(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the first of ``flags`` in ``args`` (``-u NAME``, ``--user=NAME``)."""
    for i, a in enumerate(args):
        if a == "--":
            return None
        for f in flags:
            if a == f and i + 1 < len(args):
                return args[i + 1]
            if f.startswith("--") and a.startswith(f + "="):
                return a[len(f) + 1:]
    return None


def user_from_command(cmd: list[str]) -> str | None:
    """The user a command says it switches to, for the common wrappers: ``runuser -u U``,
    ``sudo -u U``, ``setpriv --reuid U``, ``su U``, ``gosu U``, ``su-exec U``,
    ``chpst -u U``. None when the command names no such switch."""
    if not cmd:
        return None
    prog = os.path.basename(cmd[0])
    args = cmd[1:]
    if prog in ("runuser", "sudo"):
        named = _after(args, ("-u", "--user"))
        if named is not None or prog == "sudo":
            return named
        return _first_operand(args, {"-g", "--group", "-G", "--supp-group", "-c", "--command",
                                     "-s", "--shell", "-w", "--whitelist-environment"})
    if prog == "setpriv":
        return _after(args, ("--reuid", "--ruid", "--euid"))
    if prog == "su":
        return _first_operand(args, {"-c", "--command", "-s", "--shell", "-g", "--group",
                                     "-G", "--supp-group", "-w", "--whitelist-environment"})
    if prog in ("gosu", "su-exec"):
        return args[0].split(":", 1)[0] if args else None
    if prog == "chpst":
        named = _after(args, ("-u", "-U"))
        return named.lstrip(":").split(":", 1)[0] if named else None
    return None


def _first_operand(args: list[str], with_value: set[str]) -> str | None:
    """The first argument that is neither an option nor an option's value (``su`` and
    ``runuser``'s USER); ``-`` and ``-l`` are flags."""
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "--":
            continue
        if a in with_value:
            skip = True
            continue
        if a.startswith("-"):
            continue
        return a
    return None


def dump_owner(cmd: list[str], user: str | None) -> DumpOwner:
    """Who should own the dumps of ``cmd``: ``--user`` when given, else the user the
    command switches to (when heapscope runs as root), else the caller."""
    me = caller()
    if user is None and me.uid == 0:
        user = user_from_command(cmd)
    if user is None:
        return me
    owner = resolve(user)
    if owner.uid != me.uid and me.uid != 0:
        raise UsageError(f"--user {user}: only root can hand the dumps folder to another user "
                         f"(heapscope runs as {me.name})")
    return owner
