"""Keeps zlib compressors alive for SECONDS (each holds ~270 KiB of zlib's own state, from
malloc), then exits normally: the interpreter's shutdown frees them all, so jemalloc's exit
dump is taken after a clean teardown.

    python3 zlib_leak.py SECONDS
"""

import sys
import time
import zlib

kept = []
deadline = time.monotonic() + float(sys.argv[1])
print("ready", flush=True)
while time.monotonic() < deadline:
    kept.append(zlib.compressobj(9))  # LEAK:zlib (deflateInit2_ in libz)
    time.sleep(0.02)
print(f"kept {len(kept)}", flush=True)
