/* leakext.c: a tiny PostgreSQL 15 extension that leaks in TopMemoryContext, for
 * heapscope's `run` end-to-end tests (after "Debugging memory leaks in Postgres, jemalloc
 * edition", which leaks palloc(100) into TopMemoryContext from drandom()).
 *
 * leak_top(n) switches to TopMemoryContext and pallocs LEAK_BYTES n times, keeping
 * nothing: the chunks stay allocated until the backend exits. Valgrind and LeakSanitizer
 * miss this (TopMemoryContext is reset at exit), jemalloc's heap profile does not: the
 * final dump of the client backend holds the aset.c blocks allocated under leak_top.
 *
 * TRUTH: SELECT leak_top(200000) leaks 200,000 x (100 B + chunk header) ~ 22 MB of
 * AllocSet blocks in the client backend that ran it; the postmaster and the other
 * auxiliary processes leak nothing of the kind.
 * Expected first suspect: function leak_top (leakext.c), pid = that backend's
 * pg_backend_pid(). (The allocating frames below it are AllocSetAlloc* in postgres.)
 *
 * leak_blocks(n, size) pallocs n chunks of size bytes into TopMemoryContext the same way.
 * Chunks over AllocSet's chunk limit (8 kB) get a block of their own, one malloc each, so
 * the leak grows in step with the calls (leak_top's 100-byte chunks share blocks that
 * double in size up to 8 MB: a staircase of a few big steps).
 *
 * Build: gcc -O1 -g -fPIC -shared -I$(pg_config --includedir-server) leakext.c
 *        -o leakext.so   (see tests/e2e/scenarios.py: build_leakext)
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/memutils.h"

PG_MODULE_MAGIC;

#define LEAK_BYTES 100

PG_FUNCTION_INFO_V1(leak_top);

Datum
leak_top(PG_FUNCTION_ARGS)
{
    int32 n = PG_GETARG_INT32(0);
    MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

    for (int32 i = 0; i < n; i++) {
        int *s = palloc(LEAK_BYTES);
        *s = i;
    }
    MemoryContextSwitchTo(old);
    PG_RETURN_VOID();
}

PG_FUNCTION_INFO_V1(leak_blocks);

Datum
leak_blocks(PG_FUNCTION_ARGS)
{
    int32 n = PG_GETARG_INT32(0);
    int32 size = PG_GETARG_INT32(1);
    MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

    for (int32 i = 0; i < n; i++) {
        char *s = palloc(size);
        s[0] = (char) i;
    }
    MemoryContextSwitchTo(old);
    PG_RETURN_VOID();
}
