"""``heapscope agent``: watch processes continuously and serve their leak verdicts to
Prometheus."""

from __future__ import annotations

import argparse
import re
import signal
import sys
import threading
import time
from types import FrameType

from heapscope.cli.common import add_symbol_options, symbol_options
from heapscope.errors import UsageError

DEFAULT_LISTEN = "127.0.0.1:9464"
DEFAULT_STATE = "/var/lib/heapscope/agent"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``agent`` subcommand."""
    p = sub.add_parser(
        "agent", help="watch processes continuously; serve leak verdicts on /metrics",
        description="Dump each target every few seconds through the attach path, judge a "
                    "rolling window of its dumps with the leak verdicts of 'heapscope leaks', "
                    "and serve per-process and per-site metrics for Prometheus. Targets "
                    "must run with jemalloc's profiling on (MALLOC_CONF=prof:true).")
    p.add_argument("--pid", type=int, action="append", default=[], metavar="PID",
                   help="watch this process (repeatable)")
    p.add_argument("--match", action="append", default=[], metavar="REGEX",
                   help="watch every process whose command line matches (repeatable; "
                        "new ones are picked up, exited ones dropped)")
    p.add_argument("--unit", action="append", default=[], metavar="NAME",
                   help="watch the main process of this systemd service (repeatable)")
    p.add_argument("--every", type=float, default=60.0, metavar="SECONDS",
                   help="seconds between rounds (default 60)")
    p.add_argument("--window", type=int, default=30, metavar="N",
                   help="dumps judged per process (default 30; older ones are deleted)")
    p.add_argument("--top", type=int, default=10, metavar="K",
                   help="sites per process with their own series (default 10; the rest are "
                        "summed as function=\"other\")")
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where /metrics is served (default {DEFAULT_LISTEN}; another "
                        "address exposes it to the network)")
    p.add_argument("--state", default=DEFAULT_STATE, metavar="DIR",
                   help=f"the agent's dumps and windows (default {DEFAULT_STATE})")
    p.add_argument("--pyroscope", metavar="URL",
                   help="also push each dump as pprof to this Grafana Pyroscope server "
                        "(e.g. http://pyroscope:4040)")
    p.add_argument("--push-queue", type=int, default=64, metavar="N",
                   help="profiles kept while the backend is down (default 64; the oldest "
                        "are dropped and counted)")
    p.add_argument("--max-disk", default="1G", metavar="SIZE",
                   help="bytes of dumps kept in the state folder over all targets (default "
                        "1G; the oldest go first, each process keeps its two newest)")
    p.add_argument("--min-free", default="256M", metavar="SIZE",
                   help="take no dump while the state's disk has less free (default 256M; "
                        "skipped dumps are counted)")
    p.add_argument("--rounds", type=int, default=0, metavar="N",
                   help="stop after N rounds (default: run until SIGTERM)")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                   help="bound on one attach (default 30)")
    add_symbol_options(p)
    p.set_defaults(func=run)


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]"), int(port)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope agent``."""
    from prometheus_client import start_http_server

    from heapscope.agent.metrics import registry
    from heapscope.agent.targets import Selection
    from heapscope.agent.watch import Agent, AgentOptions
    from heapscope.units import parse_size

    if not (args.pid or args.match or args.unit):
        raise UsageError("nothing to watch: give --pid, --match or --unit")
    if args.every <= 0 or args.window < 2 or args.top < 1:
        raise UsageError("--every must be positive, --window at least 2, --top at least 1")
    try:
        patterns = [re.compile(m) for m in args.match]
    except re.error as e:
        raise UsageError(f"--match: {e}") from None
    host, port = _listen(args.listen)
    pusher = None
    if args.pyroscope:
        from heapscope.agent.push import Pusher

        if not args.pyroscope.startswith(("http://", "https://")):
            raise UsageError(f"--pyroscope {args.pyroscope}: give an http:// or https:// URL")
        if args.push_queue < 1:
            raise UsageError("--push-queue must be at least 1")
        pusher = Pusher(args.pyroscope, limit=args.push_queue)
    agent = Agent(Selection(args.pid, patterns, args.unit),
                  AgentOptions(args.state, args.window, args.timeout, symbol_options(args),
                               max_disk=parse_size(args.max_disk, "--max-disk"),
                               min_free=parse_size(args.min_free, "--min-free")),
                  pusher=pusher)
    reg, pause = registry(agent, args.top)
    agent.on_pause = pause.observe
    try:
        server, thread = start_http_server(port, addr=host, registry=reg)
    except OSError as e:
        raise UsageError(f"--listen {args.listen}: {e.strerror or e}") from None
    print(f"heapscope agent: serving http://{args.listen}/metrics, state in {args.state}",
          file=sys.stderr)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()  # the round under way finishes (a dump is never cut short)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    rounds = 0
    try:
        while not stop.is_set():
            began = time.monotonic()
            agent.round()
            rounds += 1
            if args.rounds and rounds >= args.rounds:
                break
            stop.wait(max(0.0, args.every - (time.monotonic() - began)))
    finally:
        if pusher is not None:
            pusher.close()  # what is queued gets a last chance to go out
        server.shutdown()
        thread.join(timeout=5)
    return 0
