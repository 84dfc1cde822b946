/* heapscope symbolizer fixture: a PIE whose allocation happens in an always-inlined helper.
 * The LINE: markers let tests find line numbers without hard-coding them. */
#include <stdlib.h>
#include <string.h>

static inline __attribute__((always_inline)) void *inner_alloc(size_t n)
{
    void *p = malloc(n * 3); /* LINE:inner_malloc */
    if (p)
        memset(p, 1, n);
    return p;
}

__attribute__((noinline)) void *outer_alloc(size_t n)
{
    void *p = inner_alloc(n + 1); /* LINE:outer_call */
    return p;
}

int main(int argc, char **argv)
{
    (void)argv;
    void *p = outer_alloc((size_t)argc); /* LINE:main_call */
    return p == NULL;
}
