/*
 * helper.c -> libhelper.so, used by leaky.c.  Built with
 *     gcc -O1 -g -fPIC -shared -fno-toplevel-reorder helper.c -o libhelper.so
 *     strip --strip-all libhelper.so
 *
 * What it leaks: helper_public_a(3000) calls the *static*, noinline
 * helper_internal_alloc() 3,000 times; each call leaks malloc(1000), which
 * jemalloc counts as 1024 B (size class).  Truth: 3,000 objects, 3,072,000 B,
 * all on the main thread ("leaky-main").
 *
 * The library is stripped (only .dynsym is left), so no symbol covers
 * helper_internal_alloc.  -fno-toplevel-reorder keeps the source order in .text:
 *     helper_internal_alloc < helper_public_a < helper_public_b
 * so the allocating frame lies *before* the first exported symbol.  jeprof
 * names it after the next export (helper_public_a) because it never checks
 * pc >= start for the first symbol (reference §5, wrong output 1); a correct
 * symbolizer must print "libhelper.so+0x<off>" for that frame, never
 * helper_public_a or helper_public_b.  The *caller* frame (the return address
 * inside helper_public_a's loop) is legitimately named helper_public_a.
 */
#include <stdlib.h>

struct helper_node {
    struct helper_node *next;
    char payload[1000 - sizeof(struct helper_node *)];
};

static struct helper_node *helper_head;
static volatile int helper_calls;

__attribute__((noinline)) static void helper_internal_alloc(void)
{
    struct helper_node *n = malloc(1000); /* LEAK:helper */
    n->next = helper_head;
    helper_head = n;
    helper_calls++;
}

int helper_public_a(int count)
{
    for (int i = 0; i < count; i++)
        helper_internal_alloc();
    return helper_calls;
}

/* An export that follows; must not be used for the internal frame either. */
int helper_public_b(int x)
{
    return x + helper_calls;
}
