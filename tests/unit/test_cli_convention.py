"""One command line: every subcommand's parser follows the conventions the README states
(section "One convention for every command"). The parsers are walked, not listed by hand:
a new subcommand or option that breaks a rule fails here."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from heapscope.cli.main import parser

# The idea each canonical option stands for, and the names it must have wherever it appears.
CANONICAL = {
    "top": ("-n", "--top"),
    "output": ("-o", "--output"),
    "format": ("--format",),
    "focus": ("--focus",),
    "ignore": ("--ignore",),
    "force": ("--force",),
    "verbose": ("-v", "--verbose"),
}

# Commands that show a list of rows (sites, suspects, nodes): all take -n/--top.
SHOW_ROWS = {"run", "top", "leaks", "diff", "graph", "timeline", "shell", "agent",
             "attach window", "attach watch"}
# Commands that read dumps and show their stacks: all take --focus/--ignore.
READ_STACKS = {"top", "leaks", "diff", "graph", "export", "flamegraph", "timeline", "shell"}
# Commands that write a file the user names with -o: all take --force (refused without it).
WRITE_FILES = {"graph", "export", "flamegraph", "timeline", "leaks"}
# Commands whose -o is a session folder: never replaced, so no --force (see the README).
WRITE_SESSIONS = {"run", "attach dump", "attach window", "attach watch"}


def commands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every subcommand's parser by its name (attach's actions as "attach ACTION")."""
    def walk(name: str, p: argparse.ArgumentParser
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
        if name:
            yield name, p
        for s in subs:
            for child, cp in s.choices.items():
                yield from walk(f"{name} {child}".strip(), cp)
    yield from walk("", parser())


ALL = dict(commands())


def options(p: argparse.ArgumentParser) -> dict[str, list[str]]:
    """dest -> option strings, for the options a user can see."""
    return {a.dest: list(a.option_strings) for a in p._actions
            if a.option_strings and a.help != argparse.SUPPRESS}


def all_strings(p: argparse.ArgumentParser) -> dict[str, str]:
    """option string -> dest, hidden aliases included."""
    return {s: a.dest for a in p._actions for s in a.option_strings}


def test_every_subcommand_is_walked() -> None:
    assert {"run", "attach", "agent", "top", "leaks", "diff", "graph", "export", "flamegraph",
            "timeline", "shell", "serve", "env", "attach status", "attach dump",
            "attach start", "attach stop", "attach reset", "attach window",
            "attach watch"} <= set(ALL)


@pytest.mark.parametrize("name", sorted(ALL))
def test_same_idea_same_names(name: str) -> None:
    opts = options(ALL[name])
    for dest, names in CANONICAL.items():
        if dest in opts:
            assert opts[dest][:len(names)] == list(names), (name, dest, opts[dest])
    # A short option means one thing everywhere.
    strings = all_strings(ALL[name])
    for short, dest in (("-n", "top"), ("-o", "output"), ("-v", "verbose"), ("-i", "interactive")):
        if short in strings:
            assert strings[short] == dest, (name, short)
    # jeprof's name for the row count is only an alias of -n/--top.
    assert strings.get("--nodecount", "top") == "top", name


@pytest.mark.parametrize("name", sorted(ALL))
def test_each_group_has_its_options(name: str) -> None:
    opts = options(ALL[name])
    assert ("top" in opts) == (name in SHOW_ROWS), name
    assert ("focus" in opts and "ignore" in opts) == (name in READ_STACKS), name
    assert ("force" in opts) == (name in WRITE_FILES), name
    if name in WRITE_FILES | WRITE_SESSIONS:
        assert "output" in opts, name


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_option_says_what_it_does(name: str) -> None:
    p = ALL[name]
    for a in p._actions:
        if a.help == argparse.SUPPRESS or isinstance(a, argparse._SubParsersAction):
            continue
        assert a.help and a.help.strip(), (name, a.option_strings or a.dest)
    text = p.format_help()
    # Each usage line names the whole command, so it can be typed as printed.
    prog = "heapscope " + name.replace("attach ", "attach PID ")
    assert text.startswith(f"usage: {prog} "), text.splitlines()[0]


def test_attach_help_lists_every_action_with_its_options() -> None:
    text = ALL["attach"].format_help()
    for action in ("status", "dump", "start", "stop", "reset", "window", "watch"):
        assert f"heapscope attach PID {action}" in text
    # The options of the actions, not only their names.
    for opt in ("--seconds N", "--every S", "--count K", "--fail-on-leak", "--sample BYTES",
                "-o DIR", "-n N", "--format {text,json}"):
        assert opt in text, opt


def test_watch_gates_like_run_and_leaks() -> None:
    for name in ("run", "leaks", "attach watch"):
        opts = options(ALL[name])
        assert opts["fail_on_leak"] == ["--fail-on-leak"] and \
            opts["fail_on_live"] == ["--fail-on-live"], name


def test_old_spellings_still_parse() -> None:
    """Scripts written before the names were unified keep working."""
    p = parser()
    assert p.parse_args(["top", "x.heap", "--nodecount", "7"]).top == 7
    assert p.parse_args(["graph", "x.heap", "-o", "g.svg", "--nodecount", "9"]).top == 9
    assert p.parse_args(["leaks", "s", "--html", "out"]).output == "out"
    assert p.parse_args(["attach", "1", "dump", "--session", "s"]).output == "s"
