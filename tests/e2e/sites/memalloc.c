/* memalloc.c: a C program's own allocation helper used by two functions, one leaking.
 *
 * Build:  gcc -O1 -g memalloc.c -o memalloc   (and -O2, where mem_alloc is inlined)
 * Run under heapscope run --every (a series of dumps). Prints "pid=<pid>"; exit 0.
 *
 * mem_alloc() does nothing but call malloc and stop the program when it fails. Its name is
 * the program's own, and it has only two callers, so heapscope can only tell from the
 * profile that it is a helper: one call site, always directly above malloc, two callers.
 * The report must name the caller that leaks, never mem_alloc:
 *
 *   remember_sessions  keeps 40 sessions of 1,024 bytes per step, 30 steps: 1,228,800
 *                      bytes never freed (the marked line)
 *   handle_request     keeps the last 256 buffers of 8,192 bytes in a ring (2 MiB, more
 *                      than the leak, steady from the fifth step on) and frees them at exit
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define STEPS 30
#define SESSIONS 40
#define RING 256
#define REQUESTS 64

static void *sessions[STEPS * SESSIONS];
static int nsessions;
static void *ring[RING];
static int next_slot;

void *mem_alloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

__attribute__((noinline)) static void remember_sessions(int step)
{
    for (int i = 0; i < SESSIONS; i++) {
        char *s = mem_alloc(1024);  /* LEAK:sessions */
        memset(s, step, 1024);
        sessions[nsessions++] = s;
    }
}

__attribute__((noinline)) static void handle_request(int step)
{
    for (int i = 0; i < REQUESTS; i++) {
        char *buf = mem_alloc(8192);  /* ring: freed when replaced and at exit */
        memset(buf, step + i, 8192);
        free(ring[next_slot]);
        ring[next_slot] = buf;
        next_slot = (next_slot + 1) % RING;
    }
}

int main(void)
{
    struct timespec pause = {0, 100 * 1000 * 1000};
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    for (int step = 0; step < STEPS; step++) {
        remember_sessions(step);
        handle_request(step);
        nanosleep(&pause, NULL);
    }
    for (int i = 0; i < RING; i++) {
        free(ring[i]);
    }
    return 0;
}
