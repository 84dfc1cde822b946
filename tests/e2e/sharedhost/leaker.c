/* A small program for the shared-host tests: leak_here() keeps 512 blocks of 4 KiB (2 MiB)
 * that are never freed; the rest is freed before exit. With argv[1] = "wait" it prints
 * "ready" and waits for a line on stdin before it exits (a live target for attach).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *kept[512];

__attribute__((noinline)) void leak_here(void) {
    for (int i = 0; i < 512; i++) {
        kept[i] = malloc(4096);
        memset(kept[i], 0x5a, 4096);
    }
}

__attribute__((noinline)) void churn(void) {
    for (int i = 0; i < 1000; i++) {
        char *p = malloc(1024);
        memset(p, 1, 1024);
        free(p);
    }
}

int main(int argc, char **argv) {
    leak_here();
    churn();
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin)) return 0;
    }
    return 0;
}
