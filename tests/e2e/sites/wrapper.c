/* wrapper.c: a C program with its own allocation wrapper, for heapscope's site tests.
 *
 * Build:  gcc -O2 -g wrapper.c -o wrapper
 * Run under LD_PRELOAD=libjemalloc.so.2 (prof:true). Prints "pid=<pid>"; exit 0.
 *
 * checked_alloc() does nothing but call malloc and stop the program when it fails, like
 * xmalloc; its name is the program's own, so heapscope can only tell it is a wrapper from
 * the profile (always the first frame above malloc, called from three functions). Each
 * caller leaks everything it allocates; the report's sites must be the three callers' lines
 * (marked LEAK:<tag>), never checked_alloc:
 *
 *   tag       caller          count  size (usable)   total
 *   header    parse_header    2,000  4,096           8,192,000
 *   body      parse_body        500  32,768         16,384,000
 *   trailer   parse_trailer   3,000  1,024           3,072,000
 *
 * A fourth function, make_record(), calls malloc itself from one caller only: it is the
 * site of its own allocations (not a wrapper).
 *
 *   record    make_record     1,000  2,048           2,048,000
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *keep[8000];
static int kept;

__attribute__((noinline)) void *checked_alloc(size_t n)
{
    void *p = malloc(n);
    if (p == NULL) {
        fprintf(stderr, "out of memory\n");
        abort();
    }
    return p;
}

__attribute__((noinline)) static void parse_header(int n)
{
    for (int i = 0; i < n; i++) {
        keep[kept++] = checked_alloc(4096);  /* LEAK:header */
    }
}

__attribute__((noinline)) static void parse_body(int n)
{
    for (int i = 0; i < n; i++) {
        keep[kept++] = checked_alloc(32768);  /* LEAK:body */
    }
}

__attribute__((noinline)) static void parse_trailer(int n)
{
    for (int i = 0; i < n; i++) {
        keep[kept++] = checked_alloc(1024);  /* LEAK:trailer */
    }
}

__attribute__((noinline)) static char *make_record(int i)
{
    char *r = malloc(2048);  /* LEAK:record */
    memset(r, i, 2048);
    return r;
}

int main(void)
{
    printf("pid=%d\n", (int)getpid());
    fflush(stdout);
    parse_header(2000);
    parse_body(500);
    parse_trailer(3000);
    for (int i = 0; i < 1000; i++) {
        keep[kept++] = make_record(i);
    }
    return 0;
}
