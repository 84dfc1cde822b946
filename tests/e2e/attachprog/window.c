/* A server with a warm-up, for `heapscope attach PID window` tests.
 *
 * Profiling is on from the start (prof_active defaults to true). Before it says "ready" it
 * warms up: warm_up() allocates 64 MiB and frees it all, and build_cache() allocates an
 * 8 MiB table that stays for the life of the process. After "ready", every 10 ms it keeps
 * 4 KiB in slow_leak() (about 400 KiB/s) and serves requests (allocated and freed at once).
 * A window taken after "ready" must rank slow_leak first and hold neither the warm-up nor
 * the cache (both allocated before the window). Runs until SIGTERM (exit 0).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static atomic_int stopping;
static void *cache[2048];
static void *leaked[1 << 16];

static void on_term(int sig) { (void)sig; atomic_store(&stopping, 1); }

__attribute__((noinline)) void warm_up(void) {
    static void *blocks[1024];
    for (int i = 0; i < 1024; i++) {
        blocks[i] = malloc(64 * 1024);
        memset(blocks[i], i & 0xff, 64 * 1024);
    }
    for (int i = 0; i < 1024; i++) free(blocks[i]);
}

__attribute__((noinline)) void build_cache(void) {
    for (int i = 0; i < 2048; i++) {
        cache[i] = malloc(4096);
        memset(cache[i], 1, 4096);
    }
}

__attribute__((noinline)) void *slow_leak(void) {
    void *p = malloc(4096);
    memset(p, 0x5a, 4096);
    return p;
}

__attribute__((noinline)) void serve_request(int i) {
    char *buf = malloc(16 * 1024);
    memset(buf, i & 0xff, 16 * 1024);
    free(buf);
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    warm_up();
    build_cache();
    printf("ready\n");
    fflush(stdout);
    struct timespec ten_ms = {0, 10 * 1000 * 1000};
    long n = 0;
    while (!atomic_load(&stopping)) {
        if (n < (1 << 16)) leaked[n] = slow_leak();
        n++;
        for (int i = 0; i < 8; i++) serve_request(i);
        nanosleep(&ten_ms, NULL);
    }
    return 0;
}
