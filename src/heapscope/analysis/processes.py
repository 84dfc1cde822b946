"""Which part each process plays in a run: the program, a wrapper in front of it, a child, or
one of the many small helper processes that scripts and version-manager shims start."""

from __future__ import annotations

import os

# Programs that start other programs: as the launched process they are a "wrapper".
WRAPPERS = frozenset("sh bash dash zsh ksh mksh busybox env runuser su sudo setpriv timeout "
                     "nice ionice stdbuf taskset chrt nohup time xargs make".split())
# Shells and small tools that scripts and shims (pyenv, rbenv, nvm) run by the dozen: they
# rarely free memory before exiting, and must not drown the program's report.
HELPERS = WRAPPERS | frozenset(
    "readlink realpath basename dirname cat sed grep egrep awk gawk mawk cut tr head tail sort "
    "uniq wc tee find ls cp mv rm mkdir rmdir ln chmod chown touch date uname id whoami "
    "hostname expr test [ true false sleep which printf echo seq mktemp stat getconf "
    "ldconfig locale tput".split())
QUIET_ROLES = ("wrapper", "helper")


def role(pid: int, exe: str, root: int | None, processes: int) -> str:
    """``main``, ``wrapper``, ``child`` or ``helper`` for one process of a run."""
    name = os.path.basename(exe)
    if root is None:
        return "helper" if name in HELPERS and processes > 1 else "main" \
            if processes == 1 else "process"
    if pid == root:
        return "wrapper" if name in WRAPPERS and processes > 1 else "main"
    return "helper" if name in HELPERS else "child"
