/* libcleak.c: a small C library that leaky.py loads with ctypes (heapscope's `run`
 * end-to-end tests).
 *
 * cl_make_record(n) returns a malloc'd, NUL-terminated RECORD_BYTES-byte text record
 * that the caller must release with cl_free_record(). leaky.py declares the result as
 * ctypes.c_char_p, so ctypes copies the text into a Python bytes object and the
 * malloc'd buffer is never freed (a classic ctypes leak).
 *
 * TRUTH: every call leaks RECORD_BYTES (1 KiB) allocated in cl_make_record; leaky.py
 * calls it 20,000 times: 20,480,000 B live at exit.
 * Expected first suspect: function cl_make_record (libcleak.c), in the python process.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RECORD_BYTES 1024

__attribute__((noinline)) char *cl_make_record(int n) {
    char *rec = malloc(RECORD_BYTES);
    if (rec == NULL) return NULL;
    memset(rec, ' ', RECORD_BYTES - 1);
    rec[RECORD_BYTES - 1] = '\0';
    int len = snprintf(rec, RECORD_BYTES, "record %d:", n);
    if (len > 0 && len < RECORD_BYTES) rec[len] = ' ';
    return rec;
}

void cl_free_record(char *rec) { free(rec); }
