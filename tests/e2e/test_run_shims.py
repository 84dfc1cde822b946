"""``heapscope run`` through an interpreter shim: the shim's shells and tools are quiet.

pyenv, rbenv, nvm and asdf put a bash script named like the program (``shims/python3``) in
front of it; the script sets variables, asks helper scripts in subshells which version to run
and ``exec``s the real program. Every subshell is a bash process that exits with its start-up
allocations live (``hash_create``, ``initialize_shell_variables``): none of that is a lead.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e

# What the shim does, after pyenv's own shims and libexec/pyenv-exec: variables, a shell
# function or two, subshells running helpers and another bash script, then exec.
SHIM = """#!/usr/bin/env bash
set -e
[ -n "$SHIM_DEBUG" ] && set -x
program="${0##*/}"
export SHIM_ROOT="$(cd "$(dirname "$0")/.." && pwd)"
set_default_locale() { export LC_ALL="${LC_ALL:-C}"; }
echo_builtin() { echo "$@"; }
set_default_locale
name="$(echo_builtin "$program" | tr -d '\\n')"
real="$(bash "$SHIM_ROOT/libexec/which" "$SHIM_ROOT" "$name")"
exec "$real" "$@"
"""
WHICH = """#!/usr/bin/env bash
set -e
version="$(cat "$1/version")"
echo "$1/versions/$version/bin/$2"
"""
SHELLS = {"bash", "sh", "dash", "env"}
# Verdicts a report does not list among its suspects (written out here, not imported).
NOT_LISTED = {"steady", "expected", "inherited", "suppressed", "helper"}


def test_shim_shells_are_quiet_and_never_suspects(libjemalloc: Path, gcc: Path,
                                                  tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    root = tmp_path / "shimroot"
    for sub in ("shims", "libexec", "versions/1/bin"):
        (root / sub).mkdir(parents=True)
    je.build([je.PROGRAMS_DIR / "slow_leak.c"], root / "versions/1/bin/slow_leak",
             ["-O1", "-g"], compiler=gcc)
    (root / "version").write_text("1\n")
    for path, text in ((root / "shims/slow_leak", SHIM), (root / "libexec/which", WHICH)):
        path.write_text(text)
        path.chmod(0o755)
    s = tmp_path / "s"

    p = je.run_heapscope("run", "-o", str(s), "--", str(root / "shims/slow_leak"),
                         cache=tmp_path / "c", timeout=180)

    assert p.returncode == 0, p.stderr
    r = json.loads((s / "report.json").read_text())
    procs = {x["pid"]: x for x in r["processes"]}
    main = [x for x in r["processes"] if x["role"] == "main"]
    assert [os.path.basename(x["exe"]) for x in main] == ["slow_leak"]
    shells = [x for x in r["processes"] if os.path.basename(x["exe"]) in SHELLS]
    assert len(shells) >= 2  # the subshells and the helper script, at least
    assert all(x["role"] in ("wrapper", "helper") for x in shells), shells
    listed = [x for x in r["suspects"] if x["verdict"] not in NOT_LISTED]
    assert listed[0]["function"] == "slow_leak"
    assert all(procs[x["pid"]]["role"] == "main" for x in listed), listed
    # The shells' sites are kept (JSON lists them) under their own verdict.
    assert any(x["verdict"] == "helper" and x["pid"] in {y["pid"] for y in shells}
               for x in r["suspects"])
    # One dump judges no growth: the list is of live sites, not of suspects.
    assert "suspects" not in p.stderr
    text = p.stderr.split("largest live sites (no leak found)", 1)[1].split("not shown:")[0]
    for bash_function in ("hash_create", "initialize_shell_variables", "xmalloc",
                          "echo_builtin", "set_default_locale"):
        assert bash_function not in text, text
    assert f"processes (1 of the program, {len(procs) - 1} wrappers and helpers" in p.stderr
    assert "1 live in a single dump" in p.stderr
