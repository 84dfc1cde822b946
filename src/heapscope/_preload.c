/* heapscope's helper inside the processes `heapscope run` starts (preloaded with LD_PRELOAD).
 *
 * It lets heapscope reach a process's jemalloc without stopping it, and keeps jemalloc's own
 * messages without standing between the program and its stderr:
 *
 * - a control thread serves mallctl requests on a Unix socket, $HEAPSCOPE_CTL/<pid>.sock
 *   (the folder is heapscope's, mode 0700; peers other than root and the process's own user
 *   are refused). The thread blocks every signal, so none meant for the program lands on it.
 *   After fork() the child gets its own socket and thread (pthread_atfork, registered after
 *   jemalloc's own fork handlers, so its locks are usable again). Sockets are made while the
 *   process is single-threaded (in the constructor, in the child after fork) and moved to a
 *   high descriptor number. If the program closes the socket or reuses its descriptor, the
 *   thread notices (it checks the socket's inode before each accept) and makes a new one,
 *   never closing a descriptor whose inode is not the one it made.
 * - jemalloc's messages (malloc_message: its leak summary at exit, a dump it could not write)
 *   are appended to the file $HEAPSCOPE_JEMALLOC_LOG, one line each with the pid in front,
 *   and also written to stderr as jemalloc would, except its exit-time leak summary. The
 *   file is also kept open from the start (at a high number, checked by inode before each
 *   use) for processes that switch to a user who may not open it.
 *
 * Requests, one per connection, are lines "<r|w> <type> <name> [<value>]" ended by an empty
 * line: type b bool, u unsigned, z size_t, s ssize_t, q uint64, t string, n none; a string
 * value is hex. The answer starts "heapscope-ctl 1 <pid> <tid> <mallctl symbol or ->", then a
 * line "<rc> <value or ->" per request (strings hex, numbers decimal). Nothing here allocates
 * except what mallctl itself does.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef void (*message_fn)(void *, const char *);

static char dir[sizeof(((struct sockaddr_un *)0)->sun_path) - 24];
static char sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static char log_path[4096];
static int listen_fd = -1;
static ino_t listen_ino;
static pid_t sock_pid;
static message_fn previous_message;

/* Far from the low numbers programs close, reuse and hand to children. */
static int high_floor(void) {
    struct rlimit rl;
    int floor = 600;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        rl.rlim_cur < 1200)
        floor = (int)rl.rlim_cur / 2;
    return floor;
}

static bool still_ours(int fd) {
    struct stat st;
    return fd >= 0 && fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == listen_ino;
}

static ino_t inode_of(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

/* Close a descriptor this helper made, unless the program has closed it and reused its
 * number meanwhile (a program closing every descriptor while the helper makes its socket). */
static void close_if_ours(int fd, ino_t ino) {
    if (inode_of(fd) == ino) close(fd);
}

static int make_socket(void) {
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    int n = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/%d.sock", dir, (int)getpid());
    if (n < 0 || (size_t)n >= sizeof addr.sun_path) return -1;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -1;
    ino_t ino = inode_of(s);
    unlink(addr.sun_path); /* an earlier process's, with the same pid */
    if (!ino || bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 8) != 0) {
        close_if_ours(s, ino);
        return -1;
    }
    int floor = high_floor();
    int high = floor > 10 ? fcntl(s, F_DUPFD_CLOEXEC, floor) : -1;
    if (high >= 0) {
        if (inode_of(high) != ino) { /* the number was the program's by then */
            close(high);
            return -1;
        }
        close_if_ours(s, ino);
        s = high;
    }
    listen_ino = ino;
    memcpy(sock_path, addr.sun_path, sizeof sock_path);
    sock_pid = getpid();
    return s;
}

static mallctl_fn find_mallctl(const char **name) {
    static const char *names[] = {"mallctl", "_rjem_mallctl"};
    for (unsigned i = 0; i < 2; i++) {
        void *f = dlsym(RTLD_DEFAULT, names[i]);
        if (f) {
            *name = names[i];
            return (mallctl_fn)f;
        }
    }
    *name = "-";
    return NULL;
}

/* ---- answers ---------------------------------------------------------------------------- */

struct out {
    char buf[16384];
    size_t len;
};

static void put(struct out *o, const char *s, size_t n) {
    if (o->len + n > sizeof o->buf) n = sizeof o->buf - o->len;
    memcpy(o->buf + o->len, s, n);
    o->len += n;
}

static void puts_(struct out *o, const char *s) { put(o, s, strlen(s)); }

static void put_hex(struct out *o, const char *s) {
    static const char digits[] = "0123456789abcdef";
    for (; *s && o->len + 3 < sizeof o->buf; s++) {
        o->buf[o->len++] = digits[(unsigned char)*s >> 4];
        o->buf[o->len++] = digits[(unsigned char)*s & 15];
    }
}

static int unhex(const char *s, char *out, size_t cap) {
    size_t n = 0;
    for (; s[0] && s[1] && n + 1 < cap; s += 2) {
        int hi = s[0] <= '9' ? s[0] - '0' : (s[0] | 32) - 'a' + 10;
        int lo = s[1] <= '9' ? s[1] - '0' : (s[1] | 32) - 'a' + 10;
        if (hi < 0 || hi > 15 || lo < 0 || lo > 15) return -1;
        out[n++] = (char)(hi << 4 | lo);
    }
    out[n] = 0;
    return 0;
}

static size_t type_size(char t) {
    switch (t) {
    case 'b': return sizeof(bool);
    case 'u': return sizeof(unsigned);
    case 'z': case 's': case 'q': return 8;
    case 't': return sizeof(const char *);
    default: return 0;
    }
}

/* One request line: "r z stats.allocated" or "w t prof.dump 2f746d70...". */
static void run_one(mallctl_fn mallctl, char *line, struct out *o) {
    char *save = NULL;
    char *op = strtok_r(line, " ", &save);
    char *type = strtok_r(NULL, " ", &save);
    char *name = strtok_r(NULL, " ", &save);
    char *value = strtok_r(NULL, " ", &save);
    char text[4096];
    char num[48];
    if (!op || !type || !name || (op[0] != 'r' && op[0] != 'w') || type[1]) {
        puts_(o, "22 -\n");
        return;
    }
    char t = type[0];
    size_t size = type_size(t);
    union {
        bool b;
        unsigned u;
        uint64_t q;
        int64_t s;
        const char *str;
    } v;
    memset(&v, 0, sizeof v);
    int rc;
    if (!mallctl) {
        rc = ENOENT;
    } else if (op[0] == 'r') {
        size_t len = size;
        rc = mallctl(name, size ? &v : NULL, size ? &len : NULL, NULL, 0);
    } else if (t == 'n' || !value) {
        rc = mallctl(name, NULL, NULL, NULL, 0);
    } else {
        if (t == 't') {
            if (unhex(value, text, sizeof text) != 0) {
                puts_(o, "22 -\n");
                return;
            }
            v.str = text;
        } else if (t == 'b') {
            v.b = value[0] == '1';
        } else if (t == 'u') {
            v.u = (unsigned)strtoul(value, NULL, 10);
        } else if (t == 's') {
            v.s = strtoll(value, NULL, 10);
        } else {
            v.q = strtoull(value, NULL, 10);
        }
        rc = mallctl(name, NULL, NULL, &v, size);
    }
    snprintf(num, sizeof num, "%d ", rc);
    puts_(o, num);
    if (rc != 0 || op[0] == 'w' || t == 'n') {
        puts_(o, "-\n");
        return;
    }
    switch (t) {
    case 'b': snprintf(num, sizeof num, "%d", v.b ? 1 : 0); break;
    case 'u': snprintf(num, sizeof num, "%u", v.u); break;
    case 's': snprintf(num, sizeof num, "%lld", (long long)v.s); break;
    case 't':
        if (v.str) put_hex(o, v.str);
        else puts_(o, "-");
        puts_(o, "\n");
        return;
    default: snprintf(num, sizeof num, "%llu", (unsigned long long)v.q); break;
    }
    puts_(o, num);
    puts_(o, "\n");
}

static void serve(int c) {
    struct ucred cr;
    socklen_t crlen = sizeof cr;
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) != 0 ||
        (cr.uid != 0 && cr.uid != geteuid()))
        return;
    static char req[16384];
    size_t len = 0;
    while (len + 1 < sizeof req) {
        struct pollfd p = {c, POLLIN, 0};
        if (poll(&p, 1, 5000) <= 0) return;
        ssize_t n = read(c, req + len, sizeof req - 1 - len);
        if (n <= 0) break;
        len += (size_t)n;
        req[len] = 0;
        if (strstr(req, "\n\n")) break;
    }
    req[len] = 0;
    /* heapscope gave up waiting (a stuck earlier request): do not act on it late. */
    struct pollfd gone = {c, POLLRDHUP, 0};
    if (poll(&gone, 1, 0) > 0 && (gone.revents & (POLLRDHUP | POLLHUP | POLLERR))) return;
    static struct out o;
    o.len = 0;
    const char *sym;
    mallctl_fn mallctl = find_mallctl(&sym);
    char head[96];
    snprintf(head, sizeof head, "heapscope-ctl 1 %d %ld %s\n", (int)getpid(),
             (long)syscall(SYS_gettid), sym);
    puts_(&o, head);
    char *save = NULL;
    for (char *line = strtok_r(req, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
        if (*line) run_one(mallctl, line, &o);
    puts_(&o, "end\n");
    for (size_t off = 0; off < o.len;) {
        ssize_t n = send(c, o.buf + off, o.len - off, MSG_NOSIGNAL);
        if (n <= 0) break;
        off += (size_t)n;
    }
}

static void *control(void *arg) {
    (void)arg;
    prctl(PR_SET_NAME, "heapscope-ctl", 0, 0, 0);
    int failures = 0;
    for (;;) {
        if (!still_ours(listen_fd)) {
            /* Never closed here: the number may be the program's now. Made again a moment
             * later: a program closing every descriptor is done by then. */
            struct timespec pause = {0, 200 * 1000 * 1000};
            nanosleep(&pause, NULL);
            listen_fd = make_socket();
            if (listen_fd < 0) {
                if (++failures > 10) return NULL; /* no socket here (a sandbox): no helper */
                continue;
            }
        }
        struct pollfd p = {listen_fd, POLLIN, 0};
        int r = poll(&p, 1, 1000);
        if (r <= 0 || !(p.revents & POLLIN) || !still_ours(listen_fd)) continue;
        int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0) continue;
        serve(c);
        close(c);
    }
}

static void start(void) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 512 * 1024);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    pthread_create(&t, &attr, control, NULL);
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static void after_fork_in_child(void) {
    /* The parent's socket stays the parent's; the thread did not come along. The child is
     * one thread here, so its own socket is made before anything else can run. */
    if (still_ours(listen_fd)) close(listen_fd);
    listen_fd = make_socket();
    start();
}

/* ---- jemalloc's messages ---------------------------------------------------------------- */

static bool is_summary(const char *s) {
    return strstr(s, "<jemalloc>: Leak approximation summary") == s ||
           strstr(s, "<jemalloc>: Leak summary") == s || strstr(s, "<jemalloc>: Run jeprof") == s;
}

/* The log as opened at start, for a process that later switches to a user who may not open
 * it (a daemon's workers): known by device and inode, and never written once the program has
 * closed it or reused its number for a file of its own. */
static int log_fd = -1;
static dev_t log_dev;
static ino_t log_ino;

static void keep_log(void) {
    int fd = open(log_path, O_WRONLY | O_APPEND | O_CLOEXEC);
    struct stat st;
    if (fd < 0) return;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return;
    }
    int floor = high_floor();
    int high = floor > 10 ? fcntl(fd, F_DUPFD_CLOEXEC, floor) : -1;
    if (high >= 0) { /* single-threaded here: both numbers are still ours */
        close(fd);
        fd = high;
    }
    log_fd = fd;
    log_dev = st.st_dev;
    log_ino = st.st_ino;
}

static bool log_still_ours(void) {
    struct stat st;
    return log_fd >= 0 && fstat(log_fd, &st) == 0 && st.st_dev == log_dev &&
           st.st_ino == log_ino;
}

static void on_message(void *cbopaque, const char *s) {
    char pid[24];
    int n = snprintf(pid, sizeof pid, "%d\t", (int)getpid());
    size_t len = strlen(s);
    int fd = log_path[0] ? open(log_path, O_WRONLY | O_APPEND | O_CLOEXEC) : -1;
    bool opened = fd >= 0;
    if (!opened && log_still_ours()) fd = log_fd;
    bool kept = false;
    if (fd >= 0) {
        struct iovec iov[3] = {{pid, (size_t)n}, {(void *)s, len}, {"\n", 1}};
        int parts = len && s[len - 1] == '\n' ? 2 : 3;
        kept = writev(fd, iov, parts) > 0;
        if (opened) close(fd);
    }
    if (kept && is_summary(s)) return;
    if (previous_message) {
        previous_message(cbopaque, s);
    } else {
        ssize_t ignored = write(STDERR_FILENO, s, len);
        (void)ignored;
    }
}

static void hook_messages(void) {
    static const char *names[] = {"malloc_message", "_rjem_malloc_message"};
    for (unsigned i = 0; i < 2; i++) {
        message_fn *var = (message_fn *)dlsym(RTLD_DEFAULT, names[i]);
        if (var) {
            previous_message = *var;
            *var = on_message;
            return;
        }
    }
}

/* ---- start and end ---------------------------------------------------------------------- */

__attribute__((constructor)) static void heapscope_preload_init(void) {
    const char *d = getenv("HEAPSCOPE_CTL");
    if (!d || !*d || strlen(d) >= sizeof dir) return;
    struct stat st;
    /* Only a folder of root's or of this user's, that nobody else may write. */
    if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode) || (st.st_mode & 022) ||
        (st.st_uid != 0 && st.st_uid != geteuid()))
        return;
    strcpy(dir, d);
    const char *log = getenv("HEAPSCOPE_JEMALLOC_LOG");
    if (log && strlen(log) < sizeof log_path) {
        strcpy(log_path, log);
        keep_log();
    }
    free(malloc(1)); /* jemalloc set up (and its fork handlers registered) before ours */
    hook_messages();
    pthread_atfork(NULL, NULL, after_fork_in_child);
    /* Made here, while the process runs nothing but constructors on one thread. */
    listen_fd = make_socket();
    start();
}

__attribute__((destructor)) static void heapscope_preload_fini(void) {
    if (sock_pid == getpid() && sock_path[0]) unlink(sock_path);
}
