#!/usr/bin/env bash
# Set everything up, then find the leak in the bundled demo program with heapscope.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

work="$(mktemp -d "${TMPDIR:-/tmp}/heapscope-demo.XXXXXX")"
gcc -O1 -g -o "$work/leaky-server" demo/leaky_server.c

# One command instead of LD_PRELOAD + MALLOC_CONF + jeprof: sample every 4 KiB, dump every
# 0.25 s as it runs, and judge every allocation site (leak, cache, churn) at exit.
echo "\$ heapscope run -o $work/session --sample 4k --every 0.25 -- $work/leaky-server"
.venv/bin/heapscope run -o "$work/session" --sample 4k --every 0.25 -- "$work/leaky-server"
echo
echo "\$ heapscope top --lines -n 8 $work/session"
.venv/bin/heapscope top --lines -n 8 "$work/session"
