"""The one overwrite rule and the one success line of every command that writes a file, and
the shell's ``list``, run through the real command line on a small symbolized dump."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from heapscope.analysis.prune import prune
from heapscope.analysis.top import View
from heapscope.cli.main import main
from heapscope.cli.shell import Shell
from heapscope.formats import symbolized

from .builders import Builder

# value = bytes in use (inuse_space), objects (inuse_objects)
MAKE_BUF = (2, 2048, 2, 2048)
PARSE = (1, 100, 1, 100)


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """A self-contained dump: make_buf (2 KiB at buf.c:12) and parse (100 B at cfg.c:22)."""
    b = Builder()
    p = b.profile(
        b.sample("je:malloc", "make_buf@buf.c:12", "main@main.c:7", values=MAKE_BUF),
        b.sample("je:malloc", "parse@cfg.c:22", "main@main.c:7", values=PARSE),
    )
    path = tmp_path / ("app.heap" + symbolized.SUFFIX)
    symbolized.write(p, str(path))
    return path


# (command, output name, extra arguments): every command that writes a file by -o.
WRITERS = [
    ("graph", "g.dot", []),
    ("export", "p.folded", ["--format", "collapsed"]),
    ("export", "p.pb.gz", []),
    ("flamegraph", "f.html", []),
]


@pytest.mark.parametrize(("command", "name", "extra"), WRITERS)
def test_one_overwrite_rule_and_one_success_line(
        dump: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        command: str, name: str, extra: list[str]) -> None:
    out = tmp_path / name
    argv = [command, str(dump), "-o", str(out), "--no-cache", *extra]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    wrote = [line for line in err if line.startswith("heapscope: wrote ")]
    size = out.stat().st_size
    # One line, naming the file and its size (IEC units, as every size heapscope prints).
    assert len(wrote) == 1, err
    assert wrote[0].startswith(f"heapscope: wrote {out} (")
    unit = "B" if size < 1024 else "KiB"
    assert f" {unit}" in wrote[0], wrote[0]
    first = out.read_bytes()

    # The same command again: refused before any work, exit 3, the file untouched.
    out.write_bytes(b"keep me")
    assert main(argv) == 3
    err_text = capsys.readouterr().err
    assert err_text == f"heapscope: error: {out}: exists: add --force to replace it\n"
    assert out.read_bytes() == b"keep me"

    # --force replaces it whole, and nothing is left beside it.
    assert main([*argv, "--force"]) == 0
    capsys.readouterr()
    if name.endswith((".gz", ".html")):  # a time stamp (gzip), a fresh nonce (the page)
        assert out.read_bytes()[:10] == first[:10] and out.stat().st_size == len(first)
    else:
        assert out.read_bytes() == first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([dump.name, name])


def test_diff_and_top_say_iec_units(dump: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["top", str(dump), "--no-cache"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("Total: ") and " MiB" in text.splitlines()[0]
    assert " MB" not in text


def test_shell_list_shows_each_matching_function_by_line(tmp_path: Path) -> None:
    src = tmp_path / "buf.c"
    src.write_text("".join(f"line {n}\n" for n in range(1, 21)))
    b = Builder()
    # make_buf allocates at line 12 (2 KiB) and line 15 (512 B); parse elsewhere.
    p = b.profile(
        b.sample("je:malloc", f"make_buf@{src}:12", "main@main.c:7", values=MAKE_BUF),
        b.sample("je:malloc", f"make_buf@{src}:15", "main@main.c:7", values=(1, 512, 1, 512)),
        b.sample("je:malloc", "parse@cfg.c:22", "main@main.c:7", values=PARSE),
    )
    out = io.StringIO()
    # As every command shows them: allocator frames pruned.
    Shell([prune(p)], View(show_bytes=True), stdin=io.StringIO("list make_buf\nlist parse\nlist\n"),
          stdout=out).loop()
    text = out.getvalue().splitlines()
    assert text[0] == f"ROUTINE make_buf in {src}"
    # 2,048 + 512 bytes allocated in make_buf itself, of 2,660 in all.
    assert text[1] == "  2,560 flat, 2,560 cum of 2,660 total (inuse_space)"
    rows = {int(line.split(":")[0].split()[-1]): line for line in text
            if line.rstrip().endswith(tuple(f"line {n}" for n in range(1, 21)))}
    # Lines 10-17 are shown (two around each allocating line); 12 and 15 with their bytes.
    assert sorted(rows) == list(range(10, 18))
    assert rows[12].split()[:2] == ["2,048", "2,048"] and rows[12].endswith("line 12")
    assert rows[15].split()[:2] == ["512", "512"]
    assert rows[13].split()[0] == "13:"
    # parse's source file is not on this machine: only its line that holds memory.
    at = text.index("ROUTINE parse in cfg.c")
    assert "source not found" in text[at + 2]
    assert text[at + 4].split() == ["100", "100", "22:"]
    assert text[-1] == "usage: list RE (a regular expression for function names)"


def test_leaks_focus_and_ignore_scope_the_report_and_its_gate(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import numpy as np

    from tests import leaksim as ls

    # Two sites of 64-byte objects at jemalloc's default period (one sample per ~512 KiB of
    # them): one gains 10 samples a dump (a leak), the other holds 50 throughout. The
    # simulator's file does not exist, so they are named by address: sim+0x101, sim+0x201.
    r = 512 * 1024
    leak = [10 * (k + 1) for k in range(10)]
    sites = {0x100: ls.Series(np.asarray([leak]), 64, r, False),
             0x200: ls.Series(np.asarray([[50] * 10]), 64, r, False)}
    ls.write_series(tmp_path / "d", 77, sites, 0)
    folder = str(tmp_path / "d")

    def leaks(*extra: str) -> tuple[int, Any]:
        rc = main(["leaks", folder, "--no-cache", "--format", "json", "--fail-on-leak",
                   *extra])
        return rc, json.loads(capsys.readouterr().out)

    rc, whole = leaks()
    assert rc == 10
    assert [s["function"] for s in whole["suspects"] if s["verdict"] == "leak"] == ["sim+0x101"]
    for extra in (["--focus", r"sim\+0x201"], ["--ignore", r"sim\+0x101"]):
        rc, doc = leaks(*extra)
        # Only the steady site is judged: no leak, the gate passes, the totals are its own
        # (50 samples of ~512 KiB = 25 MiB).
        assert rc == 0, extra
        assert {s["function"] for s in doc["suspects"]} <= {"sim+0x201"}
        (proc,) = doc["processes"]
        assert proc["live_bytes"] == pytest.approx(25 * 1024 * 1024, rel=0.01)
        assert any("only the stacks" in n for n in doc["notes"])
