/* threads.c: a multi-threaded program for heapscope's `run` end-to-end tests.
 *
 * main starts NTHREADS named threads (pthread_setname_np: "net-rx", "net-tx",
 * "cache-fill", "stats"), joins them and returns 0. Output (stdout):
 * "pid=P" then "thread=NAME leaks=0|1" per thread.
 *
 * TRUTH (live at exit):
 *   - "net-rx", "net-tx", "stats": thread_work() allocates and frees WORK_COUNT x 512 B:
 *     nothing live.
 *   - "cache-fill": thread_leak() mallocs LEAK_COUNT x LEAK_BYTES (10,000 x 512 B =
 *     5,120,000 B) and drops every pointer: THE LEAK.
 *     Expected first suspect: function thread_leak, in this (single) process.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NTHREADS 4
#define LEAK_COUNT 10000
#define LEAK_BYTES 512
#define WORK_COUNT 10000

static const char *const NAMES[NTHREADS] = {"net-rx", "net-tx", "cache-fill", "stats"};
static const int LEAKER = 2;
static void *volatile g_sink;

__attribute__((noinline)) void thread_work(int index) {
    for (int i = 0; i < WORK_COUNT; i++) {
        char *buf = malloc(LEAK_BYTES);
        memset(buf, index, LEAK_BYTES);
        g_sink = buf;
        free(buf);
    }
}

__attribute__((noinline)) void thread_leak(void) {
    for (int i = 0; i < LEAK_COUNT; i++) {
        char *entry = malloc(LEAK_BYTES);
        memset(entry, i, LEAK_BYTES);
        g_sink = entry; /* the pointer is overwritten: lost */
    }
}

static void *thread_main(void *arg) {
    int index = (int)(long)arg;
    pthread_setname_np(pthread_self(), NAMES[index]);
    if (index == LEAKER)
        thread_leak();
    else
        thread_work(index);
    return NULL;
}

int main(void) {
    pthread_t threads[NTHREADS];
    printf("pid=%ld\n", (long)getpid());
    for (int i = 0; i < NTHREADS; i++)
        printf("thread=%s leaks=%d\n", NAMES[i], i == LEAKER);
    fflush(stdout);
    for (int i = 0; i < NTHREADS; i++)
        if (pthread_create(&threads[i], NULL, thread_main, (void *)(long)i) != 0) return 2;
    for (int i = 0; i < NTHREADS; i++) pthread_join(threads[i], NULL);
    return 0;
}
