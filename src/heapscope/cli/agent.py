"""``heapscope agent``: watch processes continuously and serve their leak verdicts to
Prometheus."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

from heapscope.agent.config import AT_START, Settings
from heapscope.cli.commands import summary
from heapscope.cli.common import add_symbol_options, symbol_options
from heapscope.errors import HeapscopeError, UsageError
from heapscope.netaddr import is_loopback
from heapscope.terminal import clean

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry

    from heapscope.agent.watch import Agent
    from heapscope.symbols import SymbolOptions

DEFAULT_LISTEN = "127.0.0.1:9464"
DEFAULT_STATE = "/var/lib/heapscope/agent"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``agent`` subcommand."""
    p = sub.add_parser(
        "agent", help=summary("agent"),
        description="Dump each target every few seconds through the attach path, judge a "
                    "rolling window of its dumps with the leak verdicts of 'heapscope leaks', "
                    "and serve per-process and per-site metrics for Prometheus (and push "
                    "each dump to Pyroscope). Targets must run with jemalloc's profiling on "
                    "(MALLOC_CONF=prof:true). SIGHUP re-reads --config; SIGTERM finishes "
                    "the round under way and stops.")
    p.add_argument("--config", metavar="FILE",
                   help="a TOML file with these settings and [[target]] tables; flags win")
    p.add_argument("--pid", type=int, action="append", default=[], metavar="PID",
                   help="watch this process (repeatable)")
    p.add_argument("--pidfile", action="append", default=[], metavar="PATH",
                   help="watch the process whose pid this file holds, read again every "
                        "round (repeatable)")
    p.add_argument("--match", action="append", default=[], metavar="REGEX",
                   help="watch every process whose command line matches (repeatable; "
                        "new ones are picked up, exited ones dropped)")
    p.add_argument("--unit", action="append", default=[], metavar="NAME",
                   help="watch the main process of this systemd service (repeatable)")
    p.add_argument("--dumps", action="append", default=[], metavar="DIR",
                   help="read the dumps services write themselves into DIR (prof_interval, "
                        "prof_gdump; e.g. set up by 'heapscope env'): no attach, nothing "
                        "there is deleted (repeatable)")
    p.add_argument("--every", type=float, metavar="SECONDS",
                   help="seconds between rounds (default 60)")
    p.add_argument("--window", type=int, metavar="N",
                   help="dumps judged per process (default 30; older ones are deleted)")
    p.add_argument("-n", "--top", type=int, metavar="N",
                   help="sites per process with their own series (default 10; the rest are "
                        "summed as function=\"other\")")
    p.add_argument("--listen", metavar="HOST:PORT",
                   help=f"where /metrics is served (default {DEFAULT_LISTEN}; another "
                        "address exposes it to the network)")
    p.add_argument("--state", metavar="DIR",
                   help=f"the agent's dumps and windows (default {DEFAULT_STATE})")
    p.add_argument("--max-disk", metavar="SIZE",
                   help="bytes of dumps kept in the state folder over all targets (default "
                        "1G; the oldest go first, each process keeps its two newest)")
    p.add_argument("--min-free", metavar="SIZE",
                   help="take no dump while the state's disk has less free (default 256M; "
                        "skipped dumps are counted)")
    p.add_argument("--pyroscope", metavar="URL",
                   help="also push each dump as pprof to this Grafana Pyroscope server "
                        "(e.g. http://pyroscope:4040)")
    p.add_argument("--parca", metavar="URL",
                   help="also push each dump as pprof to this Parca server (WriteRaw over "
                        "HTTP, e.g. http://parca:7070)")
    p.add_argument("--push-queue", type=int, metavar="N",
                   help="profiles kept while the backend is down (default 64; the oldest "
                        "are dropped and counted)")
    p.add_argument("--active", type=float, metavar="SECONDS",
                   help="duty cycle: sample (prof.active) only SECONDS before each dump, "
                        "off otherwise, to bound the overhead; the profile then holds what "
                        "those windows allocated (default 0: always on)")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="bound on one attach (default 30)")
    p.add_argument("--tls-cert", metavar="FILE",
                   help="serve /metrics over HTTPS with this certificate (PEM; with --tls-key)")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument("--tls-client-ca", metavar="FILE",
                   help="answer only clients whose certificate this CA signed (mutual TLS: "
                        "the scraper authenticates)")
    p.add_argument("--rounds", type=int, default=0, metavar="N",
                   help="stop after N rounds (default: run until SIGTERM)")
    add_symbol_options(p)
    p.set_defaults(func=run)


def _serve(s: Settings, host: str, port: int, reg: CollectorRegistry
           ) -> tuple[WSGIServer, threading.Thread]:
    """Start serving /metrics: plain HTTP, or HTTPS (TLS 1.2 at least) when a certificate
    is given, asking every client for a certificate signed by ``tls_client_ca`` when set."""
    import ssl

    from prometheus_client import start_http_server

    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(s, name)
        if path and not os.path.isfile(path):  # a FIFO would block the TLS set-up
            raise UsageError(f"--{name.replace('_', '-')} {path}: no such file")
    try:
        return start_http_server(
            port, addr=host, registry=reg, certfile=s.tls_cert or None,
            keyfile=s.tls_key or None, client_cafile=s.tls_client_ca or None,
            client_auth_required=bool(s.tls_client_ca),
            tls_min_version=ssl.TLSVersion.TLSv1_2 if s.tls_cert else None)
    except ssl.SSLError as e:
        raise UsageError(f"--tls-cert/--tls-key/--tls-client-ca: cannot use them "
                         f"({e.reason or e})") from None
    except OSError as e:
        raise UsageError(f"--listen {s.listen}: {e.strerror or e}") from None


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text}: give HOST:PORT, e.g. {DEFAULT_LISTEN}")
    return host.strip("[]"), int(port)


def settings(args: argparse.Namespace) -> Settings:
    """The config file's settings, overridden by the flags given."""
    from heapscope.agent.config import load, merge
    from heapscope.units import parse_size

    flags: dict[str, Any] = {
        "pids": args.pid, "matches": args.match, "units": args.unit, "folders": args.dumps,
        "pidfiles": args.pidfile,
        "every": args.every,
        "window": args.window, "top": args.top, "listen": args.listen, "state": args.state,
        "pyroscope": args.pyroscope, "parca": args.parca, "push_queue": args.push_queue,
        "timeout": args.timeout, "active": args.active, "tls_cert": args.tls_cert,
        "tls_key": args.tls_key, "tls_client_ca": args.tls_client_ca,
        "max_disk": parse_size(args.max_disk, "--max-disk") if args.max_disk else None,
        "min_free": parse_size(args.min_free, "--min-free") if args.min_free else None,
    }
    s = merge(load(args.config) if args.config else {}, flags)
    bad = s.problems()
    if bad:
        raise UsageError(bad[0])
    return s


def _apply(agent: Agent, s: Settings, symbols: SymbolOptions) -> None:
    """Give a running agent new settings (those that can change while it runs)."""
    from heapscope.agent.targets import Selection
    from heapscope.agent.watch import AgentOptions

    agent.sel = Selection(list(s.pids), [re.compile(m) for m in s.matches], list(s.units),
                          [os.path.abspath(f) for f in s.folders], list(s.pidfiles))
    agent.opts = AgentOptions(agent.opts.state, s.window, s.timeout, symbols,
                              max_disk=s.max_disk, min_free=s.min_free, active=s.active)


def run(args: argparse.Namespace) -> int:
    """Execute ``heapscope agent``."""
    from heapscope.agent.metrics import registry
    from heapscope.agent.push import Pusher
    from heapscope.agent.targets import Selection
    from heapscope.agent.watch import Agent, AgentOptions

    s = settings(args)
    host, port = _listen(s.listen)
    symbols = symbol_options(args)
    pushers = [Pusher(url, backend=name, limit=s.push_queue)
               for name, url in (("pyroscope", s.pyroscope), ("parca", s.parca)) if url]
    agent = Agent(Selection([], [], []), AgentOptions(s.state), pushers=pushers)
    _apply(agent, s, symbols)
    reg, pause = registry(agent, lambda: s.top)
    agent.on_pause = pause.observe
    server, thread = _serve(s, host, port, reg)
    scheme = "https" if s.tls_cert else "http"
    print(f"heapscope agent: serving {scheme}://{s.listen}/metrics, state in {s.state}",
          file=sys.stderr)
    if not is_loopback(host) and not s.tls_client_ca:
        how = ("encrypted, but any client may read it" if s.tls_cert
               else "with no encryption and no authentication")
        print(f"heapscope agent: warning: /metrics on {s.listen} can be read from the "
              f"network {how}, and it names process ids, programs, functions and source "
              "files; give --tls-cert, --tls-key and --tls-client-ca (scrapers present a "
              "certificate), or listen on 127.0.0.1 behind a proxy that authenticates "
              "(README: the agent)", file=sys.stderr)
    stop = threading.Event()
    reload = threading.Event()

    def on_stop(signum: int, frame: FrameType | None) -> None:
        stop.set()  # the round under way finishes (a dump is never cut short)

    def on_hup(signum: int, frame: FrameType | None) -> None:
        reload.set()
        stop.set()  # wake the wait; the loop tells a reload from a stop

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    rounds = 0
    try:
        while True:
            if reload.is_set():
                reload.clear()
                stop.clear()
                s = _reload(args, s, agent, symbols)
            if stop.is_set():
                break
            began = time.monotonic()
            agent.round()
            rounds += 1
            if args.rounds and rounds >= args.rounds:
                break
            stop.wait(max(0.0, s.every - (time.monotonic() - began)))
        agent.finish()
    finally:
        for pusher in pushers:
            pusher.close()  # what is queued gets a last chance to go out
        server.shutdown()
        thread.join(timeout=5)
    return 0


def _reload(args: argparse.Namespace, old: Settings, agent: Agent,
            symbols: SymbolOptions) -> Settings:
    """SIGHUP: read the config again; keep the old settings when the new ones are bad."""
    try:
        new = settings(args)
    except HeapscopeError as e:
        print(f"heapscope agent: config not reloaded: {clean(str(e))}", file=sys.stderr)
        return old
    ignored = [k for k in AT_START if getattr(new, k) != getattr(old, k)]
    for k in ignored:
        setattr(new, k, getattr(old, k))
    _apply(agent, new, symbols)
    print("heapscope agent: config reloaded"
          + (f" ({', '.join(ignored)} change at the next start)" if ignored else ""),
          file=sys.stderr)
    return new
