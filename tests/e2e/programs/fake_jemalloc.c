/* A stand-in for a jemalloc built WITHOUT profiling: it answers mallctl() like such a build
 * does (version string, config.prof = false) so heapscope's "ask the library" check can be
 * tested without compiling jemalloc. It allocates nothing itself. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen) {
    (void)newp; (void)newlen;
    if (strcmp(name, "version") == 0 && oldp && oldlenp && *oldlenp == sizeof(const char *)) {
        *(const char **)oldp = "5.3.0-0-gfake-noprof";
        return 0;
    }
    if (strcmp(name, "config.prof") == 0 && oldp && oldlenp && *oldlenp == sizeof(bool)) {
        *(bool *)oldp = false;
        return 0;
    }
    return ENOENT;
}
