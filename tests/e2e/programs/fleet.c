/*
 * fleet.c: a parent and many forked children, for the timeline of a session with many
 * processes (as a server with a pool of workers looks).
 *
 *   fleet CHILDREN STEPS STEP_MS PIDFILE
 *
 * The parent forks CHILDREN children, writes "<index> <pid>\n" for each to PIDFILE (written
 * in full before the first step ends; child 0 is the leaking one), then waits for them all.
 * Every child retitles itself as a server's workers do (its command line reads
 * "fleet: leaker" for child 0, "fleet: worker <index>" for the others) and runs STEPS steps
 * of STEP_MS milliseconds:
 *
 *   child     function       behaviour                                    verdict
 *   --------  -------------  -------------------------------------------  -------
 *   0         leak_request   +4 x 64 KiB every step, never freed          leak
 *   i >= 1    worker_pool    (i % 4 + 1) x 64 KiB once, before step 0     steady
 *
 * Every block is written to (memset), so it counts in RSS as it does in the heap.
 * Nothing is freed; children return from main (jemalloc's final dump is written).
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCK (64 * 1024)

static void **kept;
static size_t nkept;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static void keep(void *p) {
    kept[nkept++] = p;
}

__attribute__((noinline, noclone)) static void leak_request(void) {
    for (int k = 0; k < 4; k++) {
        void *p = malloc(BLOCK); /* LEAK:request */
        memset(p, 0x5a, BLOCK);
        keep(p);
    }
}

__attribute__((noinline, noclone)) static void worker_pool(int blocks) {
    for (int k = 0; k < blocks; k++) {
        void *p = malloc(BLOCK); /* LEAK:pool */
        memset(p, 0x33, BLOCK);
        keep(p);
    }
}

/* A server's workers name themselves in their command line: the argv area is rewritten. */
static void retitle(int argc, char **argv, const char *title) {
    char *start = argv[0];
    char *end = argv[argc - 1] + strlen(argv[argc - 1]);
    size_t room = (size_t)(end - start);
    memset(start, 0, room);
    strncpy(start, title, room - 1);
}

static int child(int index, int steps, long step_ms, int argc, char **argv) {
    char title[64];
    if (index == 0)
        snprintf(title, sizeof title, "fleet: leaker");
    else
        snprintf(title, sizeof title, "fleet: worker %d", index);
    retitle(argc, argv, title);
    kept = calloc((size_t)steps * 4 + 8, sizeof *kept);
    if (index != 0)
        worker_pool(index % 4 + 1);
    for (int s = 0; s < steps; s++) {
        if (index == 0)
            leak_request();
        sleep_ms(step_ms);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: fleet CHILDREN STEPS STEP_MS PIDFILE\n");
        return 2;
    }
    int children = atoi(argv[1]), steps = atoi(argv[2]);
    long step_ms = atol(argv[3]);
    FILE *pidfile = fopen(argv[4], "w");
    if (pidfile == NULL || children < 1 || steps < 1 || step_ms < 1) {
        fprintf(stderr, "fleet: bad arguments\n");
        return 2;
    }
    for (int i = 0; i < children; i++) {
        fflush(pidfile);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            fclose(pidfile);
            return child(i, steps, step_ms, argc, argv);
        }
        fprintf(pidfile, "%d %d\n", i, (int)pid);
    }
    fclose(pidfile);
    int failed = 0;
    for (int i = 0; i < children; i++) {
        int status;
        if (wait(&status) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed = 1;
    }
    return failed;
}
