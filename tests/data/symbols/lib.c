/* heapscope symbolizer fixture: a shared library (stripped by the tests) with a static
 * function placed between two exported ones. jeprof names an address inside
 * lib_internal_alloc after a neighbouring exported symbol; heapscope must give no name. */
#include <stdlib.h>

void *lib_public_a(size_t n)
{
    char *p = malloc(n + 1);
    if (p)
        p[0] = 0;
    return p;
}

static __attribute__((noinline)) void *lib_internal_alloc(size_t n)
{
    char *p = malloc(n);
    if (p)
        p[0] = 1;
    return p;
}

void *lib_public_b(size_t n)
{
    char *p = lib_internal_alloc(n * 2);
    if (p)
        p[0] = 2;
    return p;
}
