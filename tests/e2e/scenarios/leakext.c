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
 * pool_fill(n, size, cap) is a bounded pool, a cache that fills and then stops: it pallocs
 * n chunks of size bytes into a memory context of its own ("leakext pool", a child of
 * TopMemoryContext with ALLOCSET_DEFAULT_SIZES, created on the backend's first call and
 * kept in a static), but only while the context holds fewer than cap bytes of blocks
 * (MemoryContextMemAllocated); once it holds cap bytes a call allocates nothing. Its blocks
 * double like TopMemoryContext's (an 8 kB keeper block, then 8 kB, 16 kB, ... up to 8 MB),
 * so the pool grows in the same staircase as leak_blocks until it stops: with cap = 24 MB
 * the blocks add up to exactly 24 MB (8 kB + 8 kB + ... + 4 MB = 8 MB, then two 8 MB).
 *
 * TRUTH: pool_fill is bounded, never a leak: the backend that calls it holds at most
 * cap bytes (plus the one block that crossed it) in the pool, all of it reachable from
 * the static context for the backend's life, and nothing more however often it is called.
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

/* The backend's pool: created on the first pool_fill, never reset or deleted. */
static MemoryContext pool = NULL;

PG_FUNCTION_INFO_V1(pool_fill);

Datum
pool_fill(PG_FUNCTION_ARGS)
{
    int32 n = PG_GETARG_INT32(0);
    int32 size = PG_GETARG_INT32(1);
    int64 cap = PG_GETARG_INT32(2);
    MemoryContext old;

    if (pool == NULL)
        pool = AllocSetContextCreate(TopMemoryContext, "leakext pool", ALLOCSET_DEFAULT_SIZES);
    old = MemoryContextSwitchTo(pool);
    /* The cap is checked before each chunk, so the pool stops within one block of it. */
    for (int32 i = 0; i < n && (int64) MemoryContextMemAllocated(pool, true) < cap; i++) {
        char *s = palloc(size);
        s[0] = (char) i;
    }
    MemoryContextSwitchTo(old);
    PG_RETURN_VOID();
}
