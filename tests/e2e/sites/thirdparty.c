/* thirdparty.c: C leaks inside third-party libraries, for heapscope's site tests.
 *
 * Build:  gcc -O2 -g thirdparty.c -o thirdparty $(pkg-config --cflags --libs libxml-2.0)
 *             -lssl -lcrypto -lsqlite3 -lz
 * Run under LD_PRELOAD=libjemalloc.so.2 (prof:true). Prints "pid=<pid>", then one line
 * "truth <tag> <bytes>" per leak: the bytes the leaking function left allocated, measured by
 * jemalloc's own per-thread counters (thread.allocatedp / thread.deallocatedp, usable sizes)
 * around it. Exit 0.
 *
 * Each leak is one line of this file (marked LEAK:<tag>) calling into a Debian library that
 * allocates on its behalf; nothing is ever freed:
 *
 *   tag      function           library      what is never freed
 *   xml      keep_documents     libxml2      the parsed document (xmlReadMemory, no xmlFreeDoc)
 *   cipher   open_ciphers       libcrypto    an AES-256-CBC EVP_CIPHER_CTX, initialised
 *   mprintf  format_messages    libsqlite3   a sqlite3_mprintf string (no sqlite3_free)
 *   zlib     start_streams      libz         a deflate stream (deflateInit, no deflateEnd)
 *
 * Counts are chosen so the four totals differ clearly: zlib > xml > mprintf > cipher.
 */
#include <dlfcn.h>
#include <libxml/parser.h>
#include <openssl/evp.h>
#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);

static uint64_t *allocated_p;
static uint64_t *deallocated_p;

/* jemalloc's per-thread byte counters: the program's own measure of what a phase left. */
static void counters_init(void)
{
    mallctl_fn mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
    size_t len = sizeof(uint64_t *);
    if (mallctl == NULL || mallctl("thread.allocatedp", &allocated_p, &len, NULL, 0) != 0 ||
        mallctl("thread.deallocatedp", &deallocated_p, &len, NULL, 0) != 0) {
        fprintf(stderr, "thirdparty: run me under LD_PRELOAD=libjemalloc.so.2\n");
        exit(2);
    }
}

static int64_t live_now(void)
{
    return (int64_t)(*allocated_p - *deallocated_p);
}

static const char XML[] =
    "<?xml version=\"1.0\"?><catalog>"
    "<book id=\"1\"><title>Heap</title><author>A</author><price>10</price></book>"
    "<book id=\"2\"><title>Stack</title><author>B</author><price>20</price></book>"
    "<book id=\"3\"><title>Leak</title><author>C</author><price>30</price></book>"
    "<book id=\"4\"><title>Cache</title><author>D</author><price>40</price></book>"
    "</catalog>";

static xmlDocPtr docs[3000];
static EVP_CIPHER_CTX *ctxs[2000];
static char *messages[4000];
static z_stream *streams[60];

__attribute__((noinline)) static void keep_documents(int n)
{
    for (int i = 0; i < n; i++) {
        docs[i] = xmlReadMemory(XML, (int)sizeof XML - 1, "doc.xml", NULL, 0);  /* LEAK:xml */
    }
}

__attribute__((noinline)) static void open_ciphers(int n)
{
    unsigned char key[32] = {1}, iv[16] = {2};
    for (int i = 0; i < n; i++) {
        ctxs[i] = EVP_CIPHER_CTX_new();
        EVP_EncryptInit_ex(ctxs[i], EVP_aes_256_cbc(), NULL, key, iv);  /* LEAK:cipher */
    }
}

__attribute__((noinline)) static void format_messages(int n)
{
    for (int i = 0; i < n; i++) {
        messages[i] = sqlite3_mprintf("message %d: %0900d", i, i);  /* LEAK:mprintf */
    }
}

__attribute__((noinline)) static void start_streams(int n)
{
    for (int i = 0; i < n; i++) {
        streams[i] = calloc(1, sizeof(z_stream));
        deflateInit(streams[i], 6);  /* LEAK:zlib */
    }
}

int main(void)
{
    counters_init();
    printf("pid=%d\n", (int)getpid());
    xmlInitParser();
    sqlite3_initialize();
    int64_t before = live_now();
    keep_documents(3000);
    printf("truth xml %lld\n", (long long)(live_now() - before));
    before = live_now();
    open_ciphers(2000);
    printf("truth cipher %lld\n", (long long)(live_now() - before));
    before = live_now();
    format_messages(4000);
    printf("truth mprintf %lld\n", (long long)(live_now() - before));
    before = live_now();
    start_streams(60);
    printf("truth zlib %lld\n", (long long)(live_now() - before));
    fflush(stdout);
    return 0;
}
