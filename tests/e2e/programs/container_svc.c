/* container_svc.c: a service for the container tests, run inside a chroot built by the test.
 *
 *   container_svc
 *
 * Every 10 ms keeps 8 KiB in leak_in_container() (LEAK:container; at most 8192 blocks,
 * 64 MiB) and allocates and frees more in churn(), until SIGTERM. It never dumps itself:
 * heapscope attach and the agent take the dumps from outside its root.
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_KEPT 8192

void *kept[MAX_KEPT]; /* global: the compiler may not drop the stores */
int nkept;
static volatile sig_atomic_t stop;

static void on_term(int sig) {
    (void)sig;
    stop = 1;
}

__attribute__((noinline)) void leak_in_container(void) {
    if (nkept < MAX_KEPT) {
        kept[nkept] = malloc(8 * 1024); /* LEAK:container */
        memset(kept[nkept], 1, 8 * 1024);
        nkept++;
    }
}

__attribute__((noinline)) void churn(void) {
    for (int i = 0; i < 20; i++) {
        char *p = malloc(1024);
        p[0] = (char)i;
        free(p);
    }
}

int main(void) {
    struct timespec tick = {0, 10 * 1000 * 1000};
    signal(SIGTERM, on_term);
    while (!stop) {
        leak_in_container();
        churn();
        nanosleep(&tick, NULL);
    }
    return 0;
}
