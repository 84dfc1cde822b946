/* A tiny "server" for the heapscope demo: for about three seconds it handles requests with a
 * session cache that is bounded (evicts old entries) and a request log that is supposed to be
 * freed but is not. Expected, with dumps taken as it runs (heapscope run --every): log_request
 * (demo/leaky_server.c) is the leak, cache_put's bounded cache is not, and neither malloc,
 * jemalloc internals nor strdup is named. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CACHE_SLOTS 64

struct session { char *user; char payload[2000]; };

static struct session *cache[CACHE_SLOTS];
static char **request_log;
static size_t log_len, log_cap;

static void cache_put(int id) {
    struct session *s = malloc(sizeof *s);
    s->user = strdup("someone@example.org");
    memset(s->payload, id & 0xff, sizeof s->payload);
    struct session *old = cache[id % CACHE_SLOTS];
    if (old) { free(old->user); free(old); }  /* bounded: the old entry is evicted */
    cache[id % CACHE_SLOTS] = s;
}

static void log_request(int id) {
    char line[128];
    snprintf(line, sizeof line, "GET /item/%d HTTP/1.1 user-agent: demo-client", id);
    if (log_len == log_cap) {
        log_cap = log_cap ? 2 * log_cap : 1024;
        request_log = realloc(request_log, log_cap * sizeof *request_log);
    }
    request_log[log_len++] = strdup(line);   /* the leak: entries are never trimmed */
    char *scratch = malloc(4096);            /* temporary: freed at once */
    memcpy(scratch, line, sizeof line);
    free(scratch);
}

static void handle(int id) {
    cache_put(id);
    log_request(id);
}

int main(void) {
    struct timespec pause = {0, 30 * 1000 * 1000};
    for (int i = 0; i < 200000; i++) {
        handle(i);
        if (i % 2000 == 1999)
            nanosleep(&pause, NULL); /* 100 batches, ~3 s: a server's steady trickle */
    }
    printf("served 200000 requests; %zu log lines kept\n", log_len);
    return 0;
}
