/* A target whose main thread sits, for as long as it runs, where heapscope must not run its
 * calls (argv[1]):
 *   loader      inside dl_iterate_phdr (the loader's lock held), busy in its callback
 *   allocator   inside jemalloc's malloc_stats_print, in its write callback
 *   altstack    in a signal handler running on an alternate signal stack (malloc'd)
 *   handler     in a signal handler on its own stack (as PostgreSQL's forked workers are:
 *               that is allowed)
 *   idle        in nanosleep (allowed)
 * With argv[2] = "helper" a second thread sleeps in nanosleep, outside all of these.
 * It prints "ready <pid> <main tid>" once it is in place, and exits 0 on SIGTERM.
 */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

extern void malloc_stats_print(void (*)(void *, const char *), void *, const char *)
    __attribute__((weak));
static volatile sig_atomic_t stop;

static void on_term(int sig) {
    (void)sig;
    stop = 1;
}

static void ready(void) {
    printf("ready %d %d\n", (int)getpid(), (int)gettid());
    fflush(stdout);
}

static void wait_here(void) {
    ready();
    struct timespec ts = {0, 20 * 1000 * 1000};
    while (!stop) nanosleep(&ts, NULL);
}

static int in_loader(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info, (void)size, (void)data;
    ready();
    while (!stop) { /* busy: not asleep in an idle system call */
    }
    return 1;
}

static int printed;
static void in_allocator(void *opaque, const char *text) {
    (void)opaque, (void)text;
    if (!printed++) wait_here();
}

static void in_handler(int sig) {
    (void)sig;
    wait_here();
}

static void *sleeper(void *arg) {
    (void)arg;
    struct timespec ts = {0, 20 * 1000 * 1000};
    while (!stop) nanosleep(&ts, NULL);
    return NULL;
}

int main(int argc, char **argv) {
    const char *where = argc > 1 ? argv[1] : "idle";
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
    for (int i = 0; i < 64; i++) free(malloc(100 + i * 50)); /* something to dump */
    if (argc > 2 && strcmp(argv[2], "helper") == 0) {
        pthread_t t;
        pthread_create(&t, NULL, sleeper, NULL);
    }
    if (strcmp(where, "loader") == 0) {
        dl_iterate_phdr(in_loader, NULL);
    } else if (strcmp(where, "allocator") == 0) {
        if (malloc_stats_print) malloc_stats_print(in_allocator, NULL, NULL);
    } else if (strcmp(where, "altstack") == 0 || strcmp(where, "handler") == 0) {
        if (where[0] == 'a') {
            /* Inside a big heap block, so the room below the stack pointer is someone's. */
            char *block = malloc(4 << 20);
            stack_t ss = {.ss_sp = block + (2 << 20), .ss_size = 64 * 1024, .ss_flags = 0};
            sigaltstack(&ss, NULL);
        }
        struct sigaction h;
        memset(&h, 0, sizeof h);
        h.sa_handler = in_handler;
        h.sa_flags = where[0] == 'a' ? SA_ONSTACK : 0;
        sigaction(SIGUSR1, &h, NULL);
        raise(SIGUSR1);
    } else {
        wait_here();
    }
    return 0;
}
