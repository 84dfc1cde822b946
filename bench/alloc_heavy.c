/* Allocation-heavy workload for bench/overhead.py: several threads doing mixed-size
 * malloc/free with a sliding window of live objects (a server-like pattern). The third
 * argument 1 makes it write every byte it allocates, like a program that uses its memory;
 * 0 (the worst case for any allocator profiler) touches at most 64 bytes. Deterministic:
 * a fixed-seed xorshift generator per thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 4096

static long iterations = 20000000;
static int touch_all; /* 1: write every allocated byte (a program that uses its memory) */

static void *work(void *arg) {
    uint64_t x = 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)arg;
    void **live = calloc(WINDOW, sizeof *live);
    for (long i = 0; i < iterations; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        size_t k = x % WINDOW;
        size_t size = (x >> 20) % 100 < 95 ? 16 + (x >> 32) % 512 : 4096 + (x >> 32) % 65536;
        free(live[k]);
        live[k] = malloc(size);
        memset(live[k], (int)i, touch_all || size < 64 ? size : 64);
    }
    for (size_t k = 0; k < WINDOW; k++) free(live[k]);
    free(live);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (argc > 2) iterations = atol(argv[2]);
    if (argc > 3) touch_all = atoi(argv[3]);
    pthread_t t[64];
    for (int i = 0; i < threads && i < 64; i++) pthread_create(&t[i], NULL, work, (void *)(intptr_t)(i + 1));
    for (int i = 0; i < threads && i < 64; i++) pthread_join(t[i], NULL);
    puts("done");
    return 0;
}
