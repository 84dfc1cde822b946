/* A target for signal storms during attaches (`heapscope attach`, `run --every`).
 *
 * The main thread and argv[1] worker threads (default 3) allocate and free all the time; a
 * heartbeat thread wakes every millisecond and remembers the longest gap (the pause an
 * attach causes). With argv[2] = "handlers" (the default) it counts every delivery of INT,
 * TERM, HUP, USR1, USR2, CHLD, ALRM, PIPE, TRAP and CONT in a handler (SA_RESTART); with
 * "default" it installs none, so only signals whose default action is harmless (CHLD, URG,
 * WINCH, CONT) may be sent. With argv[3] = N > 0 it writes a log line to stderr every N ms
 * (as servers do). With argv[4] = N > 0 it calls exit(0) after N ms, whatever its other
 * threads are doing. Commands on stdin, one per line, answered on stdout:
 *   c   the counts, "INT=n TERM=n ..." in the order above
 *   b   "<beats> <max_gap_us>" (the max gap since the previous b, then reset)
 *   f P a new thread has jemalloc dump to path P (prof.dump); with P a FIFO nobody reads,
 *       that thread waits in open() holding jemalloc's dump lock (a stuck dump)
 *   q   exit 0 (after freeing what the workers hold)
 * It prints "ready <pid>" once its threads run.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const int counted[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2,
                              SIGCHLD, SIGALRM, SIGPIPE, SIGTRAP, SIGCONT};
static const char *names[] = {"INT", "TERM", "HUP", "USR1", "USR2",
                              "CHLD", "ALRM", "PIPE", "TRAP", "CONT"};
#define NCOUNTED (sizeof counted / sizeof counted[0])
static atomic_long counts[NCOUNTED];
static atomic_int stopping;
static atomic_long beats;
static atomic_long max_gap_us;

static long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static void on_signal(int sig) {
    for (unsigned i = 0; i < NCOUNTED; i++)
        if (counted[i] == sig) atomic_fetch_add(&counts[i], 1);
}

__attribute__((noinline)) static void churn(unsigned *seed, void **ring, unsigned *i) {
    unsigned k = (*i)++ % 512;
    free(ring[k]);
    size_t size = 16 + rand_r(seed) % 8192;
    ring[k] = malloc(size);
    memset(ring[k], (int)k, size < 64 ? size : 64);
}

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u;
    void *ring[512] = {0};
    unsigned i = 0;
    while (!atomic_load(&stopping)) churn(&seed, ring, &i);
    for (unsigned k = 0; k < 512; k++) free(ring[k]);
    return NULL;
}

static void *heartbeat(void *arg) {
    (void)arg;
    struct timespec one_ms = {0, 1000 * 1000};
    long prev = now_us();
    while (!atomic_load(&stopping)) {
        nanosleep(&one_ms, NULL);
        long t = now_us();
        long gap = t - prev;
        prev = t;
        long cur = atomic_load(&max_gap_us);
        while (gap > cur && !atomic_compare_exchange_weak(&max_gap_us, &cur, gap)) {
        }
        atomic_fetch_add(&beats, 1);
    }
    return NULL;
}

/* From the preloaded jemalloc, when there is one. */
extern int mallctl(const char *, void *, size_t *, void *, size_t) __attribute__((weak));

static void *dump_to(void *arg) {
    const char *path = arg;
    if (mallctl) mallctl("prof.dump", NULL, NULL, &path, sizeof path);
    return NULL;
}

static void *logger(void *arg) {
    long ms = (long)(intptr_t)arg;
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    long n = 0;
    while (!atomic_load(&stopping)) {
        nanosleep(&ts, NULL);
        fprintf(stderr, "storm: log line %ld\n", ++n);
    }
    return NULL;
}

static void *commands(void *arg) {
    (void)arg;
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'c') {
            for (unsigned i = 0; i < NCOUNTED; i++)
                printf("%s%s=%ld", i ? " " : "", names[i], atomic_load(&counts[i]));
            printf("\n");
        } else if (line[0] == 'b') {
            long gap = atomic_exchange(&max_gap_us, 0);
            printf("%ld %ld\n", atomic_load(&beats), gap);
        } else if (line[0] == 'f' && line[1] == ' ') {
            line[strcspn(line, "\n")] = 0;
            pthread_t d;
            pthread_create(&d, NULL, dump_to, strdup(line + 2));
            pthread_detach(d);
            printf("ok\n");
        } else if (line[0] == 'q') {
            break;
        }
        fflush(stdout);
    }
    atomic_store(&stopping, 1);
    return NULL;
}

int main(int argc, char **argv) {
    int nworkers = argc > 1 ? atoi(argv[1]) : 3;
    int handlers = !(argc > 2 && strcmp(argv[2], "default") == 0);
    if (nworkers < 0 || nworkers > 16) nworkers = 3;
    if (handlers) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_signal;
        sa.sa_flags = SA_RESTART;
        for (unsigned i = 0; i < NCOUNTED; i++) sigaction(counted[i], &sa, NULL);
    }
    pthread_t t[16], hb, cmd;
    for (int i = 0; i < nworkers; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    pthread_create(&hb, NULL, heartbeat, NULL);
    pthread_create(&cmd, NULL, commands, NULL);
    pthread_t logt;
    long log_ms = argc > 3 ? atol(argv[3]) : 0;
    if (log_ms > 0) pthread_create(&logt, NULL, logger, (void *)(intptr_t)log_ms);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    long exit_after_ms = argc > 4 ? atol(argv[4]) : 0;
    long start = now_us();
    unsigned seed = 7;
    void *ring[512] = {0};
    unsigned i = 0;
    while (!atomic_load(&stopping)) {
        churn(&seed, ring, &i);
        if (exit_after_ms > 0 && (i & 1023) == 0 && now_us() - start > exit_after_ms * 1000)
            exit(0);
    }
    for (unsigned k = 0; k < 512; k++) free(ring[k]);
    for (int k = 0; k < nworkers; k++) pthread_join(t[k], NULL);
    pthread_join(hb, NULL);
    pthread_join(cmd, NULL);
    if (log_ms > 0) pthread_join(logt, NULL);
    return 0;
}
