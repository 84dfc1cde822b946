/* prefork.c: a pre-fork server for heapscope's `run` end-to-end tests.
 *
 * The parent ("master") loads a configuration table, forks NWORKERS workers, waits for
 * all of them, frees the configuration at orderly shutdown and exits 0. Every process
 * leaves through exit(), so jemalloc writes a final dump (prof_final) for each pid.
 *
 * Output (stdout, one line per process, written with write(2) so stdio allocates no
 * buffer): "role=master pid=P" then "role=worker index=I pid=P leaks=0|1" per worker.
 *
 * TRUTH (live at exit, what the final dumps must show):
 *   - master:      nothing of its own. load_config() allocates CONFIG_ENTRIES x
 *                  CONFIG_ENTRY_BYTES (64 x 1 KiB) that live the whole run, but
 *                  free_config() releases them before exit: NOT a leak.
 *   - worker 1, 3: handle_requests() allocates and frees REQUESTS x 256 B; the inherited
 *                  config table is freed by free_config() too: nothing live.
 *   - worker 2:    leak_in_worker() mallocs LEAK_COUNT x LEAK_BYTES (20,000 x 256 B =
 *                  5,120,000 B) and keeps them in a static array: THE LEAK.
 *                  Expected first suspect: function leak_in_worker, pid = worker 2.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define NWORKERS 3
#define LEAKING_WORKER 2
#define CONFIG_ENTRIES 64
#define CONFIG_ENTRY_BYTES 1024
#define REQUESTS 20000
#define LEAK_COUNT 20000
#define LEAK_BYTES 256

static char *g_config[CONFIG_ENTRIES];
static void *volatile g_sink;
static char **g_leaked;

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...) {
    char buf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0 && write(1, buf, (size_t)n) < 0) _exit(3);
}

__attribute__((noinline)) static void load_config(void) {
    for (int i = 0; i < CONFIG_ENTRIES; i++) {
        g_config[i] = malloc(CONFIG_ENTRY_BYTES);
        memset(g_config[i], 'a' + i % 26, CONFIG_ENTRY_BYTES);
    }
}

__attribute__((noinline)) static void free_config(void) {
    for (int i = 0; i < CONFIG_ENTRIES; i++) {
        free(g_config[i]);
        g_config[i] = NULL;
    }
}

__attribute__((noinline)) static void handle_requests(int index) {
    for (int i = 0; i < REQUESTS; i++) {
        char *req = malloc(LEAK_BYTES);
        memset(req, index, LEAK_BYTES);
        g_sink = req;
        free(req);
    }
}

__attribute__((noinline)) void leak_in_worker(void) {
    g_leaked = calloc(LEAK_COUNT, sizeof *g_leaked); /* the array itself: 160,000 B */
    for (int i = 0; i < LEAK_COUNT; i++) {
        g_leaked[i] = malloc(LEAK_BYTES);
        memset(g_leaked[i], i, LEAK_BYTES);
    }
}

__attribute__((noinline)) static void worker_main(int index) {
    say("role=worker index=%d pid=%ld leaks=%d\n", index, (long)getpid(),
        index == LEAKING_WORKER);
    handle_requests(index);
    if (index == LEAKING_WORKER) leak_in_worker();
    free_config();
    exit(0);
}

int main(void) {
    say("role=master pid=%ld\n", (long)getpid());
    load_config();
    pid_t pids[NWORKERS];
    for (int i = 0; i < NWORKERS; i++) {
        pids[i] = fork();
        if (pids[i] < 0) { perror("fork"); return 2; }
        if (pids[i] == 0) worker_main(i + 1);
    }
    int failed = 0;
    for (int i = 0; i < NWORKERS; i++) {
        int status;
        if (waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
            failed = 1;
    }
    free_config();
    return failed;
}
