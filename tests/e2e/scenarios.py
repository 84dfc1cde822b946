"""Fixtures and helpers for the `heapscope run` end-to-end scenarios.

Sources and their truth live in ``tests/e2e/scenarios/`` (header comment of each file);
the build recipes are in ``scenarios/build.py``. Everything is built once per session.

``from scenarios import *`` in a test module registers these fixtures there (this directory's
conftest.py is not ours to edit). Fixtures (session-scoped):

- ``scenario_dir``            resolved session temp dir for builds and runs
- ``heapscope_cache``         HEAPSCOPE_CACHE_DIR shared by all scenario runs
- ``prefork_bin``, ``threads_bin``, ``libcleak_so``       gcc builds
- ``java_tools``              (java, javac), skips without a JDK
- ``inflater_leak_classes``   javac'd InflaterLeak (class path)
- ``postgres_install``        PgInstall: server binaries + pg_config of the same major
- ``leakext_so``              leakext.so built with ``pg_config --includedir-server``
- ``pg_cluster``              PgCluster: initdb'd data dir + socket dir, owned by the
                              ``postgres`` user when the tests run as root
- ``prefork_run``, ``threads_run``, ``ctypes_run``, ``inflater_run``, ``postgres_run``
                              one ``heapscope run -o SESSION --sample 4096 -- …`` each,
                              returning a :class:`ScenarioRun`

Prerequisites skip with a precise reason only when truly absent (libjemalloc and gcc come
from conftest.py's fixtures).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"

FIXTURES = (
    "scenario_dir",
    "heapscope_cache",
    "prefork_bin",
    "threads_bin",
    "libcleak_so",
    "java_tools",
    "inflater_leak_classes",
    "postgres_install",
    "pg_cluster",
    "leakext_so",
    "prefork_run",
    "threads_run",
    "ctypes_run",
    "inflater_run",
    "postgres_run",
)
__all__ = [*FIXTURES]  # `from scenarios import *` registers the fixtures in a test module


def _load_build() -> Any:
    # scenarios/ is a data directory, not a package (and scenarios.py shadows it).
    spec = importlib.util.spec_from_file_location(
        "heapscope_scenario_build", SCENARIOS_DIR / "build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


build = _load_build()

HEAPSCOPE = (sys.executable, "-m", "heapscope.cli.main")
SAMPLE = 4096  # --sample: jemalloc's mean sampling interval in bytes (lg_prof_sample:12)

# Truth (see each source's header comment).
PREFORK_LEAK_BYTES = 20_000 * 256
THREADS_LEAK_BYTES = 10_000 * 512
CTYPES_RECORDS = 20_000
CTYPES_LEAK_BYTES = CTYPES_RECORDS * 1024
INFLATERS = 1000
PG_LEAK_CALLS = 200_000
PG_LEAK_MIN_BYTES = PG_LEAK_CALLS * 100
PG_VERSION = 15  # PostgreSQL major the extension and the scenario target


class ScenarioError(AssertionError):
    """A scenario did not run as its truth says (program failed, no report, ...)."""


# --------------------------------------------------------------------------------------
# Running heapscope


@dataclass
class ScenarioRun:
    """One ``heapscope run`` of a scenario and what it reported."""

    name: str
    argv: list[str]
    session: Path
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any]
    pids: dict[str, int] = field(default_factory=dict)  # role -> pid, from the program

    @property
    def processes(self) -> list[dict[str, Any]]:
        return list(self.report.get("processes", []))

    @property
    def suspects(self) -> list[dict[str, Any]]:
        return list(self.report.get("suspects", []))

    @property
    def first_suspect(self) -> dict[str, Any]:
        if not self.suspects:
            raise ScenarioError(f"{self.name}: report has no suspects\n{self.describe()}")
        return self.suspects[0]

    def process(self, pid: int) -> dict[str, Any]:
        for p in self.processes:
            if p.get("pid") == pid:
                return p
        raise ScenarioError(f"{self.name}: pid {pid} not in report\n{self.describe()}")

    def describe(self, n: int = 6) -> str:
        """A short dump of the report for assertion messages."""
        lines = [f"$ {' '.join(self.argv)}  (exit {self.returncode})", f"pids: {self.pids}"]
        for p in self.processes:
            lines.append(
                f"  process pid={p.get('pid')} ppid={p.get('ppid')} leaks={p.get('leaks')} "
                f"role={p.get('role')!r} live={p.get('live_bytes')} exe={p.get('exe')}"
            )
        for s in self.suspects[:n]:
            stack = s.get("stack") or []
            lines.append(
                f"  suspect pid={s.get('pid')} {s.get('function')} {s.get('file')}:"
                f"{s.get('line')} bytes={s.get('bytes')} verdict={s.get('verdict')} "
                f"stack={stack[:4]}"
            )
        if self.stderr.strip():
            lines.append("stderr (tail):\n" + "\n".join(self.stderr.splitlines()[-15:]))
        return "\n".join(lines)


def clean_env() -> dict[str, str]:
    """Our environment minus any jemalloc or JVM settings that would change a run."""
    env = dict(os.environ)
    for key in ("LD_PRELOAD", "MALLOC_CONF", "_RJEM_MALLOC_CONF", "JAVA_TOOL_OPTIONS"):
        env.pop(key, None)
    return env


def heapscope_env(cache_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment heapscope runs in: HEAPSCOPE_CACHE_DIR set, no LD_PRELOAD."""
    env = clean_env()
    env["HEAPSCOPE_CACHE_DIR"] = str(cache_dir)
    if extra:
        env.update(extra)
    return env


def run_argv(
    session: Path, cmd: Sequence[str | Path], sample: int = SAMPLE, options: Sequence[str] = ()
) -> list[str]:
    return [
        *HEAPSCOPE,
        "run",
        "-o",
        str(session),
        "--sample",
        str(sample),
        *options,
        "--",
        *map(str, cmd),
    ]


def load_report(
    name: str, argv: list[str], session: Path, returncode: int, stdout: str, stderr: str
) -> ScenarioRun:
    path = session / "report.json"
    if not path.is_file():
        raise ScenarioError(
            f"{name}: heapscope run wrote no {path} (exit {returncode})\n"
            f"$ {' '.join(argv)}\nstdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}"
        )
    try:
        report = json.loads(path.read_text())
    except ValueError as e:
        raise ScenarioError(f"{name}: {path} is not JSON: {e}") from e
    return ScenarioRun(name, argv, session, returncode, stdout, stderr, report)


def heapscope_run(
    name: str,
    session: Path,
    cmd: Sequence[str | Path],
    cache_dir: Path,
    *,
    cwd: Path,
    sample: int = SAMPLE,
    options: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 180,
) -> ScenarioRun:
    """``heapscope run -o SESSION --sample N -- CMD`` to completion; loads report.json."""
    argv = run_argv(session, cmd, sample, options)
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            env=heapscope_env(cache_dir, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        raise ScenarioError(f"{name}: {' '.join(argv)} timed out after {timeout}s") from e
    return load_report(name, argv, session, proc.returncode, proc.stdout, proc.stderr)


def parse_pids(text: str, pattern: str) -> dict[str, int]:
    """{group 'role': int(group 'pid')} for every match of *pattern* in *text*."""
    return {m.group("role"): int(m.group("pid")) for m in re.finditer(pattern, text, re.M)}


def heapscope_top_json(dump: Path, cache_dir: Path, *args: str) -> dict[str, Any]:
    """``heapscope top --format json -n 0 ARGS DUMP`` (works without `run`)."""
    proc = subprocess.run(
        [*HEAPSCOPE, "top", "--format", "json", "-n", "0", *args, str(dump)],
        env=heapscope_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if proc.returncode != 0:
        raise ScenarioError(f"heapscope top {dump} exited {proc.returncode}:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


@dataclass
class DirectRun:
    """A scenario run by hand: LD_PRELOAD + MALLOC_CONF, no heapscope involved."""

    stdout: str
    dump_dir: Path

    def dump(self, pid: int) -> Path:
        return final_dump(self.dump_dir, pid)


def direct_env(libjemalloc: Path, dump_dir: Path, sample: int = SAMPLE) -> dict[str, str]:
    lg = sample.bit_length() - 1
    env = clean_env()
    env["LD_PRELOAD"] = str(libjemalloc)
    env["MALLOC_CONF"] = (
        f"prof:true,prof_final:true,lg_prof_sample:{lg},prof_prefix:{dump_dir}/jeprof"
    )
    return env


def run_direct(
    cmd: Sequence[str | Path], work: Path, libjemalloc: Path, timeout: float = 120
) -> DirectRun:
    """Run *cmd* under jemalloc with profiling the way the scenarios were validated."""
    dump_dir = work / "dumps"
    dump_dir.mkdir(parents=True, exist_ok=True)
    argv = [str(c) for c in cmd]
    proc = subprocess.run(
        argv,
        cwd=work,
        env=direct_env(libjemalloc, dump_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise ScenarioError(f"{argv} exited {proc.returncode}:\n{proc.stderr}")
    return DirectRun(proc.stdout, dump_dir)


def final_dump(dump_dir: Path, pid: int) -> Path:
    finals = sorted(dump_dir.glob(f"*.{pid}.*.f.heap"))
    if not finals:
        have = sorted(p.name for p in dump_dir.glob("*.heap"))
        raise ScenarioError(f"no final dump for pid {pid} in {dump_dir}: {have}")
    return finals[-1]


# --------------------------------------------------------------------------------------
# Builds


@pytest.fixture(scope="session")
def scenario_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("heapscope-scenarios").resolve()


@pytest.fixture(scope="session")
def heapscope_cache(scenario_dir: Path) -> Path:
    path = scenario_dir / "cache"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def prefork_bin(scenario_dir: Path, gcc: Path) -> Path:
    path: Path = build.build_prefork(scenario_dir / "build", gcc)
    return path


@pytest.fixture(scope="session")
def threads_bin(scenario_dir: Path, gcc: Path) -> Path:
    path: Path = build.build_threads(scenario_dir / "build", gcc)
    return path


@pytest.fixture(scope="session")
def libcleak_so(scenario_dir: Path, gcc: Path) -> Path:
    path: Path = build.build_libcleak(scenario_dir / "build", gcc)
    return path


@pytest.fixture(scope="session")
def java_tools() -> tuple[Path, Path]:
    java, javac = shutil.which("java"), shutil.which("javac")
    if not java or not javac:
        pytest.skip("no JDK (java and javac): apt-get install default-jdk-headless")
    return Path(java), Path(javac)


@pytest.fixture(scope="session")
def inflater_leak_classes(scenario_dir: Path, java_tools: tuple[Path, Path]) -> Path:
    path: Path = build.build_inflater_leak(scenario_dir / "build", java_tools[1])
    return path


# --------------------------------------------------------------------------------------
# PostgreSQL


@dataclass
class PgInstall:
    bindir: Path  # initdb, postgres, pg_ctl, pg_isready, psql
    pg_config: Path
    major: int

    def tool(self, name: str) -> Path:
        return self.bindir / name


def _pg_major(text: str) -> int | None:
    m = re.search(r"(?:PostgreSQL|postgres \(PostgreSQL\))\s+(\d+)", text)
    return int(m.group(1)) if m else None


@pytest.fixture(scope="session")
def postgres_install() -> PgInstall:
    """PostgreSQL 15 server binaries and the pg_config (server headers) of that major."""
    pg_config = shutil.which("pg_config") or "/usr/bin/pg_config"
    if not Path(pg_config).is_file():
        pytest.skip("pg_config not found: apt-get install postgresql-server-dev-15")
    try:
        bindir = Path(build.pg_config_value(pg_config, "--bindir"))
        version = build.pg_config_value(pg_config, "--version")
    except build.ScenarioBuildError as e:
        pytest.skip(f"pg_config failed: {e}")
    for cand in (bindir, Path(f"/usr/lib/postgresql/{PG_VERSION}/bin")):
        if (cand / "postgres").is_file() and (cand / "initdb").is_file():
            bindir = cand
            break
    else:
        pytest.skip(
            f"no PostgreSQL server (postgres, initdb) in {bindir}: "
            f"apt-get install postgresql-{PG_VERSION}"
        )
    server = subprocess.run(
        [str(bindir / "postgres"), "--version"], capture_output=True, text=True, check=False
    ).stdout
    major, headers = _pg_major(server), _pg_major(version)
    if major is None or major != headers:
        pytest.skip(
            f"server {server.strip()!r} and headers ({version}) differ in major "
            "version: install the matching postgresql-server-dev package"
        )
    include = Path(build.pg_config_value(pg_config, "--includedir-server"))
    if not (include / "postgres.h").is_file():
        pytest.skip(f"{include}/postgres.h missing: apt-get install postgresql-server-dev-{major}")
    for tool in ("pg_ctl", "pg_isready", "psql"):
        if not (bindir / tool).is_file():
            pytest.skip(f"{bindir / tool} missing: apt-get install postgresql-client-{major}")
    return PgInstall(bindir, Path(pg_config), major)


@dataclass
class PgCluster:
    """An initdb'd cluster in a directory the server's user can reach (not pytest's
    0700 tmp): ``base`` (0755) holds ``data`` (owner's, 0700), ``sock`` and ``lib``."""

    install: PgInstall
    base: Path
    data: Path
    sock: Path
    user: str | None  # run the server as this user (we are root), None = as ourselves
    as_user: list[str]  # command prefix running a command as that user
    uid: int
    gid: int

    def server_cmd(self) -> list[str]:
        return [
            *self.as_user,
            str(self.install.tool("postgres")),
            "-D",
            str(self.data),
            "-k",
            str(self.sock),
            "-c",
            "listen_addresses=",
            "-c",
            "fsync=off",
        ]

    def owned_dir(self, path: Path, mode: int = 0o755) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        if self.user is not None:
            os.chown(path, self.uid, self.gid)
        path.chmod(mode)
        return path

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[Any]:
        """Start ``argv`` (the server, possibly behind heapscope) in its own session, its
        output going to ``log``."""
        with log.open("w") as out:
            return subprocess.Popen(argv, cwd=self.base, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    @contextlib.contextmanager
    def serving(self, argv: list[str], env: dict[str, str], log: Path, *,
                forward: bool = True) -> Iterator[subprocess.Popen[Any]]:
        """The server started behind ``argv`` and accepting connections; leaving the block
        sends SIGTERM to ``argv`` (heapscope forwards it: a smart shutdown), or with
        ``forward=False`` stops the server with ``pg_ctl stop -m fast`` (which does not wait
        for sessions), then waits for ``argv`` to finish; the cluster is stopped in any
        case."""
        proc = self.start(argv, env, log)
        try:
            self.wait_ready(proc, log)
            yield proc
            if forward:
                proc.send_signal(signal.SIGTERM)
            else:
                self.stop("fast")
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                tree = subprocess.run(["ps", "-eo", "pid,ppid,etime,stat,wchan:20,cmd"],
                                      capture_output=True, text=True, check=False).stdout
                raise ScenarioError(f"{argv[:4]} still running 180 s after the server "
                                    f"stopped; its log:\n{_tail(log, 40)}\nprocesses:\n"
                                    + "\n".join(ln for ln in tree.splitlines()
                                                if "postgres" in ln or "heapscope" in ln
                                                or "gdb" in ln or "runuser" in ln)) from None
        except BaseException:
            if proc.poll() is None:
                proc.kill()
            raise
        finally:
            self.stop("immediate")

    def wait_ready(self, proc: subprocess.Popen[Any], log: Path, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ScenarioError(
                    f"server exited {proc.returncode} before accepting connections:\n{_tail(log)}"
                )
            ready = subprocess.run(
                [str(self.install.tool("pg_isready")), "-q", "-h", str(self.sock), "-t", "1"],
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.1)
        raise ScenarioError(f"server not ready after {timeout}s:\n{_tail(log)}")

    def psql(self, *commands: str, timeout: float = 120) -> list[str]:
        """Run *commands* in ONE psql session (one backend); returns output lines."""
        argv = [
            str(self.install.tool("psql")),
            "-h",
            str(self.sock),
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-X",
            "-A",
            "-t",
            "-v",
            "ON_ERROR_STOP=1",
        ]
        for c in commands:
            argv += ["-c", c]
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=clean_env()
        )
        if proc.returncode != 0:
            raise ScenarioError(f"psql failed ({proc.returncode}): {proc.stderr}")
        return [line for line in proc.stdout.splitlines() if line.strip()]

    def pgbench(self, script: Path, clients: int, rate: int | None, app: str,
                seconds: int) -> subprocess.Popen[str]:
        """pgbench running ``script`` for ``seconds`` with ``clients`` (at ``rate``
        transactions a second when given) under application_name ``app``; its output is
        the Popen's stdout."""
        argv = [str(self.install.tool("pgbench")), "-n", "-h", str(self.sock), "-U",
                "postgres", "-c", str(clients), "-T", str(seconds), "-f", str(script)]
        if rate:
            argv += ["-R", str(rate)]
        env = dict(clean_env(), PGAPPNAME=app)
        return subprocess.Popen([*argv, "postgres"], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def backends(self, app: str) -> list[int]:
        """The pids of the backends serving application_name ``app``."""
        out = self.psql(f"SELECT pid FROM pg_stat_activity WHERE application_name = '{app}'")
        return [int(x) for x in out if x.strip().isdigit()]

    def leak_session(self, module: Path, calls: int = PG_LEAK_CALLS) -> int:
        """In one session: create leak_top from *module*, call it; return the backend pid."""
        sql = build.leakext_sql(module).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
        out = self.psql("SELECT pg_backend_pid()", sql, f"SELECT leak_top({calls})")
        return int(out[0])

    def stop(self, mode: str = "fast") -> None:
        """pg_ctl stop as the server's user (a no-op when it is not running)."""
        if self.postmaster_pid() is None:
            return
        subprocess.run(
            [
                *self.as_user,
                str(self.install.tool("pg_ctl")),
                "stop",
                "-D",
                str(self.data),
                "-m",
                mode,
                "-w",
                "-t",
                "60",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=90,
        )


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({path} unreadable)"


def _as_user_prefix(user: str) -> list[str]:
    runuser = shutil.which("runuser") or (
        "/sbin/runuser" if Path("/sbin/runuser").exists() else None
    )
    if runuser:
        return [runuser, "-u", user, "--"]
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, f"--reuid={user}", f"--regid={user}", "--init-groups", "--"]
    pytest.skip(
        "running as root and neither runuser nor setpriv (util-linux) is installed "
        "to start PostgreSQL as the postgres user"
    )


@pytest.fixture(scope="session")
def leakext_so(pg_cluster: PgCluster, gcc: Path) -> Path:
    """leakext.so, in a directory the server's user can read."""
    lib = pg_cluster.base / "lib"
    lib.mkdir(exist_ok=True)
    lib.chmod(0o755)
    path: Path = build.build_leakext(lib, pg_cluster.install.pg_config, gcc)
    path.chmod(0o755)
    return path


@pytest.fixture(scope="session")
def pg_cluster(postgres_install: PgInstall) -> Iterator[PgCluster]:
    """initdb once. As root the cluster belongs to the ``postgres`` user (PostgreSQL
    refuses to run as root); its base directory is a 0755 mkdtemp under /tmp because
    pytest's temp root is 0700 and the server could not reach it."""
    user: str | None = None
    uid, gid = os.getuid(), os.getgid()
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip(
                "running as root and there is no 'postgres' user to run the server "
                "as (PostgreSQL refuses to run as root): apt-get install "
                "postgresql-15 creates it"
            )
        user, uid, gid = "postgres", pw.pw_uid, pw.pw_gid
        as_user = _as_user_prefix(user)
    base = Path(tempfile.mkdtemp(prefix="hs-pg-", dir="/tmp")).resolve()
    base.chmod(0o755)
    cluster = PgCluster(
        postgres_install, base, base / "data", base / "sock", user, as_user, uid, gid
    )
    try:
        cluster.owned_dir(cluster.data, 0o700)
        cluster.owned_dir(cluster.sock, 0o755)
        proc = subprocess.run(
            [
                *as_user,
                str(postgres_install.tool("initdb")),
                "-D",
                str(cluster.data),
                "-U",
                "postgres",
                "--auth=trust",
                "-N",
                "-E",
                "UTF8",
                "--locale=C",
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
            env=clean_env(),
        )
        if proc.returncode != 0:
            raise ScenarioError(f"initdb failed ({proc.returncode}):\n{proc.stderr}")
        yield cluster
    finally:
        cluster.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------------------
# The scenario runs (one heapscope run each)

PREFORK_PIDS = r"^role=(?P<role>master|worker index=\d) pid=(?P<pid>\d+)"


@pytest.fixture(scope="session")
def prefork_run(
    prefork_bin: Path, scenario_dir: Path, heapscope_cache: Path, libjemalloc: Path
) -> ScenarioRun:
    """prefork.c: roles 'master', 'worker index=1..3'; worker 2 leaks."""
    work = scenario_dir / "run_prefork"
    work.mkdir()
    run = heapscope_run("prefork", work / "session", [prefork_bin], heapscope_cache, cwd=work)
    run.pids = parse_pids(run.stdout, PREFORK_PIDS)
    return run


@pytest.fixture(scope="session")
def threads_run(
    threads_bin: Path, scenario_dir: Path, heapscope_cache: Path, libjemalloc: Path
) -> ScenarioRun:
    work = scenario_dir / "run_threads"
    work.mkdir()
    run = heapscope_run("threads", work / "session", [threads_bin], heapscope_cache, cwd=work)
    run.pids = parse_pids(run.stdout, r"^(?P<role>pid)=(?P<pid>\d+)$")
    return run


@pytest.fixture(scope="session")
def ctypes_run(
    libcleak_so: Path, scenario_dir: Path, heapscope_cache: Path, libjemalloc: Path
) -> ScenarioRun:
    """python3 leaky.py libcleak.so: the interpreter running the tests (sys.executable)."""
    work = scenario_dir / "run_ctypes"
    work.mkdir()
    cmd: list[str | Path] = [sys.executable, build.LEAKY_PY, libcleak_so, str(CTYPES_RECORDS)]
    run = heapscope_run(
        "ctypes",
        work / "session",
        cmd,
        heapscope_cache,
        cwd=work,
        env={"PYTHONDONTWRITEBYTECODE": "1"},
    )
    run.pids = parse_pids(run.stdout, r"^(?P<role>pid)=(?P<pid>\d+) records=")
    return run


@pytest.fixture(scope="session")
def inflater_run(
    inflater_leak_classes: Path,
    java_tools: tuple[Path, Path],
    scenario_dir: Path,
    heapscope_cache: Path,
    libjemalloc: Path,
) -> ScenarioRun:
    """java InflaterLeak, with a perf map for its JIT frames (removed from /tmp after)."""
    work = scenario_dir / "run_inflater"
    work.mkdir()
    cmd: list[str | Path] = [
        java_tools[0],
        "-XX:+UnlockDiagnosticVMOptions",
        "-XX:+DumpPerfMapAtExit",
        "-Xmx256m",
        "-cp",
        inflater_leak_classes,
        "InflaterLeak",
        str(INFLATERS),
    ]
    run = heapscope_run("inflater", work / "session", cmd, heapscope_cache, cwd=work)
    run.pids = parse_pids(run.stdout, r"^(?P<role>pid)=(?P<pid>\d+) inflaters=")
    if "pid" in run.pids:  # ours, made by this run: keep /tmp clean
        Path(f"/tmp/perf-{run.pids['pid']}.map").unlink(missing_ok=True)
    return run


@pytest.fixture(scope="session")
def postgres_run(
    pg_cluster: PgCluster, leakext_so: Path, heapscope_cache: Path, libjemalloc: Path
) -> Iterator[ScenarioRun]:
    """heapscope run -- [runuser -u postgres --] postgres -D DATA -k SOCK …; one psql
    session calls leak_top(200000) and disconnects; then SIGTERM to heapscope (which must
    forward it: smart shutdown). pids: 'backend' (pg_backend_pid), 'postmaster'.

    SESSION is NOT pre-created: the server's processes (uid postgres) write their dumps
    into it, so heapscope itself must make SESSION/dumps writable for them."""
    session = pg_cluster.base / "session"
    log = pg_cluster.base / "postgres-run.log"
    argv = run_argv(session, pg_cluster.server_cmd())
    with pg_cluster.serving(argv, heapscope_env(heapscope_cache), log) as proc:
        postmaster = pg_cluster.postmaster_pid()
        backend = pg_cluster.leak_session(leakext_so)
    output = log.read_text(errors="replace")
    run = load_report("postgres", argv, session, proc.returncode, output, output)
    run.pids = {"backend": backend}
    if postmaster is not None:
        run.pids["postmaster"] = postmaster
    yield run
