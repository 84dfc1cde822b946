#!/usr/bin/env bash
# Set everything up, then find the leak in the bundled demo program with heapscope.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

work="$(mktemp -d "${TMPDIR:-/tmp}/heapscope-demo.XXXXXX")"
gcc -O1 -g -o "$work/leaky-server" demo/leaky_server.c -lpthread

# Today's manual recipe, done for you: preload a profiling jemalloc, sample every 4 KiB, dump
# at exit. (The `heapscope run` command will do this in one step.)
lib="$(ls /usr/lib/*/libjemalloc.so.2 | head -n1)"
LD_PRELOAD="$lib" \
MALLOC_CONF="prof:true,prof_final:true,lg_prof_sample:12,prof_prefix:$work/jeprof" \
    "$work/leaky-server"

dump="$(ls "$work"/jeprof.*.f.heap)"
echo
echo "\$ heapscope top --lines $dump"
.venv/bin/heapscope top --lines -n 12 "$dump"
