"""The interactive shell (``heapscope shell DUMP`` or ``heapscope top DUMP -i``).

It speaks jeprof's interactive dialect so the seeds' habits work unchanged: ``top``,
``top30``, ``top --cum``, ``top --lines``, a bare regex to focus and ``-regex`` to ignore, plus
``focus RE``/``ignore RE`` to set them for later commands, the sample types, ``help`` and
``quit``; ``web`` shows the same dumps in the browser (the viewer of ``heapscope serve``, in
a thread, while the prompt stays usable) until ``web stop`` or the shell ends.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from typing import TextIO

from heapscope.analysis.aggregate import GRANULARITIES
from heapscope.analysis.fold import FramePolicy
from heapscope.analysis.top import SAMPLE_INDEX, View, build_diff, build_table
from heapscope.cli.beside import SideViewer, ViewerInputs
from heapscope.cli.commands import summary
from heapscope.cli.common import (
    add_frame_options,
    add_input_options,
    add_symbol_options,
    add_view_options,
    find_dumps,
    frame_policy,
    load_profiles,
    session_aliases,
    symbol_options,
    trusted_uids,
    view_from_args,
)
from heapscope.errors import HeapscopeError, UsageError
from heapscope.model import Profile
from heapscope.render.text import render_diff, render_table
from heapscope.symbols import SymbolOptions
from heapscope.terminal import clean

HELP = """\
Commands:
  top [N] / topN [options] [RE] [-RE]   show the top N rows (default 10)
      options: --cum --lines --functions --files --addresses --show-bytes
               --inuse-space --inuse-objects --alloc-space --alloc-objects
      RE focuses on stacks through a frame matching RE; -RE ignores them
  list RE                 the source lines of each function matching RE, with the memory
                          allocated at each line (flat) and through it (cum)
  focus RE | focus        set (or clear) a focus for the following commands
  ignore RE | ignore      set (or clear) an ignore pattern
  inuse_space | inuse_objects | alloc_space | alloc_objects   switch sample type
  web                     show these dumps in the browser: prints the viewer's URL
  web stop                stop the viewer (leaving the shell stops it too)
  help                    this text
  quit | exit | Ctrl-D    leave
"""

_TOP = re.compile(r"^(?:top|text)(\d*)$")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``shell`` subcommand (same options as ``top``, always interactive)."""
    p = sub.add_parser("shell", help=summary("shell"))
    p.add_argument("dumps", nargs="+", metavar="DUMP",
                   help="jemalloc heap dump (.heap, .heap.gz), a folder of dumps or a session")
    add_view_options(p)
    p.add_argument("--thread", metavar="ID|NAME", help="only what this thread allocated")
    p.add_argument("--base", metavar="DUMP",
                   help="show the change from this base dump (new - base)")
    p.add_argument("--merge", action="store_true", help="work on the sum of several dumps")
    add_frame_options(p)
    add_symbol_options(p)
    add_input_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope shell``: prepare the dumps, then the prompt."""
    from heapscope.progress import DelayedProgress

    paths = find_dumps(args, args.dumps, latest=True)
    if len(paths) > 1 and not args.merge:
        raise UsageError("the shell works on one dump (or several with --merge)")
    with DelayedProgress() as bar:
        profiles = load_profiles(paths, args, bar.update, aliases=session_aliases(args.dumps))
        base = (load_profiles(find_dumps(args, [args.base], latest=True), args, bar.update)
                if args.base else None)
    Shell(profiles, view_from_args(args), base, web=web_inputs(args),
          sysroot=args.sysroot).loop()
    return 0


def web_inputs(args: argparse.Namespace) -> ViewerInputs:
    """What the shell's ``web`` serves: the paths the command named (a session keeps its
    overview and leak report), read with the command's symbol and frame options."""
    paths = [*args.dumps, *([args.base] if getattr(args, "base", None) else [])]
    return ViewerInputs(tuple(paths), symbol_options(args, paths), frame_policy(args),
                        trust_uids=tuple(trusted_uids(args)))


class Shell:
    """A read-eval-print loop over already prepared profiles."""

    def __init__(self, profiles: list[Profile], view: View,
                 base: list[Profile] | None = None,
                 stdin: TextIO | None = None, stdout: TextIO | None = None,
                 web: ViewerInputs | None = None, sysroot: str | None = None) -> None:
        self.profiles = profiles
        self.sysroot = sysroot  # where ``list`` also looks for source files
        self.base = base
        self.view = view._replace(nodecount=10)
        self.stdin = stdin or sys.stdin
        self.stdout = stdout or sys.stdout
        # Without the command's own paths (heapscope top -i), web serves the dump files the
        # profiles were read from, with the default options.
        self.web = web or ViewerInputs(
            tuple(p.source for p in [*profiles, *(base or [])] if p.source),
            SymbolOptions(), FramePolicy.from_env())
        self.viewer: SideViewer | None = None

    def loop(self) -> None:
        """Read commands until quit or end of input; the viewer stops with the shell."""
        try:
            self._loop()
        finally:
            if self.viewer is not None:
                self.viewer.stop()

    def _loop(self) -> None:
        interactive = self.stdin.isatty()
        if interactive:
            self.stdout.write("heapscope shell: type 'help' for commands, 'quit' to leave.\n")
        while True:
            if interactive:
                self.stdout.write("(heapscope) ")
            # Flushed each time: a program reading the answers through a pipe gets them now.
            self.stdout.flush()
            line = self.stdin.readline()
            if not line:
                if interactive:
                    self.stdout.write("\n")
                return
            if not self.execute(line.strip()):
                return

    def execute(self, line: str) -> bool:
        """Run one command; return False when the shell should exit."""
        if not line:
            return True
        try:
            words = shlex.split(line)
        except ValueError as e:
            self.stdout.write(f"error: {clean(str(e))}\n")
            return True
        cmd, rest = words[0], words[1:]
        if cmd in ("quit", "exit", "q"):
            return False
        if cmd in ("help", "?", "h"):
            self.stdout.write(HELP)
            return True
        if cmd in SAMPLE_INDEX:
            self.view = self.view._replace(sample=cmd)
            self.stdout.write(f"sample type: {cmd}\n")
            return True
        if cmd == "web":
            self._web(rest)
            return True
        if cmd in ("focus", "ignore"):
            pattern = " ".join(rest) or None
            if cmd == "focus":
                self.view = self.view._replace(focus=pattern)
            else:
                self.view = self.view._replace(ignore=pattern)
            self.stdout.write(f"{cmd}: {clean(pattern or '(none)')}\n")
            return True
        if cmd in ("list", "l"):
            try:
                self._list(rest)
            except HeapscopeError as e:
                self.stdout.write(f"error: {clean(str(e))}\n")
            return True
        m = _TOP.match(cmd)
        if m:
            try:
                self._top(int(m.group(1)) if m.group(1) else None, rest)
            except HeapscopeError as e:
                self.stdout.write(f"error: {clean(str(e))}\n")
            return True
        self.stdout.write(f"unknown command {clean(repr(cmd))}; type 'help'\n")
        return True

    def _web(self, words: list[str]) -> None:
        """``web``: start the viewer (or say its URL again); ``web stop``: stop it."""
        if words == ["stop"]:
            if self.viewer is not None and self.viewer.running:
                self.viewer.stop()
                self.stdout.write("heapscope: viewer stopped\n")
            else:
                self.stdout.write("no viewer is running\n")
            return
        if words:
            self.stdout.write("usage: web | web stop\n")
            return
        if self.viewer is not None and self.viewer.running:
            self.stdout.write(f"heapscope: viewer at {self.viewer.url}\n")
            return
        if not self.web.paths:
            self.stdout.write("error: these profiles were not read from files; nothing to "
                              "serve\n")
            return
        self.viewer = SideViewer(self.web, err=self.stdout)
        self.viewer.start()

    def _list(self, words: list[str]) -> None:
        """``list RE``: the lines of the functions matching RE, with their values."""
        from heapscope.analysis.filter import compile_re
        from heapscope.render.listing import render_listing, routines
        from heapscope.serve.source import read_source

        if not words:
            self.stdout.write("usage: list RE (a regular expression for function names)\n")
            return
        rx = compile_re(" ".join(words), "list")
        view = self.view._replace(granularity="lines", nodecount=0)
        table, _ = build_table(self.profiles, view, self.base)
        functions, _ = build_table(self.profiles, view._replace(granularity="functions"),
                                   self.base)
        found = routines(table, functions, lambda name: rx.search(name) is not None)
        if not found:
            self.stdout.write(f"no function matching {clean(rx.pattern)!r} holds memory in "
                              "this view\n")
            return
        for k, routine in enumerate(found):
            src = read_source(routine.file, (), self.sysroot)
            if k:
                self.stdout.write("\n")
            render_listing(self.stdout, routine, src[1] if src else None, table,
                           show_bytes=view.show_bytes, path=src[0] if src else "")

    def _top(self, n: int | None, words: list[str]) -> None:
        view = self.view
        if n is not None:
            view = view._replace(nodecount=n)
        focus: list[str] = []
        ignore: list[str] = []
        for w in words:
            opt = w.lstrip("-").replace("-", "_")
            if w.startswith("--") and opt == "cum":
                view = view._replace(cum=True)
            elif w.startswith("--") and opt in GRANULARITIES:
                view = view._replace(granularity=opt)
            elif w.startswith("--") and opt in SAMPLE_INDEX:
                view = view._replace(sample=opt)
            elif w.startswith("--") and opt == "show_bytes":
                view = view._replace(show_bytes=True)
            elif w.isdigit() and n is None:
                view = view._replace(nodecount=int(w))
            elif w.startswith("-") and len(w) > 1:
                ignore.append(w[1:])
            else:
                focus.append(w)
        if focus:
            view = view._replace(focus="|".join(f"(?:{f})" for f in focus))
        if ignore:
            view = view._replace(ignore="|".join(f"(?:{i})" for i in ignore))
        if self.base:
            render_diff(self.stdout, build_diff(self.profiles, view, self.base), self.base,
                        self.profiles, granularity=view.granularity, show_bytes=view.show_bytes)
            return
        table, rows = build_table(self.profiles, view)
        render_table(self.stdout, table, rows, granularity=view.granularity,
                     show_bytes=view.show_bytes)
