/* live_leak.c: a program that runs until it is told to stop, for the tests of the viewer
 * beside a run (heapscope run --serve --every).
 *
 *   live_leak [STATUS]
 *
 * Prints "ready", then every 20 ms keeps 16 KiB in live_leak() (LEAK:live; at most 4096
 * blocks, 64 MiB) and allocates and frees more in churn(), until a line arrives on stdin or
 * stdin ends: it then prints "got: LINE" (the line without its newline; "got: EOF" at the
 * end of input) and "bye", and exits with STATUS (default 0). It never dumps itself:
 * heapscope run --every takes the dumps from outside. Every line is flushed when printed,
 * so a test reading stdout through a pipe sees it at once.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_KEPT 4096

static void *kept[MAX_KEPT];
static int nkept;

__attribute__((noinline)) void live_leak(void) {
    if (nkept < MAX_KEPT) {
        kept[nkept] = malloc(16 * 1024); /* LEAK:live */
        memset(kept[nkept], 1, 16 * 1024);
        nkept++;
    }
}

__attribute__((noinline)) void churn(void) {
    for (int i = 0; i < 50; i++) {
        char *p = malloc(2048);
        p[0] = (char)i;
        free(p);
    }
}

int main(int argc, char **argv) {
    int status = argc > 1 ? atoi(argv[1]) : 0;
    char line[256];
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        struct pollfd in = {.fd = 0, .events = POLLIN};
        int ready = poll(&in, 1, 20);
        if (ready > 0) {
            if (fgets(line, sizeof line, stdin) == NULL) {
                strcpy(line, "EOF");
            }
            line[strcspn(line, "\n")] = '\0';
            printf("got: %s\nbye\n", line);
            fflush(stdout);
            return status;
        }
        live_leak();
        churn();
    }
}
