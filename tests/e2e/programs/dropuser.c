/* dropuser.c: a daemon whose worker drops privileges by itself, as nginx's workers do.
 *
 *   dropuser SECONDS
 *
 * The master (started as root) forks one worker, which switches to the user "nobody"
 * (setgid, setgroups, setuid) and then leaks 64 KiB every 50 ms in worker_leak() until
 * SECONDS have passed; the master waits for it. Run as root under `heapscope run --every`,
 * the worker can no longer write into the session's root-owned dumps folder.
 *
 * TRUTH: the worker (the master's only child) leaks in worker_leak, ~1.25 MiB a second;
 * the master leaks nothing.
 */
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void *kept[100000]; /* global: the compiler must keep every store (and so every malloc) */

__attribute__((noinline)) void worker_leak(int i) {
    kept[i] = malloc(64 * 1024);
    memset(kept[i], 1, 64 * 1024);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 6.0;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        struct passwd *pw = getpwnam("nobody");
        if (pw == NULL || setgroups(0, NULL) != 0 || setgid(pw->pw_gid) != 0 ||
            setuid(pw->pw_uid) != 0) {
            perror("dropuser: cannot switch to nobody");
            return 2;
        }
        double end = now() + seconds;
        struct timespec pause = {0, 50 * 1000 * 1000};
        for (int i = 0; now() < end && i < 100000; i++) {
            worker_leak(i);
            nanosleep(&pause, NULL);
        }
        return 0;
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
