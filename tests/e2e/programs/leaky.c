/*
 * leaky.c: deterministic leaking program for heapscope's e2e tests.
 *
 * Build (PIE, see tests/e2e/conftest.py):
 *     gcc -O1 -g -fPIE -pie -pthread leaky.c -o leaky -L<dir> -lhelper -Wl,-rpath,<dir>
 * Run:  LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF=prof:true,prof_final:true,...
 * It takes no arguments, prints nothing and exits 0 (return from main, so
 * jemalloc's atexit prof_final dump is written).
 *
 * Truth, live at exit, in jemalloc usable sizes (5.3 size classes):
 *
 *   allocating function (leaf after pruning) thread        objects  request  usable       bytes
 *   leak_small            malloc             leaky-main     20,000       48      48     960,000
 *   leak_big              malloc             leaky-main          8    1 MiB   1 MiB   8,388,608
 *   worker_alloc          calloc(1, 3000)    leaky-worker    2,000     3000    3072   6,144,000
 *   copy_names            strdup (pruned)    leaky-main      1,000   6..96   8..96      56,800
 *   via_inline <- inline_alloc (inlined)     leaky-main      5,000      256     256   1,280,000
 *   libhelper.so+0x... (static, stripped)    leaky-main      3,000     1000    1024   3,072,000
 *   recurse_alloc (40 activations deep)      leaky-main        100      512     512      51,200
 *   ------------------------------------------------------------------------------------------
 *   total                                                   31,108                 19,952,608
 *
 * strdup sizes: string i has length 5 + 10*(i % 10), i.e. requests of
 * 6,16,26,...,96 bytes -> classes 8,16,32,48,48,64,80,80,96,96 = 568 B per 10
 * strings -> 100 * 568 = 56,800 B.
 *
 * Freed (visible only with prof_accum, in alloc_*): churn() does
 * malloc(4096)/free 50,000 times = 204,800,000 B, 50,000 objects, 0 live.
 * Total allocated = 19,952,608 + 204,800,000 = 224,752,608 B in 81,108 objects.
 *
 * The C runtime may add a handful of tiny allocations of its own (< 1 KB);
 * the program uses no stdio so there is no stdout buffer.
 *
 * Every allocating line carries a "LEAK:<tag>" comment so tests can find its
 * line number (jemalloc.source_line()).  Threads: main is named "leaky-main",
 * the worker "leaky-worker" (pthread_setname_np), visible with
 * prof_sys_thread_name:true.  Libhelper: see helper.c.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define N_SMALL 20000
#define N_BIG 8
#define N_WORKER 2000
#define N_NAMES 1000
#define N_INLINE 5000
#define N_CHURN 50000
#define N_RECURSE 100
#define RECURSE_DEPTH 40

int helper_public_a(int count); /* libhelper.so */

void *small_keep[N_SMALL];
void *big_keep[N_BIG];
void *worker_keep[N_WORKER];
char *names[N_NAMES];
void *inline_keep[N_INLINE];
void *recurse_keep[N_RECURSE];
void *volatile churn_sink;
volatile int recurse_returns;
/* Opaque to the optimizer so strdup() is not turned into malloc+memcpy. */
char *volatile name_source;

__attribute__((noinline)) void leak_small(void)
{
    for (int i = 0; i < N_SMALL; i++)
        small_keep[i] = malloc(48); /* LEAK:small */
}

__attribute__((noinline)) void leak_big(void)
{
    for (int i = 0; i < N_BIG; i++)
        big_keep[i] = malloc(1 << 20); /* LEAK:big */
}

__attribute__((noinline)) void worker_alloc(void)
{
    for (int i = 0; i < N_WORKER; i++)
        worker_keep[i] = calloc(1, 3000); /* LEAK:worker */
}

static void *worker_main(void *arg)
{
    (void)arg;
    pthread_setname_np(pthread_self(), "leaky-worker");
    worker_alloc();
    return NULL;
}

__attribute__((noinline)) void copy_names(void)
{
    char buf[128];
    for (int i = 0; i < N_NAMES; i++) {
        int len = 5 + 10 * (i % 10);
        memset(buf, 'a' + i % 26, len);
        buf[len] = '\0';
        name_source = buf;
        names[i] = strdup(name_source); /* LEAK:strdup */
    }
}

static inline __attribute__((always_inline)) void *inline_alloc(size_t n)
{
    char *p = malloc(n); /* LEAK:inline */
    p[0] = 1;
    return p;
}

__attribute__((noinline)) void via_inline(void)
{
    for (int i = 0; i < N_INLINE; i++)
        inline_keep[i] = inline_alloc(256); /* LEAK:inline-call */
}

__attribute__((noinline)) void churn(void)
{
    for (int i = 0; i < N_CHURN; i++) {
        churn_sink = malloc(4096); /* CHURN */
        free(churn_sink);
    }
}

/* recurse_alloc(RECURSE_DEPTH - 1) makes RECURSE_DEPTH (40) activations of
 * itself; the innermost one (depth 0) allocates. Not a tail call (the
 * increment after the call), so every activation has a frame. */
__attribute__((noinline)) void *recurse_alloc(int depth)
{
    if (depth == 0)
        return malloc(512); /* LEAK:recurse */
    void *p = recurse_alloc(depth - 1);
    recurse_returns++;
    return p;
}

__attribute__((noinline)) void via_lib(void)
{
    helper_public_a(3000);
}

int main(void)
{
    pthread_t worker;

    pthread_setname_np(pthread_self(), "leaky-main");

    leak_small();
    leak_big();
    if (pthread_create(&worker, NULL, worker_main, NULL) != 0)
        return 2;
    pthread_join(worker, NULL);
    copy_names();
    via_inline();
    churn();
    for (int i = 0; i < N_RECURSE; i++)
        recurse_keep[i] = recurse_alloc(RECURSE_DEPTH - 1);
    via_lib();
    return 0;
}
