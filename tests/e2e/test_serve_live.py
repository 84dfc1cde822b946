"""The viewer beside a command that writes a session: ``run --serve``, ``attach PID watch
--serve``, the shell's ``web``, and ``heapscope serve`` on ``agent --state``'s folder.

Real programs under the real jemalloc; the viewer is asked over plain HTTP, as a script would
(``/api/inputs`` with the ``X-Heapscope-Token`` header). What is checked is what the user
sees: the URL line, dumps that appear while the program runs, the program's own output and
exit status untouched, signals still reaching it, and the port closed once the viewer
stops. Waits are generous and never a measure of speed (a loaded machine passes).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import jemalloc as je
import pytest

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
WAIT = 60.0  # seconds a step may take on a slow, loaded machine before the test gives up
URL_LINE = re.compile(r"^heapscope: viewer at (http://127\.0\.0\.1:\d+)/\?token=(\S+)$")


def _env(tmp_path: Path) -> dict[str, str]:
    """heapscope's environment: not profiled itself, its own cache."""
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    env["HEAPSCOPE_CACHE_DIR"] = str(tmp_path / "cache")
    for key in ("HEAPSCOPE_OWN", "HEAPSCOPE_ALLOC_FN"):
        env.pop(key, None)
    return env


class Lines:
    """The lines of a stream, read by a thread as they come (a test never blocks on it)."""

    def __init__(self, stream: IO[str]) -> None:
        self.seen: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._new.put(line.rstrip("\n"))
        self._new.put(None)

    def wait_for(self, match: Callable[[str], bool], what: str) -> str:
        """The first line (seen or to come) that ``match`` accepts."""
        for line in self.seen:
            if match(line):
                return line
        deadline = time.monotonic() + WAIT
        while True:
            try:
                line = self._new.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {what} within {WAIT:g} s: {self.seen}") from None
            if line is None:
                self._new.put(None)
                raise AssertionError(f"the stream ended without {what}: {self.seen}")
            self.seen.append(line)
            if match(line):
                return line

    def rest(self) -> str:
        """Every line once the stream has ended."""
        self._thread.join(timeout=WAIT)
        while True:
            line = self._new.get_nowait() if not self._new.empty() else None
            if line is None:
                break
            self.seen.append(line)
        return "\n".join(self.seen)


class Api:
    """The viewer at ``base``, asked with its token as a script asks it."""

    def __init__(self, base: str, token: str) -> None:
        self.base = base
        self.token = token

    @classmethod
    def from_line(cls, line: str) -> Api:
        m = URL_LINE.match(line)
        assert m, line
        return cls(m.group(1), m.group(2))

    def get(self, path: str) -> Any:
        req = urllib.request.Request(self.base + path,
                                     headers={"X-Heapscope-Token": self.token})
        with urllib.request.urlopen(req, timeout=WAIT) as r:
            assert r.status == 200
            return json.loads(r.read())

    def dumps(self) -> list[str]:
        """The names of every dump the viewer lists now."""
        return [d["name"] for inp in self.get("/api/inputs")["inputs"] for d in inp["dumps"]]

    def until(self, check: Callable[[Any], bool], what: str) -> Any:
        """``/api/inputs`` asked again (twice a second) until ``check`` accepts it."""
        deadline = time.monotonic() + WAIT
        doc = None
        while time.monotonic() < deadline:
            doc = self.get("/api/inputs")
            if check(doc):
                return doc
            time.sleep(0.5)
        raise AssertionError(f"{what}: not within {WAIT:g} s; last {doc}")

    def closed(self) -> bool:
        """True when nothing listens on the viewer's port any more."""
        host, port = self.base.removeprefix("http://").rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                return False
        except ConnectionRefusedError:
            return True


def _count(doc: Any) -> int:
    return sum(len(inp["dumps"]) for inp in doc["inputs"])


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=WAIT)


@pytest.fixture(scope="module")
def live_leak(gcc: Path, libjemalloc: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """programs/live_leak.c: leaks until a line arrives on stdin, then exits with argv[1]."""
    out = tmp_path_factory.mktemp("live") / "live_leak"
    return je.build([je.PROGRAMS_DIR / "live_leak.c"], out, ("-O1", "-g")).resolve()


def _heapscope(*args: str, tmp_path: Path, stdin: int | None = subprocess.PIPE,
               stderr: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen([*je.HEAPSCOPE_CMD, *args], env=_env(tmp_path), stdin=stdin,
                            stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=tmp_path)


# --------------------------------------------------------------------------------------
# heapscope run --serve


def test_run_serve_shows_the_dumps_as_they_come(live_leak: Path, tmp_path: Path) -> None:
    session = tmp_path / "s"
    run = _heapscope("run", "-o", str(session), "--serve", "--every", "1", "--sample", "64k",
                     "--", str(live_leak), "7", tmp_path=tmp_path)
    assert run.stdin is not None and run.stdout is not None and run.stderr is not None
    err = Lines(run.stderr)
    try:
        api = Api.from_line(err.wait_for(URL_LINE.match, "URL line"))
        # The program's output is its own: nothing of the viewer's on stdout.
        assert run.stdout.readline() == "ready\n"
        first = api.until(lambda doc: _count(doc) >= 1, "a first dump")
        (inp,) = first["inputs"]
        assert inp["kind"] == "session" and Path(inp["path"]) == session
        # Each round of --every adds a dump the viewer lists without being restarted.
        api.until(lambda doc: _count(doc) >= _count(first) + 2, "two more dumps")
        leaks = api.get("/api/session/0/leaks")
        assert [p["pid"] for p in leaks["processes"]]
        # The program reads its stdin through heapscope, and its exit status comes back.
        run.stdin.write("quit\n")
        run.stdin.close()
        rest = run.stdout.read()
        assert run.wait(timeout=WAIT * 2) == 7
    finally:
        _stop(run)
    assert rest == "got: quit\nbye\n"
    text = err.rest()
    assert "Traceback" not in text, text
    assert f"heapscope: viewer stopped; to look again: heapscope serve {session}" \
        in text.splitlines()
    assert api.closed()
    assert json.loads((session / "report.json").read_text())["exit_status"] == 7


def test_run_serve_url_comes_before_the_program_speaks(tmp_path: Path,
                                                       libjemalloc: Path) -> None:
    # One pipe for both streams: the order in it is the order of the writes.
    run = _heapscope("run", "-o", str(tmp_path / "s"), "--serve", "--", "sh", "-c",
                     "echo hello-from-the-program", tmp_path=tmp_path,
                     stdin=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    out, _ = run.communicate(timeout=WAIT * 2)
    assert run.returncode == 0, out
    lines = out.splitlines()
    url = next(k for k, line in enumerate(lines) if URL_LINE.match(line))
    assert url < lines.index("hello-from-the-program"), out
    assert Api.from_line(lines[url]).closed()


def test_run_serve_still_passes_sigterm_to_the_program(live_leak: Path,
                                                       tmp_path: Path) -> None:
    run = _heapscope("run", "-o", str(tmp_path / "s"), "--serve", "--every", "1", "--",
                     str(live_leak), tmp_path=tmp_path)
    assert run.stdout is not None and run.stderr is not None
    err = Lines(run.stderr)
    try:
        api = Api.from_line(err.wait_for(URL_LINE.match, "URL line"))
        assert run.stdout.readline() == "ready\n"
        api.until(lambda doc: _count(doc) >= 1, "a first dump")
        run.send_signal(signal.SIGTERM)
        # The program dies of the SIGTERM heapscope passed on (it has no handler), and the
        # run says so with the shell's status.
        assert run.wait(timeout=WAIT * 2) == 128 + signal.SIGTERM
    finally:
        _stop(run)
    text = err.rest()
    assert "killed by SIGTERM" in text and "Traceback" not in text, text
    assert api.closed()


def test_run_stay_serves_the_finished_session_until_sigterm(live_leak: Path,
                                                            tmp_path: Path) -> None:
    session = tmp_path / "s"
    # stdin at its end: the program stops at once, with status 3.
    run = _heapscope("run", "-o", str(session), "--stay", "--", str(live_leak), "3",
                     tmp_path=tmp_path, stdin=subprocess.DEVNULL)
    assert run.stderr is not None
    err = Lines(run.stderr)
    try:
        api = Api.from_line(err.wait_for(URL_LINE.match, "URL line"))
        err.wait_for(lambda line: "goes on showing the finished session" in line,
                     "the line saying the viewer stays")
        assert run.poll() is None
        # The finished session: its exit dump, in the copy the run symbolized.
        api.until(lambda doc: [(d["kind"], d["symbolized"]) for inp in doc["inputs"]
                               for d in inp["dumps"]] == [("f", True)], "the exit dump")
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=WAIT) == 3  # the program's status, not the signal's
    finally:
        _stop(run)
    assert "Traceback" not in err.rest()
    assert api.closed()


# --------------------------------------------------------------------------------------
# heapscope attach PID watch --serve


@pytest.fixture
def target(gcc: Path, libjemalloc: Path, gdb: str, tmp_path: Path) -> Iterator[int]:
    """attachprog/server.c under the real jemalloc, leaking in slow_leak(); its pid."""
    binary = je.build([HERE / "attachprog" / "server.c"], tmp_path / "server",
                      ("-O1", "-g", "-pthread"))
    env = {k: v for k, v in os.environ.items() if k not in je.PROFILING_ENV}
    env.update(LD_PRELOAD=str(libjemalloc), MALLOC_CONF="prof:true,lg_prof_sample:12")
    proc = subprocess.Popen([str(binary)], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready")
    try:
        yield proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT) == 0  # alive to the end, unharmed


def test_attach_watch_serve(target: int, tmp_path: Path) -> None:
    session = tmp_path / "w"
    watch = _heapscope("attach", str(target), "watch", "--every", "1", "--count", "5",
                       "--serve", "-o", str(session), tmp_path=tmp_path,
                       stdin=subprocess.DEVNULL)
    assert watch.stderr is not None and watch.stdout is not None
    err = Lines(watch.stderr)
    try:
        api = Api.from_line(err.wait_for(URL_LINE.match, "URL line"))
        first = api.until(lambda doc: _count(doc) >= 1, "a first dump")
        assert first["inputs"][0]["kind"] == "session"
        api.until(lambda doc: _count(doc) >= 3, "the dumps that follow")
        out = watch.stdout.read()
        assert watch.wait(timeout=WAIT * 2) == 0
    finally:
        _stop(watch)
    assert "slow_leak" in out and f"session: {session}" in out, out
    text = err.rest()
    assert "Traceback" not in text, text
    assert f"viewer stopped; to look again: heapscope serve {session}" in text
    assert api.closed()


# --------------------------------------------------------------------------------------
# heapscope serve on the state folder of heapscope agent


def test_serve_follows_an_agent_state_folder(target: int, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o711)
    # The viewer starts first: the target's session appears in the folder later.
    server = _heapscope("serve", str(state), tmp_path=tmp_path, stdin=subprocess.DEVNULL)
    agent = _heapscope("agent", "--pid", str(target), "--every", "1", "--window", "3",
                       "--listen", f"127.0.0.1:{je.free_port()}", "--state", str(state),
                       tmp_path=tmp_path, stdin=subprocess.DEVNULL)
    one = None
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        api = Api.from_line(f"heapscope: viewer at {url}")

        def window_moved(doc: Any) -> bool:
            names = [d["name"] for inp in doc["inputs"] for d in inp["dumps"]]
            return bool(names) and not any(n.startswith(f"jeprof.{target}.0.") for n in names)

        # The agent's session is listed as a session of its own; as the window moves, the
        # dumps the agent deleted leave the list (never more than the window, and the dump
        # just taken before the oldest goes).
        doc = api.until(window_moved, "the window moving past the first dump")
        (inp,) = doc["inputs"]
        assert inp["kind"] == "session" and inp["title"].startswith("server-"), inp
        assert 1 <= len(inp["dumps"]) <= 3 + 1, inp
        leaks = api.get(f"/api/session/{inp['id']}/leaks")
        assert [p["pid"] for p in leaks["processes"]] == [target]
        # The session itself, served alone, follows the agent too.
        one = _heapscope("serve", inp["path"], tmp_path=tmp_path, stdin=subprocess.DEVNULL)
        assert one.stdout is not None
        alone = Api.from_line(f"heapscope: viewer at {one.stdout.readline().strip()}")
        seen = alone.dumps()
        alone.until(lambda d: any(n not in seen for n in
                                  [x["name"] for i in d["inputs"] for x in i["dumps"]]),
                    "a dump the agent took since")
    finally:
        for proc in (agent, server, one):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (agent, server, one):
            if proc is not None:
                try:
                    proc.wait(timeout=WAIT)
                except subprocess.TimeoutExpired:
                    proc.kill()
    assert agent.stderr is not None and "Traceback" not in agent.stderr.read()


# --------------------------------------------------------------------------------------
# the shell's web command


def test_shell_web_command(leaky_c: Any, tmp_path: Path) -> None:
    shell = _heapscope("shell", str(leaky_c.dump), tmp_path=tmp_path)
    assert shell.stdin is not None and shell.stdout is not None
    out = Lines(shell.stdout)

    def say(line: str) -> None:
        assert shell.stdin is not None
        shell.stdin.write(line + "\n")
        shell.stdin.flush()

    try:
        say("web")
        api = Api.from_line(out.wait_for(URL_LINE.match, "URL line"))
        (inp,) = api.get("/api/inputs")["inputs"]
        assert [d["name"] for d in inp["dumps"]] == [leaky_c.dump.name]
        # The prompt stays usable while the viewer serves.
        say("top3")
        out.wait_for(lambda line: line.endswith(" leak_big"), "the top table")
        say("web")  # asked again: the same viewer
        assert out.wait_for(lambda line: line.startswith("heapscope: viewer at")
                            and out.seen.count(line) == 2, "the URL again") == \
            f"heapscope: viewer at {api.base}/?token={api.token}"
        say("web stop")
        out.wait_for(lambda line: line == "heapscope: viewer stopped", "the stop line")
        assert api.closed()
        say("web")  # a new viewer; leaving the shell stops it
        again = Api.from_line(out.wait_for(
            lambda line: bool(URL_LINE.match(line)) and api.token not in line, "a new URL"))
        assert again.dumps() == [leaky_c.dump.name]
        say("quit")
        assert shell.wait(timeout=WAIT) == 0
    finally:
        _stop(shell)
    assert again.closed()
