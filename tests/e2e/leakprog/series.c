/* series.c: deterministic heap-growth scenarios for `heapscope leaks` (a series of dumps).
 *
 *   series [--no-dump] [--teardown] [--scale N] [--step-ms MS] MODE STEPS
 *
 * The program runs STEPS steps; at the END of every step k (k = 0 .. STEPS-1) it takes a
 * heap dump with jemalloc's mallctl("prof.dump", NULL, NULL, NULL, 0), so dump k (0-based,
 * in sequence order) shows the heap after step k. mallctl is looked up at run time with
 * dlsym(RTLD_DEFAULT, "mallctl"): the program does not link jemalloc (heapscope run
 * preloads it and sets prof_prefix, so the dumps land in SESSION/dumps as
 * jeprof.<pid>.<seq>.m<n>.heap). Nothing is freed at exit: the final dump (prof_final,
 * jeprof.<pid>.<seq>.f.heap) shows the same program state as dump STEPS-1.
 *
 *   --no-dump    take no manual dumps (for `heapscope run --interval` series)
 *   --teardown   free every object before exit (a clean shutdown): the final dump then
 *                holds almost nothing, as after a real program's teardown
 *   --scale N    multiply every per-step and one-time object COUNT by N (default 1);
 *                object sizes stay the same. Used with --sample 512k so that sampled
 *                sites hold enough samples (leaks of tens of MiB).
 *   --step-ms MS sleep MS milliseconds per step (default 5) so dumps are spread in time.
 *
 * Every allocating function is noinline/noclone with a distinct name and allocates on
 * exactly one line, marked LEAK:<tag>; the allocation's leaf frame after pruning is that
 * function. Live objects stay reachable (chained lists / arrays).
 *
 * KiB figures below are for --scale 1; G = ceil(0.3 * STEPS) (12 for STEPS = 40);
 * L = floor(0.6 * STEPS) (24 for STEPS = 40).
 *
 * TRUTH (verdict per allocation site; "leak" = keeps growing to the end)
 * mode     function          tag            behaviour                              verdict
 * -------  ----------------  -------------  -------------------------------------  --------
 * (all)    startup_table     startup        64 x 4 KiB once, before dump 0         steady
 * cache    cache_index       index          the cache's ring: 100*G pointers, once  steady
 *                                           before dump 0 (9.6 KiB)
 * cache    leak_linear       linear         +40 x 1 KiB every step, never freed    leak
 * cache    cache_fill        cache          +100 x 4 KiB inserts every step; the   bounded
 *                                           cache holds at most 100*G entries
 *                                           (4800 KiB), evicting the oldest: grows
 *                                           steps 0..G-1, flat afterwards. The cap
 *                                           is 3x leak_linear's final 1600 KiB.
 * rates    leak_fast         fast           +100 x 1 KiB every step                leak (1st)
 * rates    leak_slow         slow           +20 x 512 B every step                 leak (2nd)
 * late     leak_late         late           +128 x 512 B every step k >= L         leak,
 *                                           (nothing before)               first_growth=L
 * churn    churn_buffers     churn          a pool of 64 KiB buffers, all freed    churn
 *                                           and reallocated every step; its size
 *                                           follows CHURN_MIB[k % 10] =
 *                                           1,3,8,8,2,1,6,8,4,1 MiB: no trend, and
 *                                           the last dump (k = 39) is at 1 MiB
 * busy     request_buffer    request        one line serves every request: each    leak
 *                                           step allocates 160..320 (an irregular
 *                                           load, hash of k) x 4 KiB buffers,
 *                                           frees them the next
 *                                           step, but keeps 16 of them (64 KiB) for
 *                                           good: a leak under 10-20x its growth in
 *                                           short-lived buffers at the same site
 * prefork  load_config       config         parent: 64 x 1 KiB before fork, live   steady
 *                                           in every process (inherited), never
 *                                           freed
 *          handle_requests   requests       every worker: 256 x 256 B per step,    churn or
 *                                           freed the next step (constant 64 KiB   steady
 *                                           live, other objects every step)
 *          leak_in_worker    worker         worker 2 only: +256 x 256 B per step   leak
 *
 * prefork: the parent loads the config, takes ONE dump, forks 3 workers (index 1..3) that
 * each run the STEPS-step loop with a dump per step, and waits for them. Process
 * verdicts: worker 2 "leaks" (leak_in_worker); the parent and workers 1, 3 "clean".
 * stdout (write(2), so stdio allocates nothing): "role=parent pid=P" then
 * "role=worker index=I pid=P leaks=0|1" for each worker.
 *
 * Exit status: 0; 2 usage; 3 mallctl not found or prof.dump failed (run it under a
 * jemalloc with profiling, e.g. `heapscope run`); 4 out of memory; 5 a worker failed.
 *
 * Build: gcc -O1 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls series.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NOINLINE __attribute__((noinline, noclone))

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

static mallctl_fn g_mallctl;
static int g_dump = 1;
static long g_scale = 1;
static long g_step_ms = 5;
static void *volatile g_sink;

/* Every kept object starts with a link to the previous one. */
struct node {
    struct node *next;
};

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    char buf[160];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0 && write(1, buf, (size_t)n) < 0) _exit(3);
}

__attribute__((noreturn)) static void die(int code, const char *what) {
    char buf[200];
    int n = snprintf(buf, sizeof buf, "series: %s\n", what);
    if (n > 0 && write(2, buf, (size_t)n) < 0) _exit(code);
    _exit(code);
}

static void *check(void *p) {
    if (!p) die(4, "out of memory");
    return p;
}

static void dump(void) {
    if (!g_dump) return;
    if (!g_mallctl) die(3, "mallctl not found: run under jemalloc with profiling");
    int err = g_mallctl("prof.dump", NULL, NULL, NULL, 0);
    if (err) die(3, "mallctl(\"prof.dump\") failed: is prof:true set (heapscope run)?");
}

static void end_step(void) {
    dump();
    if (g_step_ms > 0) {
        struct timespec ts = {g_step_ms / 1000, (g_step_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Sites */

static struct node *g_startup;

NOINLINE void startup_table(void) {
    for (long i = 0; i < 64 * g_scale; i++) {
        struct node *n = check(malloc(4096)); /* LEAK:startup */
        n->next = g_startup;
        g_startup = n;
    }
}

static struct node *g_linear;

NOINLINE void leak_linear(void) {
    for (long i = 0; i < 40 * g_scale; i++) {
        struct node *n = check(malloc(1024)); /* LEAK:linear */
        n->next = g_linear;
        g_linear = n;
    }
}

/* A FIFO cache of 4 KiB entries in a ring: insert at head, evict at tail. */
static void **g_cache;
static long g_cache_cap, g_cache_head, g_cache_len;

NOINLINE void cache_index(long cap) {
    g_cache_cap = cap;
    g_cache = check(calloc((size_t)cap, sizeof *g_cache)); /* LEAK:index */
}

NOINLINE void cache_fill(void) {
    for (long i = 0; i < 100 * g_scale; i++) {
        if (g_cache_len == g_cache_cap) { /* evict the oldest entry */
            long tail = (g_cache_head - g_cache_len + g_cache_cap) % g_cache_cap;
            free(g_cache[tail]);
            g_cache[tail] = NULL;
            g_cache_len--;
        }
        void *e = check(malloc(4096)); /* LEAK:cache */
        memset(e, (int)i, 64);
        g_cache[g_cache_head] = e;
        g_cache_head = (g_cache_head + 1) % g_cache_cap;
        g_cache_len++;
    }
}

static struct node *g_fast, *g_slow, *g_late;

NOINLINE void leak_fast(void) {
    for (long i = 0; i < 100 * g_scale; i++) {
        struct node *n = check(malloc(1024)); /* LEAK:fast */
        n->next = g_fast;
        g_fast = n;
    }
}

NOINLINE void leak_slow(void) {
    for (long i = 0; i < 20 * g_scale; i++) {
        struct node *n = check(malloc(512)); /* LEAK:slow */
        n->next = g_slow;
        g_slow = n;
    }
}

NOINLINE void leak_late(void) {
    for (long i = 0; i < 128 * g_scale; i++) {
        struct node *n = check(malloc(512)); /* LEAK:late */
        n->next = g_late;
        g_late = n;
    }
}

static const int CHURN_MIB[10] = {1, 3, 8, 8, 2, 1, 6, 8, 4, 1};
static struct node *g_churn;

NOINLINE void churn_buffers(long step) {
    while (g_churn) { /* drop the whole pool ... */
        struct node *next = g_churn->next;
        free(g_churn);
        g_churn = next;
    }
    long count = CHURN_MIB[step % 10] * 16L * g_scale; /* 16 x 64 KiB = 1 MiB */
    for (long i = 0; i < count; i++) { /* ... and refill it to this step's size */
        struct node *n = check(malloc(65536)); /* LEAK:churn */
        n->next = g_churn;
        g_churn = n;
    }
}

static struct node *g_requests_live, *g_requests_kept;

NOINLINE void request_buffer(long step) {
    while (g_requests_live) { /* the last step's requests are done */
        struct node *next = g_requests_live->next;
        free(g_requests_live);
        g_requests_live = next;
    }
    unsigned h = (unsigned)step + 0x9E3779B9u; /* an irregular load: a hash of the step */
    h ^= h >> 16;
    h *= 0x45d9f3bu;
    h ^= h >> 16;
    h *= 0x45d9f3bu;
    h ^= h >> 16;
    long count = (160 + (long)(h % 161u)) * g_scale;
    long kept = 16 * g_scale;
    for (long i = 0; i < count + kept; i++) {
        struct node *n = check(malloc(4096)); /* LEAK:request */
        if (i < kept) { /* these are never released */
            n->next = g_requests_kept;
            g_requests_kept = n;
        } else {
            n->next = g_requests_live;
            g_requests_live = n;
        }
    }
}

static struct node *g_config;

NOINLINE void load_config(void) {
    for (long i = 0; i < 64 * g_scale; i++) {
        struct node *n = check(malloc(1024)); /* LEAK:config */
        memset(n + 1, 'a' + (int)(i % 26), 64);
        n->next = g_config;
        g_config = n;
    }
}

static struct node *g_requests;

NOINLINE void handle_requests(int index) {
    while (g_requests) { /* last step's requests are done */
        struct node *next = g_requests->next;
        free(g_requests);
        g_requests = next;
    }
    for (long i = 0; i < 256 * g_scale; i++) {
        struct node *n = check(malloc(256)); /* LEAK:requests */
        memset(n + 1, index, 32);
        n->next = g_requests;
        g_requests = n;
    }
    g_sink = g_requests;
}

static struct node *g_worker_leak;

NOINLINE void leak_in_worker(void) {
    for (long i = 0; i < 256 * g_scale; i++) {
        struct node *n = check(malloc(256)); /* LEAK:worker */
        n->next = g_worker_leak;
        g_worker_leak = n;
    }
}

/* ---------------------------------------------------------------------------------- */
/* Modes */

NOINLINE static void run_cache(long steps) {
    long grow_steps = (3 * steps + 9) / 10; /* ceil(0.3 * steps) */
    startup_table();
    cache_index(100 * g_scale * (grow_steps > 0 ? grow_steps : 1));
    for (long k = 0; k < steps; k++) {
        leak_linear();
        cache_fill();
        end_step();
    }
}

NOINLINE static void run_rates(long steps) {
    startup_table();
    for (long k = 0; k < steps; k++) {
        leak_fast();
        leak_slow();
        end_step();
    }
}

NOINLINE static void run_late(long steps) {
    long late = 6 * steps / 10; /* floor(0.6 * steps) */
    startup_table();
    for (long k = 0; k < steps; k++) {
        if (k >= late) leak_late();
        end_step();
    }
}

NOINLINE static void run_churn(long steps) {
    startup_table();
    for (long k = 0; k < steps; k++) {
        churn_buffers(k);
        end_step();
    }
}

NOINLINE static void run_busy(long steps) {
    startup_table();
    for (long k = 0; k < steps; k++) {
        request_buffer(k);
        end_step();
    }
}

static void free_list(struct node **head) {
    while (*head) {
        struct node *next = (*head)->next;
        free(*head);
        *head = next;
    }
}

/* A clean shutdown: everything the modes keep is released before exit. */
static void teardown(void) {
    struct node **lists[] = {&g_startup, &g_linear, &g_fast, &g_slow, &g_late, &g_churn,
                             &g_config, &g_requests, &g_worker_leak, &g_requests_live,
                             &g_requests_kept};
    for (size_t i = 0; i < sizeof lists / sizeof lists[0]; i++) free_list(lists[i]);
    if (g_cache) {
        for (long i = 0; i < g_cache_cap; i++) free(g_cache[i]);
        free(g_cache);
        g_cache = NULL;
    }
}

static int g_teardown;

NOINLINE static void worker_main(int index, long steps) {
    for (long k = 0; k < steps; k++) {
        handle_requests(index);
        if (index == 2) leak_in_worker();
        end_step();
    }
    if (g_teardown) teardown();
    exit(0); /* through exit(): jemalloc writes this worker's final dump */
}

NOINLINE static int run_prefork(long steps) {
    say("role=parent pid=%ld\n", (long)getpid());
    load_config();
    dump();
    pid_t pids[3];
    for (int i = 0; i < 3; i++) {
        pids[i] = fork();
        if (pids[i] < 0) die(5, "fork failed");
        if (pids[i] == 0) {
            say("role=worker index=%d pid=%ld leaks=%d\n", i + 1, (long)getpid(), i + 1 == 2);
            worker_main(i + 1, steps);
        }
    }
    int failed = 0;
    for (int i = 0; i < 3; i++) {
        int status;
        if (waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
            failed = 1;
    }
    return failed ? 5 : 0;
}

static void usage(void) {
    die(2, "usage: series [--no-dump] [--teardown] [--scale N] [--step-ms MS] "
           "cache|rates|late|churn|busy|prefork STEPS");
}

int main(int argc, char **argv) {
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--no-dump") == 0) {
            g_dump = 0;
        } else if (strcmp(argv[i], "--teardown") == 0) {
            g_teardown = 1;
        } else if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc) {
            g_scale = strtol(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--step-ms") == 0 && i + 1 < argc) {
            g_step_ms = strtol(argv[++i], NULL, 10);
        } else {
            usage();
        }
    }
    if (argc - i != 2 || g_scale < 1 || g_step_ms < 0) usage();
    const char *mode = argv[i];
    long steps = strtol(argv[i + 1], NULL, 10);
    if (steps < 1) usage();
    g_mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    if (g_dump && !g_mallctl) die(3, "mallctl not found: run under jemalloc with profiling");

    if (strcmp(mode, "cache") == 0) run_cache(steps);
    else if (strcmp(mode, "rates") == 0) run_rates(steps);
    else if (strcmp(mode, "late") == 0) run_late(steps);
    else if (strcmp(mode, "churn") == 0) run_churn(steps);
    else if (strcmp(mode, "busy") == 0) run_busy(steps);
    else if (strcmp(mode, "prefork") == 0) return run_prefork(steps);
    else usage();
    if (g_teardown) teardown();
    return 0;
}
