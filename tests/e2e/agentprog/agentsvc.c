/* A long-running service for the agent tests. Every 50 ms it handles a "request" (buffers
 * allocated and freed) and, by mode:
 *   leak   leak_tick() keeps one 16 KiB block for ever (320 KiB/s, never freed)
 *   cache  cache_put() replaces one entry of a 64-entry ring of 16 KiB blocks: 1 MiB once
 *          full (after 3.2 s), flat from then on
 * Prints "ready" once in its steady state: at once for leak, once the ring is full for cache
 * (while it fills, the cache really grows: 1 MiB in 3.2 s is a leak to anyone watching only
 * then). Runs until SIGTERM/SIGINT, then exits 0.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK (16 * 1024)

static volatile sig_atomic_t stopping;
static void on_term(int sig) { (void)sig; stopping = 1; }

static void **leaked;
static size_t nleaked, capleaked;
static void *ring[64];
static unsigned long tick;

__attribute__((noinline)) void leak_tick(void) {
    if (nleaked == capleaked) {
        capleaked = capleaked ? 2 * capleaked : 1024;
        leaked = realloc(leaked, capleaked * sizeof *leaked);
    }
    leaked[nleaked] = malloc(BLOCK);
    memset(leaked[nleaked], 0x11, BLOCK);
    nleaked++;
}

__attribute__((noinline)) void cache_put(void) {
    size_t slot = tick % 64;
    free(ring[slot]);
    ring[slot] = malloc(BLOCK);
    memset(ring[slot], 0x22, BLOCK);
}

__attribute__((noinline)) void handle_request(void) {
    for (int i = 0; i < 8; i++) {
        char *p = malloc(4096);
        memset(p, 0x33, 4096);
        free(p);
    }
}

int main(int argc, char **argv) {
    int leak = argc > 1 && strcmp(argv[1], "leak") == 0;
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    if (leak) {
        printf("ready\n");
        fflush(stdout);
    }
    struct timespec ts = {0, 50 * 1000 * 1000};
    while (!stopping) {
        handle_request();
        if (leak)
            leak_tick();
        else
            cache_put();
        tick++;
        if (!leak && tick == 64) {
            printf("ready\n");
            fflush(stdout);
        }
        nanosleep(&ts, NULL);
    }
    return 0;
}
