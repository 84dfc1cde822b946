"""What ``heapscope agent`` costs: CPU and memory of the agent, the pause each target sees,
and the bytes per dump on disk and on the wire.

Builds tests/e2e/agentprog/agentsvc.c, starts TARGETS copies under jemalloc with profiling
(half leaking, half with a bounded cache), runs the agent for ROUNDS rounds every EVERY
seconds with a local Pyroscope-style sink, and prints one line per measure. Not a test:
numbers for the README's sizing table.

    .venv/bin/python bench/agent_cost.py [--targets 10] [--every 30] [--rounds 6]
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
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="heapscope-agent-bench-"))
    exe = work / "agentsvc"
    subprocess.run(["gcc", "-O1", "-g", "-o", str(exe), str(SOURCE)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_CONF")}
    env_t = {**env, "LD_PRELOAD": JEMALLOC, "MALLOC_CONF": "prof:true"}  # default 512 KiB
    targets = [subprocess.Popen([str(exe), "leak" if i % 2 == 0 else "cache"], env=env_t,
                                stdout=subprocess.DEVNULL) for i in range(args.targets)]
    sink = Sink()
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "heapscope.cli.main", "agent", "--match",
         "^" + re.escape(str(exe)) + " ", "--every", str(args.every), "--state",
         str(work / "state"), "--listen", f"127.0.0.1:{port}", "--pyroscope",
         f"http://127.0.0.1:{sink.port}", "--rounds", str(args.rounds)],
        env={**env, "HEAPSCOPE_CACHE_DIR": str(work / "cache")}, stderr=subprocess.PIPE,
        text=True)
    metrics = ""
    cpu = rss = 0.0
    try:
        deadline = time.monotonic() + args.rounds * args.every + 300
        while agent.poll() is None and time.monotonic() < deadline:
            try:
                cpu, rss = cpu_seconds(agent.pid), peak_rss(agent.pid)
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                            timeout=5) as r:
                    metrics = r.read().decode()
            except OSError:
                pass
            time.sleep(1)
        agent.wait(timeout=120)
    finally:
        for t in targets:
            t.send_signal(signal.SIGTERM)
            t.wait(timeout=20)
    dumps = sum(float(m) for m in re.findall(r"^heapscope_dumps_total\{[^}]*\} (\S+)",
                                             metrics, re.M))
    pause_sum = re.search(r"^heapscope_attach_pause_seconds_sum (\S+)", metrics, re.M)
    pause_n = re.search(r"^heapscope_attach_pause_seconds_count (\S+)", metrics, re.M)
    sizes = [f.stat().st_size for f in (work / "state").rglob("*.heap")]
    print(f"targets {args.targets}, a round every {args.every:g} s, {args.rounds} rounds, "
          f"{int(dumps)} dumps seen by the last scrape")
    print(f"agent CPU            {cpu:.1f} s in all ({cpu / max(dumps, 1):.2f} s per dump, "
          "tracer and symbolizer children included)")
    print(f"agent peak RSS       {rss / 2**20:.0f} MiB")
    if pause_sum and pause_n and float(pause_n.group(1)):
        mean = 1000 * float(pause_sum.group(1)) / float(pause_n.group(1))
        print(f"pause per dump       {mean:.2f} ms (mean, one thread of the target held)")
    if sizes:
        print(f"dump on disk         {sum(sizes) / len(sizes) / 1024:.0f} KiB (mean)")
    if sink.bodies:
        print(f"pprof pushed         {sum(sink.bodies) / len(sink.bodies) / 1024:.1f} KiB per "
              f"dump (mean of {len(sink.bodies)})")
    print(agent.stderr.read() if agent.stderr else "", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
