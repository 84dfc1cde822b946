/* Symbols with tikv-jemallocator's prefix, so heapscope's ELF inspection can be tested on a
 * real executable: a program that links a "_rjem_" jemalloc carries these names. */
int _rjem_mallctl(const char *n, void *o, unsigned long *ol, void *nw, unsigned long nl) {
    (void)n; (void)o; (void)ol; (void)nw; (void)nl;
    return 0;
}
void _rjem_je_prof_backtrace(void) {}
int main(void) { return _rjem_mallctl(0, 0, 0, 0, 0); }
