"""What ``heapscope agent`` costs: CPU and memory of the agent, the pause each target sees,
and the bytes per dump on disk and on the wire.

Starts TARGETS services under jemalloc with profiling, runs the agent for ROUNDS rounds
every EVERY seconds (window WINDOW) with a local Pyroscope-style sink, and prints one line per
measure. Not a test: numbers for the README's sizing table. The services:

- ``--kind small`` (default): tests/e2e/agentprog/agentsvc.c, ~10 stacks, half leaking, half
  with a bounded cache, at jemalloc's default sample period;
- ``--kind sites``: bench/many_sites_svc.c with 2^BITS stacks (2,048 by default), sampled
  at 128 bytes so every dump lists all of them.

The figure that matters for a fleet is the steady state: the agent's CPU per dump once every
window is full and slides (rounds past WINDOW + 1), start-up and the first naming of every
address left out. It is printed as the share of one core that 100 targets cost at one dump
a minute (the agent's CPU, its tracer's and its symbolizer's together).

    .venv/bin/python bench/agent_cost.py [--targets 10] [--every 30] [--rounds 6]
    .venv/bin/python bench/agent_cost.py --targets 100 --every 4 --window 10 --rounds 16
    .venv/bin/python bench/agent_cost.py --kind sites --targets 10 --every 3 --window 30 --rounds 36
"""

from __future__ import annotations

import argparse
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "e2e" / "agentprog" / "agentsvc.c"
SITES_SOURCE = ROOT / "bench" / "many_sites_svc.c"
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its waited-for children (tracers, symbolizers)."""
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / TICK


def peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


class Sink:
    """Counts what a Pyroscope /ingest would receive."""

    def __init__(self) -> None:
        self.bodies: list[int] = []
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers["Content-Length"])
                self.rfile.read(n)
                sink.bodies.append(n)
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def dumps_in(metrics: str) -> float:
    """Dumps taken, over every target, in a /metrics page."""
    return sum(float(m) for m in re.findall(r"^heapscope_dumps_total\{[^}]*\} (\S+)",
                                            metrics, re.M))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=int, default=10)
    ap.add_argument("--every", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--window", type=int, default=30, help="the agent's --window")
    ap.add_argument("--kind", choices=("small", "sites"), default="small")
    ap.add_argument("--bits", type=int, default=11, help="--kind sites: 2^BITS stacks")
    ap.add_argument("--no-push", action="store_true", help="no Pyroscope sink")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="heapscope-agent-bench-"))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    if args.kind == "small":
        exe = work / "agentsvc"
        # -O1 as the e2e tests build it
        subprocess.run(["gcc", "-O1", "-g", "-o", str(exe), str(SOURCE)], check=True)
        env_t = {**env, "LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "prof:true"}  # 512 KiB
        argvs = [[str(exe), "leak" if i % 2 == 0 else "cache"] for i in range(args.targets)]
    else:
        exe = work / "many_sites_svc"
        # -O0: the two call sites of each level must not be merged into one
        subprocess.run(["gcc", "-O0", "-g", "-fno-omit-frame-pointer", "-o", str(exe),
                        str(SITES_SOURCE)], check=True)
        env_t = {**env, "LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "prof:true,lg_prof_sample:7"}
        argvs = [[str(exe), str(args.bits)] for _ in range(args.targets)]
    targets = [subprocess.Popen(argv, env=env_t, stdout=subprocess.DEVNULL) for argv in argvs]
    sink = Sink()
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "heapscope.cli.main", "agent", "--match",
         "^" + re.escape(str(exe)) + " ", "--every", str(args.every), "--state",
         str(work / "state"), "--window", str(args.window), "--listen",
         f"127.0.0.1:{port}", "--rounds", str(args.rounds),
         *([] if args.no_push else ["--pyroscope", f"http://127.0.0.1:{sink.port}"])],
        env={**env, "HEAPSCOPE_CACHE_DIR": str(work / "cache")}, stderr=subprocess.PIPE,
        text=True)
    metrics = ""
    cpu = rss = 0.0
    trace: list[tuple[float, float]] = []  # (dumps taken, agent CPU seconds) as it went
    try:
        deadline = time.monotonic() + args.rounds * args.every + 300
        while agent.poll() is None and time.monotonic() < deadline:
            try:
                cpu, rss = cpu_seconds(agent.pid), peak_rss(agent.pid)
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as r:
                    metrics = r.read().decode()
                trace.append((dumps_in(metrics), cpu))
            except OSError:
                pass
            time.sleep(float(os.environ.get("SCRAPE_EVERY", "0.5")))
        agent.wait(timeout=120)
    finally:
        for t in targets:
            t.send_signal(signal.SIGTERM)
            t.wait(timeout=20)
    dumps = dumps_in(metrics)
    pause_sum = re.search(r"^heapscope_attach_pause_seconds_sum (\S+)", metrics, re.M)
    pause_n = re.search(r"^heapscope_attach_pause_seconds_count (\S+)", metrics, re.M)
    sizes = [f.stat().st_size for f in (work / "state").rglob("*.heap")]
    print(f"targets {args.targets}, a round every {args.every:g} s, {args.rounds} rounds, "
          f"{int(dumps)} dumps seen by the last scrape")
    print(f"agent CPU            {cpu:.1f} s in all ({cpu / max(dumps, 1):.2f} s per dump, "
          "tracer and symbolizer children included)")
    print(f"agent peak RSS       {rss / 2**20:.0f} MiB")
    full = args.targets * (args.window + 1)  # every window full and sliding past this
    steady = [(d, c) for d, c in trace if d >= full]
    if len(steady) >= 2 and steady[-1][0] > steady[0][0]:
        per = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0])
        print(f"steady state         {1000 * per:.1f} ms CPU per dump (over "
              f"{int(steady[-1][0] - steady[0][0])} dumps with every window of {args.window} "
              f"full): 100 targets at one dump a minute cost {100 * per / 60:.1%} of one core")
    else:
        print(f"steady state         not reached: run more than {args.window + 1} rounds")
    if pause_sum and pause_n and float(pause_n.group(1)):
        mean = 1000 * float(pause_sum.group(1)) / float(pause_n.group(1))
        print(f"pause per dump       {mean:.2f} ms (mean, one thread of the target held)")
    if sizes:
        print(f"dump on disk         {sum(sizes) / len(sizes) / 1024:.0f} KiB (mean)")
    if sink.bodies:
        print(f"pprof pushed         {sum(sink.bodies) / len(sink.bodies) / 1024:.1f} KiB per "
              f"dump (mean of {len(sink.bodies)})")
    said = agent.stderr.read().splitlines() if agent.stderr else []
    # one "watching" line per target says nothing a reader needs
    print("".join(f"{line}\n" for line in said if ": watching " not in line), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
