"""leaky.py: Python leaking native memory through a C library loaded with ctypes.

Usage: python3 leaky.py /abs/path/libcleak.so [COUNT]

cl_make_record() returns a malloc'd char*; declaring its restype as ctypes.c_char_p makes
ctypes copy the text into a bytes object and lose the pointer, so cl_free_record() is
never called.

TRUTH: COUNT (default 20,000) x 1 KiB = 20,480,000 B leaked in cl_make_record
(libcleak.c) in this python process; Python's own allocations are far smaller.
Prints "pid=P records=N" on stdout.
"""

import ctypes
import os
import sys


def main() -> int:
    lib = ctypes.CDLL(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 20_000
    lib.cl_make_record.argtypes = [ctypes.c_int]
    lib.cl_make_record.restype = ctypes.c_char_p  # the bug: the char* is never freed
    total = 0
    for i in range(count):
        record = lib.cl_make_record(i)
        total += len(record)
    print(f"pid={os.getpid()} records={count} bytes={total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
