/* A busy multi-threaded target for `heapscope attach` tests.
 *
 * Four worker threads allocate and free constantly (a ring of live blocks of random sizes),
 * one thread leaks 4 KiB every 10 ms in slow_leak() (about 400 KiB/s), and a heartbeat
 * thread wakes every millisecond and remembers the longest gap between two wake-ups: the
 * pause an attach causes. Each line read on stdin is answered on stdout with
 * "<beats> <max_gap_us>" (the max gap since the previous question, then reset), so a test can
 * check the process still responds and measure pauses. Runs until SIGTERM/SIGINT (exit 0), or
 * exits by itself after argv[1] milliseconds when given (0: never); argv[2] sets the number of
 * allocating worker threads (default 4, at most 4) and argv[3] whether slow_leak runs (default
 * 1): "0 0 0" leaves a target whose threads sleep or wait outside the allocator.
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

static atomic_int stopping;
static atomic_long beats;
static atomic_long max_gap_us;
static void *leaked[1 << 20];
static atomic_long nleaked;

static long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static void on_term(int sig) { (void)sig; atomic_store(&stopping, 1); }

static void *worker(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u;
    void *ring[256] = {0};
    unsigned i = 0;
    while (!atomic_load(&stopping)) {
        unsigned k = i++ % 256;
        free(ring[k]);
        size_t size = 16 + rand_r(&seed) % 4096;
        ring[k] = malloc(size);
        memset(ring[k], (int)k, size < 64 ? size : 64);
    }
    for (unsigned k = 0; k < 256; k++) free(ring[k]);
    return NULL;
}

__attribute__((noinline)) void *slow_leak(size_t size) {
    void *p = malloc(size);
    memset(p, 0x5a, size);
    return p;
}

static void *leaker(void *arg) {
    (void)arg;
    struct timespec ten_ms = {0, 10 * 1000 * 1000};
    while (!atomic_load(&stopping)) {
        long n = atomic_fetch_add(&nleaked, 1);
        if (n < (1 << 20)) leaked[n] = slow_leak(4096);
        nanosleep(&ten_ms, NULL);
    }
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

static void *responder(void *arg) {
    (void)arg;
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        long gap = atomic_exchange(&max_gap_us, 0);
        printf("%ld %ld\n", atomic_load(&beats), gap);
        fflush(stdout);
    }
    return NULL;
}

int main(int argc, char **argv) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    long exit_after_ms = argc > 1 ? atol(argv[1]) : 0;
    int workers = argc > 2 ? atoi(argv[2]) : 4;
    if (workers < 0 || workers > 4) workers = 4;
    int leak = argc > 3 ? atoi(argv[3]) : 1;
    pthread_t t[7];
    for (int i = 0; i < workers; i++)
        pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)(i + 1));
    if (leak) pthread_create(&t[4], NULL, leaker, NULL);
    pthread_create(&t[5], NULL, heartbeat, NULL);
    pthread_t r;
    pthread_create(&r, NULL, responder, NULL);
    pthread_detach(r);
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    long start = now_us();
    struct timespec five_ms = {0, 5 * 1000 * 1000};
    while (!atomic_load(&stopping)) {
        nanosleep(&five_ms, NULL);
        if (exit_after_ms && now_us() - start >= exit_after_ms * 1000) break;
    }
    atomic_store(&stopping, 1);
    for (int i = 0; i < workers; i++) pthread_join(t[i], NULL);
    if (leak) pthread_join(t[4], NULL);
    pthread_join(t[5], NULL);
    return 0;
}
