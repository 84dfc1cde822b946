"""Each process's own memory, one root per process, and programs by the names they were
started as."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from heapscope.analysis.ownership import (
    PROCESS_MODULE,
    ProcessFacts,
    alias_modules,
    exe_aliases,
    own_memory,
    subtract_parent,
    with_process_root,
)
from heapscope.analysis.tree import build_tree
from heapscope.model import Mapping
from tests.unit.builders import EXE, Builder


def test_a_forked_child_keeps_only_what_it_added() -> None:
    b = Builder()
    config = b.sample("load_config", "main", values=(64, 65536, 64, 65536))
    parent = b.profile(config).with_(pid=100)
    # The child inherited the config (and freed a little of it), then leaked on its own.
    child = b.profile(
        b.sample("load_config", "main", values=(60, 61440, 64, 65536)),
        b.sample("leak_in_worker", "main", values=(10, 2560, 10, 2560)),
    ).with_(pid=101)
    own = subtract_parent(child, parent)
    assert [s.values for s in own.samples] == [(10, 2560, 10, 2560)]
    facts = {101: ProcessFacts(101, 100), 100: ProcessFacts(100)}
    mine = own_memory([parent, child], facts)
    assert mine[0] is parent
    assert mine[1].total(1) == 2560


def test_a_child_running_another_program_keeps_everything() -> None:
    b = Builder()
    parent = b.profile(b.sample("main")).with_(pid=100)
    other = Mapping(0x600000000000, 0x600000100000, 0, "/usr/bin/other", "r-xp")
    child = b.profile(b.sample("main")).with_(pid=101, mappings=(other,))
    mine = own_memory([parent, child], {101: ProcessFacts(101, 100)})
    assert mine[1].total(1) == child.total(1)


def test_one_root_per_process_in_the_call_tree() -> None:
    b = Builder()
    p1 = with_process_root(b.profile(b.sample("a", "main")), "postgres [pid 1, main]", 0)
    p2 = with_process_root(b.profile(b.sample("a", "main")), "postgres: checkpointer [pid 2]", 1)
    tree = build_tree([p1, p2])
    roots = [tree.strings[tree.name[k]] for k in range(len(tree)) if tree.parent[k] == 0]
    assert sorted(roots) == ["postgres [pid 1, main]", "postgres: checkpointer [pid 2]"]
    loc = p1.location(p1.samples[0].stack[-1])
    assert loc.module == PROCESS_MODULE and loc.frames[0].function == "postgres [pid 1, main]"


def test_titles_and_labels() -> None:
    pg = ProcessFacts(7, 1, "/usr/lib/postgresql/15/bin/postgres",
                      ("postgres: checkpointer ",), "child")
    assert pg.title == "postgres: checkpointer" and pg.label == \
        "postgres: checkpointer [pid 7, child]"
    main = ProcessFacts(1, None, "/usr/lib/postgresql/15/bin/postgres",
                        ("/usr/lib/postgresql/15/bin/postgres", "-D", "/srv/pg data"), "main")
    assert main.title == "postgres -D '/srv/pg data'"
    assert ProcessFacts(9, exe="/usr/bin/redis-server").title == "redis-server"


def test_a_program_started_through_a_symlink_keeps_that_name(tmp_path: Path) -> None:
    real = tmp_path / "redis-check-rdb"
    real.write_bytes(b"\x7fELF")
    link = tmp_path / "redis-server"
    os.symlink(real, link)
    facts = {5: ProcessFacts(5, None, str(real), (str(link), "--port", "6379"))}
    aliases = exe_aliases(facts)
    assert aliases == {str(real): "redis-server"}
    # The same name, or a name that does not lead to the file: nothing to rename.
    assert exe_aliases({5: ProcessFacts(5, None, str(real), (str(real),))}) == {}
    assert exe_aliases({5: ProcessFacts(5, None, str(real), ("/bin/true",))}) == {}

    b = Builder()
    mapping = Mapping(EXE.start, EXE.limit, 0, str(real), "r-xp")
    prof = b.profile(b.sample("?exe")).with_(mappings=(mapping,))
    addr = prof.samples[0].stack[0]
    loc = prof.locations[addr]
    prof = prof.with_(locations={addr: loc.__class__(addr, mapping, "redis-check-rdb",
                                                     loc.offset, ())})
    renamed = alias_modules(prof, aliases)
    assert renamed.location(addr).fallback_name.startswith("redis-server+0x")


@pytest.mark.parametrize("argv0", ["postgres: user db [local] idle", ""])
def test_retitled_or_empty_commands_are_not_aliases(argv0: str) -> None:
    assert exe_aliases({1: ProcessFacts(1, None, "/usr/bin/postgres", (argv0,))}) == {}
