"""``heapscope env``: print (or install) the settings that run a program under jemalloc profiling.

Three forms: shell lines to paste (``export LD_PRELOAD=… MALLOC_CONF=…``), a ``java`` command
prefix that also writes the JIT perf map, and a systemd drop-in for a service (printed, or
written with ``--install`` and deleted with ``--remove``). Nothing here starts, stops or reloads
anything: the commands that do are printed for the user to run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from heapscope.capture import systemd
from heapscope.cli.commands import summary
from heapscope.errors import UsageError
from heapscope.units import human_bytes

DEFAULT_DIR = "./heapscope-dumps"
JAVA_FLAGS = "-XX:+UnlockDiagnosticVMOptions -XX:+DumpPerfMapAtExit"
RJEM_PREFIX = "_rjem_"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``env`` subcommand."""
    p = sub.add_parser(
        "env", help=summary("env"),
        description="Print the LD_PRELOAD and MALLOC_CONF settings that run a program under "
                    "jemalloc's heap profiler (shell lines, a java command prefix, or a systemd "
                    "drop-in for a service).")
    p.add_argument("--dir", metavar="DIR",
                   help=f"folder for the dumps (default {DEFAULT_DIR}; with --systemd "
                        f"{systemd.DUMP_ROOT}/UNIT)")
    p.add_argument("--sample", metavar="BYTES",
                   help="mean bytes between samples, a power of two (default 512k)")
    p.add_argument("--interval", metavar="BYTES",
                   help="also dump every BYTES allocated (e.g. 1G)")
    p.add_argument("--gdump", action="store_true", help="also dump at each new memory peak")
    p.add_argument("--accum", action="store_true",
                   help="keep allocation totals (for --alloc-space / --alloc-objects)")
    p.add_argument("--conf", metavar="RAW", default="",
                   help="more MALLOC_CONF options, appended as given (e.g. stats_print:true)")
    p.add_argument("--jemalloc", metavar="PATH", help="the libjemalloc.so to preload")
    p.add_argument("--prefixed", action="store_true",
                   help="the program links tikv-jemallocator's _rjem_ jemalloc itself: "
                        "set _RJEM_MALLOC_CONF, preload nothing")
    p.add_argument("--java", action="store_true",
                   help="print a java command prefix that also writes the JIT perf map")
    g = p.add_argument_group("systemd")
    g.add_argument("--systemd", metavar="UNIT", help="a drop-in for this service")
    act = g.add_mutually_exclusive_group()
    act.add_argument("--install", action="store_true",
                     help="write the drop-in and create the dump folder (needs root)")
    act.add_argument("--remove", action="store_true",
                     help="delete the drop-in heapscope wrote (the dumps stay)")
    g.add_argument("--systemd-dir", metavar="DIR", default=None,
                   help=f"where unit drop-ins live (default {systemd.SYSTEMD_DIR})")
    g.add_argument("--user", metavar="NAME", default=None,
                   help="the user the service runs as, who alone owns the dump folder (mode "
                        "0700); default: its User= from systemctl show, or root")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Settings:
    """What to set: the library to preload (None when linked in), the variable, its value."""

    preload: str | None
    var: str
    conf: str
    dump_dir: str


def _check_args(args: argparse.Namespace) -> None:
    if args.systemd is None:
        for flag, given in (("--install", args.install), ("--remove", args.remove),
                            ("--systemd-dir", args.systemd_dir is not None),
                            ("--user", args.user is not None)):
            if given:
                raise UsageError(f"{flag} needs --systemd UNIT")
    if args.user is not None:
        systemd.check_user_name(args.user)
    if args.java and args.systemd is not None:
        raise UsageError(f"--java does not combine with --systemd; add {JAVA_FLAGS} to the "
                         "service's java command line yourself")
    if args.java and args.prefixed:
        raise UsageError("--prefixed is for programs that link jemalloc themselves, not java")
    if args.prefixed and args.jemalloc:
        raise UsageError("--prefixed preloads nothing, so --jemalloc would not be used")


def _dump_dir(args: argparse.Namespace, unit: str | None) -> str:
    path: str
    if args.dir:
        path = str(args.dir)
    elif unit:
        path = systemd.default_dump_dir(unit)
    else:
        path = DEFAULT_DIR
    path = os.path.abspath(os.path.expanduser(path))
    if "," in path:
        # jemalloc splits MALLOC_CONF at commas; prof_prefix cannot hold one.
        raise UsageError(f"{path}: the dump folder cannot contain a comma (MALLOC_CONF "
                         "separates options with commas)")
    return path


def _size(text: str | None, option: str) -> int | None:
    from heapscope.capture.conf import lg2
    from heapscope.units import parse_size

    if text is None:
        return None
    n = parse_size(text, option)
    if n & (n - 1):
        rounded = 1 << lg2(n)
        print(f"heapscope: note: {option} {text} is rounded to 2^{lg2(n)} = "
              f"{human_bytes(rounded)} "
              "(jemalloc takes powers of two)", file=sys.stderr)
    return n


def settings(args: argparse.Namespace, dump_dir: str) -> Settings:
    """Find the library and build the MALLOC_CONF value the arguments ask for."""
    from heapscope.capture.conf import build_conf, env_var
    from heapscope.capture.jemalloc import find_jemalloc

    sample = _size(args.sample, "--sample")
    interval = _size(args.interval, "--interval")
    conf = build_conf(os.path.join(dump_dir, "jeprof"), sample=sample, interval=interval,
                      gdump=args.gdump, accum=args.accum, extra=args.conf)
    if args.prefixed:
        return Settings(None, env_var(RJEM_PREFIX), conf, dump_dir)
    lib = find_jemalloc(args.jemalloc)
    if lib.prefix:
        raise UsageError(f"{lib.path} is a {lib.prefix}-prefixed jemalloc: preloading it "
                         "replaces no malloc; for a program that links it, use --prefixed")
    return Settings(lib.path, env_var(""), conf, dump_dir)


def _when(args: argparse.Namespace) -> str:
    """When dumps are written, for the comments."""
    when = []
    if args.interval:
        when.append(f"every {args.interval} allocated")
    if args.gdump:
        when.append("at each new memory peak")
    when.append("when it exits normally (exit() or return from main; a kill by a signal "
                "writes no final dump)")
    return (", ".join(when[:-1]) + " and " if len(when) > 1 else "") + when[-1]


def _top_hint(dump_dir: str) -> str:
    return f"heapscope top {shlex.quote(dump_dir)}"


def shell_lines(s: Settings, args: argparse.Namespace) -> list[str]:
    """The default form: lines to paste into a shell (or ``eval "$(heapscope env)"``)."""
    names = ([] if s.preload is None else ["LD_PRELOAD"]) + [s.var]
    who = ("programs from this shell that link tikv-jemallocator's _rjem_ jemalloc "
           "(with its \"profiling\" feature)"
           if s.preload is None else "programs started from this shell")
    lines = [f"# heapscope env: heap profiling with jemalloc for {who}.",
             f"# It lasts until: unset {' '.join(names)}",
             f"mkdir -p {shlex.quote(s.dump_dir)}"]
    if s.preload is not None:
        lines.append(f"export LD_PRELOAD={shlex.quote(s.preload)}")
    lines += [f"export {s.var}={shlex.quote(s.conf)}",
              f"# Start the program; it writes {s.dump_dir}/jeprof.<pid>.*.heap {_when(args)}.",
              f"# Once dumps exist (and after the unset): {_top_hint(s.dump_dir)}"]
    return lines


def java_lines(s: Settings, args: argparse.Namespace) -> list[str]:
    """A java command prefix: jemalloc for the JVM's native heap plus the JIT perf map."""
    assert s.preload is not None
    return [
        "# heapscope env --java: heap profiling with jemalloc for a JVM (JDK 17+).",
        "# Put this before your java arguments (-jar app.jar …):",
        f"mkdir -p {shlex.quote(s.dump_dir)}",
        f"LD_PRELOAD={shlex.quote(s.preload)} {s.var}={shlex.quote(s.conf)} java {JAVA_FLAGS}",
        f"# It writes {s.dump_dir}/jeprof.<pid>.*.heap {_when(args)}.",
        "# At exit the JVM writes /tmp/perf-<pid>.map (names of JIT-compiled code); heapscope "
        "reads it from /tmp or from next to the dumps (copy it there to read them elsewhere).",
        f"# Once dumps exist: {_top_hint(s.dump_dir)}",
    ]


def _apply_lines(unit: str) -> list[str]:
    q = shlex.quote(unit)
    return ["systemctl daemon-reload", f"systemctl restart {q}"]


def _after_lines(unit: str, dump_dir: str) -> list[str]:
    return [f"# Check: systemctl show -p Environment {shlex.quote(unit)}",
            "# The final dump is written when the service stops and its process exits normally;",
            f"# once dumps exist: {_top_hint(dump_dir)}",
            f"# To undo: heapscope env --systemd {shlex.quote(unit)} --remove"]


def _note_lines(note: str | None) -> list[str]:
    return [] if note is None else [f"# heapscope: {note}"]


def _make_dir_line(dump_dir: str, owner: systemd.ServiceUser | None) -> str:
    d = shlex.quote(dump_dir)
    if owner is None:
        return f"# {dump_dir} exists and is used as it is"
    return (f"install -d -m 0700 -o {shlex.quote(owner.name)} -g {shlex.quote(owner.group)} "
            f"{d}")


def systemd_preview(unit: str, target: Path, dropin: systemd.DropIn,
                    owner: systemd.ServiceUser | None, note: str | None = None) -> list[str]:
    """The drop-in and every step, as shell lines (what --install would do, plus the rest)."""
    text = dropin.text()
    lines = [f"# heapscope env --systemd: heap profiling with jemalloc for {unit}.",
             *_note_lines(note)]
    found = systemd.peek_dump_dir(dropin.dump_dir)
    if isinstance(found, str):
        lines.append(f"# heapscope: WARNING: {dropin.dump_dir} {found}: --install refuses it; "
                     "give a real folder with --dir")
    elif found is not None:
        lines += [f"# heapscope: {w}" for w in systemd.dump_dir_warnings(found, owner)]
    return [*lines,
            "# Run this command again with --install (as root) to do the first three steps; "
            "by hand:",
            _make_dir_line(dropin.dump_dir, owner),
            f"mkdir -p {shlex.quote(str(target.parent))}",
            f"cat > {shlex.quote(str(target))} <<'EOF'",
            *text.splitlines(),
            "EOF",
            *_apply_lines(unit),
            *_after_lines(unit, dropin.dump_dir)]


def _dump_dir_lines(d: systemd.DumpDir, owner: systemd.ServiceUser | None) -> list[str]:
    if d.created:
        assert owner is not None
        return [f"# heapscope: created {d.path} (mode 0700, owner {owner.name}) for the dumps"]
    who = systemd.user_name(d.uid)
    if owner is not None and d.uid == owner.uid:
        lines = [f"# heapscope: dumps go to {d.path} (it exists, owned by {who}, mode "
                 f"{d.mode:04o}; left as it is)"]
    else:
        service = "the service's user" if owner is None else f"the service's user {owner.name}"
        lines = [f"# heapscope: dumps go to {d.path} (it exists, owned by {who}, mode "
                 f"{d.mode:04o}: {service} must be able to write there)"]
    return lines + [f"# heapscope: {w}" for w in systemd.dump_dir_warnings(d, owner)]


def install(unit: str, target: Path, dropin: systemd.DropIn,
            owner: systemd.ServiceUser | None, note: str | None = None) -> list[str]:
    """Write the drop-in and create the dump folder; return what to print."""
    text = dropin.text()
    systemd.check_replaceable(target)  # refuse before changing anything
    made = systemd.make_dump_dir(dropin.dump_dir, owner)
    replaced = systemd.write_dropin(target, text)
    return [*_note_lines(note),
            f"# heapscope: {'updated' if replaced else 'wrote'} {target}",
            *_dump_dir_lines(made, owner),
            "# Apply it (heapscope restarts nothing itself):", *_apply_lines(unit),
            *_after_lines(unit, dropin.dump_dir)]


def remove(unit: str, target: Path) -> list[str]:
    """Delete our drop-in (only ours); return what to print."""
    text = systemd.take_dropin(target)
    if text is None:
        return [f"# heapscope: no drop-in at {target}; nothing to remove"]
    dump_dir = systemd.dump_dir_of(text)
    lines = [f"# heapscope: removed {target}"]
    if dump_dir:
        lines.append(f"# The dumps stay in {dump_dir} (delete them yourself when done).")
    lines += ["# Apply it:", *_apply_lines(unit)]
    return lines


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope env``."""
    _check_args(args)
    unit = None if args.systemd is None else systemd.normalize_unit(args.systemd)
    if unit is not None:
        target = systemd.dropin_path(unit, args.systemd_dir or systemd.SYSTEMD_DIR)
        if args.remove:
            lines = remove(unit, target)
        else:
            s = settings(args, _dump_dir(args, unit))
            dropin = systemd.DropIn(unit, s.preload, s.var, s.conf, s.dump_dir)
            dropin.text()  # refuses control characters before systemd is asked anything
            existing = bool(args.dir) and os.path.isdir(s.dump_dir)
            owner, note = systemd.service_user(unit, args.user, existing_dir=existing)
            if args.install:
                lines = install(unit, target, dropin, owner, note)
            else:
                lines = systemd_preview(unit, target, dropin, owner, note)
    else:
        s = settings(args, _dump_dir(args, None))
        lines = java_lines(s, args) if args.java else shell_lines(s, args)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0
