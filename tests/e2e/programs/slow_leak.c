/* Runs about three seconds: slow_leak() keeps 64 KiB every 50 ms (about 3.8 MiB in all) while
 * churn() allocates and frees. It never dumps itself: heapscope run --every takes the dumps
 * from outside, so the series shows slow_leak growing. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

void *kept[4096];
int nkept;

__attribute__((noinline)) void slow_leak(void) {
    kept[nkept] = malloc(64 * 1024);  /* LEAK:slow */
    memset(kept[nkept], 1, 64 * 1024);
    nkept++;
}

__attribute__((noinline)) void churn(void) {
    for (int i = 0; i < 100; i++) {
        char *p = malloc(4096);
        p[0] = (char)i;
        free(p);
    }
}

int main(void) {
    struct timespec pause = {0, 50 * 1000 * 1000};
    for (int step = 0; step < 60; step++) {
        slow_leak();
        churn();
        nanosleep(&pause, NULL);
    }
    return 0;
}
