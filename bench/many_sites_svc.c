/* many_sites_svc.c: a long-running service with 2^BITS distinct allocation stacks, for
 * bench/agent_cost.py (what the agent costs per dump of a process with thousands of sites).
 *
 *   ./many_sites_svc BITS
 *
 * path(x, d) descends d levels, taking at each one of two call sites by one bit of x, so
 * every x below 2^BITS reaches malloc through its own chain of return addresses: 2^BITS
 * stacks (of BITS + a few frames). At start one 1 KiB object lives on every stack; then,
 * every 50 ms, one "request": stack (tick % 2^BITS) frees its object and allocates a new one
 * (churn that keeps the stack set unchanged), and every 20th tick one object more on stack 0
 * (a slow leak). Run it with MALLOC_CONF=prof:true,lg_prof_sample:7 so nearly every object
 * is sampled and every dump lists ~2^BITS stacks. Runs until SIGTERM/SIGINT; prints
 * "ready" once the objects are made.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t stopping;
static void on_term(int sig) { (void)sig; stopping = 1; }

__attribute__((noinline)) static void *leaf(void) {
    void *p = malloc(1024);
    if (p) memset(p, 0x5a, 64);
    return p;
}

/* Two call sites per level: the bit of x chooses which return address the stack holds. */
__attribute__((noinline)) static void *path(unsigned x, int d) {
    void *p;
    if (d == 0) return leaf();
    if (x & 1u)
        p = path(x >> 1, d - 1);
    else
        p = path(x >> 1, d - 1);
    __asm__ volatile("" ::: "memory"); /* no tail call: this frame stays on the stack */
    return p;
}

int main(int argc, char **argv) {
    int bits = argc > 1 ? atoi(argv[1]) : 11;
    if (bits < 1 || bits > 20) {
        fputs("usage: many_sites_svc BITS (1..20)\n", stderr);
        return 2;
    }
    unsigned n = 1u << bits;
    void **live = calloc(n, sizeof *live);
    void **leaked = NULL;
    size_t nleaked = 0;
    if (!live) return 4;
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    for (unsigned i = 0; i < n; i++) live[i] = path(i, bits);
    printf("ready\n");
    fflush(stdout);
    struct timespec ts = {0, 50 * 1000 * 1000};
    for (unsigned long tick = 0; !stopping; tick++) {
        unsigned i = (unsigned)(tick % n);
        free(live[i]);
        live[i] = path(i, bits);
        if (tick % 20 == 0) {
            void **grown = realloc(leaked, (nleaked + 1) * sizeof *leaked);
            if (!grown) return 4;
            leaked = grown;
            leaked[nleaked++] = path(0, bits);
        }
        nanosleep(&ts, NULL);
    }
    return 0;
}
