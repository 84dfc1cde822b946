/* many_stacks.c: driver for bench/leaks_speed.py (a series of dumps of a process with
 * tens of thousands of distinct allocation stacks).
 *
 *   ./many_stacks STACKS DUMPS [EVERY [GROW]]
 *
 * Linked with the call tree bench/bench_gen.py generates (gen.h, tu*.c: every path from
 * hs_root through the layers to one of the leaves' malloc call sites is a distinct
 * allocation stack) and with roots.c (hs_root, written by leaks_speed.py from the
 * generator's main.c). Path i is x = (i * 0x9E3779B1) mod 2^(2*HS_DIGITS), as in the
 * generator: STACKS distinct stacks.
 *
 * Setup: one live object (1..2 KiB) on every stack. Then DUMPS steps, each ending with
 * mallctl("prof.dump") (found with dlsym; run it under `heapscope run`):
 *   i % EVERY == 0   leak:    GROW more objects every step (STACKS/EVERY leaking stacks)
 *   i % EVERY == 1   bounded: GROW more objects per step during the first third of steps
 *   i % EVERY == 2   churn:   the object is freed and a new one allocated every step
 *   otherwise        steady
 * EVERY defaults to 200, GROW to 8: with 20,000 stacks and 100 dumps, 100 leaking stacks
 * end at ~1.2 MiB each (~120 MiB in all), 100 bounded ones at ~0.4 MiB. Sampling: with
 * objects of >= 1 KiB and `--sample 128` nearly every object is sampled, so every dump
 * holds ~STACKS stacks.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "gen.h"

void hs_root(unsigned x); /* roots.c */

volatile unsigned hs_depth_guard;
static size_t g_size;
static void *g_last;

size_t hs_size(void) { return g_size; }

void hs_done(void *p) { g_last = p; }

struct node {
    struct node *next;
};

static struct node **g_heads;
static unsigned long g_mask;

static unsigned hash(unsigned long v) {
    v ^= v >> 17;
    v *= 0xed5ad4bbUL;
    v ^= v >> 11;
    v *= 0xac4c1b51UL;
    v ^= v >> 15;
    return (unsigned)v;
}

/* One more object on stack i. */
static void grow(unsigned long i, unsigned long k) {
    g_size = 1024 + (size_t)(hash(i * 131 + k) % 16u) * 64;
    g_last = NULL;
    hs_root((unsigned)((i * 0x9E3779B1UL) & g_mask));
    struct node *n = g_last;
    if (!n) {
        fputs("many_stacks: malloc failed\n", stderr);
        exit(4);
    }
    n->next = g_heads[i];
    g_heads[i] = n;
}

static void shrink(unsigned long i) {
    struct node *n = g_heads[i];
    if (n) {
        g_heads[i] = n->next;
        free(n);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fputs("usage: many_stacks STACKS DUMPS [EVERY [GROW]]\n", stderr);
        return 2;
    }
    unsigned long stacks = strtoul(argv[1], NULL, 10);
    unsigned long dumps = strtoul(argv[2], NULL, 10);
    unsigned long every = argc > 3 ? strtoul(argv[3], NULL, 10) : 200;
    unsigned long per_step = argc > 4 ? strtoul(argv[4], NULL, 10) : 8;
    g_mask = (HS_DIGITS * 2 >= 32) ? 0xffffffffUL : ((1UL << (HS_DIGITS * 2)) - 1);
    if (stacks == 0 || stacks - 1 > g_mask || every < 3) {
        fputs("many_stacks: bad STACKS or EVERY\n", stderr);
        return 2;
    }
    int (*mallctl)(const char *, void *, size_t *, void *, size_t) =
        (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallctl");
    if (!mallctl) {
        fputs("many_stacks: mallctl not found: run under jemalloc with profiling\n", stderr);
        return 3;
    }
    g_heads = calloc(stacks, sizeof *g_heads);
    if (!g_heads) return 4;
    for (unsigned long k = 0; k <= dumps; k++) {
        for (unsigned long i = 0; i < stacks; i++) {
            /* one call site of grow(): every object of path i has the same stack */
            unsigned long role = i % every;
            unsigned long add = 0;
            if (k == 0 || role == 2) add = 1;
            else if (role == 0 || (role == 1 && k <= dumps / 3)) add = per_step;
            if (k > 0 && role == 2) shrink(i);
            for (unsigned long j = 0; j < add; j++) grow(i, k * per_step + j);
        }
        if (k > 0 && mallctl("prof.dump", NULL, NULL, NULL, 0)) {
            fputs("many_stacks: prof.dump failed (is prof:true set?)\n", stderr);
            return 3;
        }
    }
    return 0;
}
