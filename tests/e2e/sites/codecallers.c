/* codecallers.c: helpers called from many places in the code, from one place at run time.
 *
 * Build:  gcc -O1 -g codecallers.c -o codecallers
 * Run under heapscope run. Prints "pid=<pid>"; exit 0 (after SECONDS, when given).
 *
 * buf_reserve() allocates through the program's own wrapper xmalloc() and returns the
 * memory; its name says nothing of allocating. Four functions call it (keep_names,
 * parse_header, format_reply, copy_path), but only keep_names runs, so a dump shows one
 * caller: only the program's code tells that buf_reserve is a helper. The report must name
 * keep_names, the caller that keeps the memory, with buf_reserve and xmalloc in `via`:
 *
 *   keep_names  keeps 2,000 names of 512 bytes: 1,024,000 bytes never freed (marked line)
 *
 * fill_table() calls malloc itself, from three functions in the code (one runs): a
 * function that keeps what it allocates (here in a global table) looks the same as a
 * helper from a dump, so it stays the site, its caller on the next line of the stack:
 *
 *   fill_table  2,000 rows of 256 bytes: 512,000 bytes never freed (marked line)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NAMES 2000
#define ROWS 2000

void *names[NAMES];  /* global: the stores cannot be optimized away */
void *rows[ROWS];
int nrows;
static volatile int never;  /* 0: the other callers are in the code, never run */

__attribute__((noinline)) void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

__attribute__((noinline)) char *buf_reserve(size_t n)
{
    char *p = xmalloc(n);
    p[0] = '\0';
    return p;
}

__attribute__((noinline)) static void keep_names(void)
{
    for (int i = 0; i < NAMES; i++) {
        char *s = buf_reserve(512);  /* LEAK:names */
        snprintf(s, 512, "name-%d", i);
        names[i] = s;
    }
}

__attribute__((noinline)) static char *parse_header(const char *text)
{
    char *out = buf_reserve(strlen(text) + 1);
    strcpy(out, text);
    return out;
}

__attribute__((noinline)) static char *format_reply(int code)
{
    char *out = buf_reserve(64);
    snprintf(out, 64, "%d", code);
    return out;
}

__attribute__((noinline)) static char *copy_path(const char *path)
{
    char *out = buf_reserve(strlen(path) + 2);
    strcpy(out, path);
    return out;
}

__attribute__((noinline)) void fill_table(size_t n)
{
    void *row = malloc(n);  /* LEAK:rows */
    memset(row, 1, n);
    rows[nrows++ % ROWS] = row;
}

__attribute__((noinline)) static void load_rows(void)
{
    for (int i = 0; i < ROWS; i++)
        fill_table(256);
}

__attribute__((noinline)) static void load_more(void) { fill_table(128); }
__attribute__((noinline)) static void load_extra(void) { fill_table(64); }

int main(int argc, char **argv)
{
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    keep_names();
    load_rows();
    if (never) {
        free(parse_header("x"));
        free(format_reply(200));
        free(copy_path("/"));
        load_more();
        load_extra();
    }
    if (argc > 1)  /* SECONDS: stay that long, for a dump taken from outside */
        sleep((unsigned)atoi(argv[1]));
    return 0;
}
