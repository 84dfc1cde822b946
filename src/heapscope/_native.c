/* heapscope._native: the per-stack loops of reading and reducing a heap dump, in C.
 *
 * A 20 MB dump holds about 65,000 stacks of 20 return addresses; every pass over it in
 * Python costs a dictionary lookup per frame per stack. These functions do exactly what
 * the Python code next to them does (heapscope.formats.jemalloc, .scan,
 * heapscope.analysis.prune, .fold, .aggregate, .unsample, heapscope.model), on the same
 * objects, and the Python code stays the reference: tests run both on the same inputs
 * and compare. A function that meets anything unusual returns None and the caller takes
 * the Python path, which also gives the precise error for damaged input.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* The loops below make tens of thousands of tuples and no cycles; the cyclic collector
   would otherwise run every 700 of them, each time walking all the dump's objects. */
#define PAUSE_GC int gc_was_on = PyGC_Disable()
#define RESUME_GC if (gc_was_on) PyGC_Enable()

/* ---- a small open-addressing table: 64-bit key (or four of them) -> owned object ---- */

typedef struct {
    uint64_t k[4];
    PyObject *v; /* NULL: empty slot */
} Slot;

typedef struct {
    Slot *slots;
    size_t mask;
    size_t used;
} Table;

static int table_init(Table *t, size_t hint) {
    size_t n = 1024;
    while (n < hint * 2) n <<= 1;
    t->slots = PyMem_Calloc(n, sizeof(Slot));
    if (t->slots == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->mask = n - 1;
    t->used = 0;
    return 0;
}

static void table_free(Table *t) {
    if (t->slots == NULL) return;
    for (size_t i = 0; i <= t->mask; i++) Py_XDECREF(t->slots[i].v);
    PyMem_Free(t->slots);
    t->slots = NULL;
}

static inline size_t hash4(const uint64_t *k, int n) {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    for (int i = 0; i < n; i++) {
        h ^= k[i];
        h *= 0xff51afd7ed558ccdULL;
        h ^= h >> 33;
    }
    return (size_t)h;
}

static int table_grow(Table *t, int n);

/* The slot for key k (n words): either holding it or empty (then fill ->v and ->k). */
static Slot *table_find(Table *t, const uint64_t *k, int n) {
    size_t i = hash4(k, n) & t->mask;
    for (;;) {
        Slot *s = &t->slots[i];
        if (s->v == NULL) return s;
        if (memcmp(s->k, k, (size_t)n * sizeof(uint64_t)) == 0) return s;
        i = (i + 1) & t->mask;
    }
}

/* Store v (a new reference, stolen) for k in the empty slot s; grows when 1/2 full. */
static int table_put(Table *t, Slot *s, const uint64_t *k, int n, PyObject *v) {
    memcpy(s->k, k, (size_t)n * sizeof(uint64_t));
    s->v = v;
    if (++t->used * 2 > t->mask) return table_grow(t, n);
    return 0;
}

static int table_grow(Table *t, int n) {
    Table bigger;
    if (table_init(&bigger, (t->mask + 1)) < 0) return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        Slot *s = &t->slots[i];
        if (s->v == NULL) continue;
        Slot *d = table_find(&bigger, s->k, n);
        memcpy(d->k, s->k, sizeof(s->k));
        d->v = s->v;
        bigger.used++;
    }
    PyMem_Free(t->slots);
    *t = bigger;
    return 0;
}

/* ---- Sample construction: a NamedTuple subclass of tuple with four fields ---- */

static PyObject *new_sample(PyTypeObject *cls, PyObject *stack, PyObject *values,
                            PyObject *threads, PyObject *via) {
    PyObject *o = cls->tp_alloc(cls, 4);
    if (o == NULL) return NULL;
    Py_INCREF(stack);
    Py_INCREF(values);
    Py_INCREF(threads);
    Py_INCREF(via);
    PyTuple_SET_ITEM(o, 0, stack);
    PyTuple_SET_ITEM(o, 1, values);
    PyTuple_SET_ITEM(o, 2, threads);
    PyTuple_SET_ITEM(o, 3, via);
    return o;
}

static int check_sample_type(PyObject *cls) {
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type) ||
        ((PyTypeObject *)cls)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "sample type must be a tuple subclass without slots");
        return -1;
    }
    return 0;
}

/* A sample's fields, checked: a tuple of four with a tuple stack. */
static int sample_fields(PyObject *s, PyObject **stack, PyObject **values, PyObject **threads,
                         PyObject **via) {
    if (!PyTuple_Check(s) || PyTuple_GET_SIZE(s) != 4) {
        PyErr_SetString(PyExc_TypeError, "samples must be 4-tuples");
        return -1;
    }
    *stack = PyTuple_GET_ITEM(s, 0);
    *values = PyTuple_GET_ITEM(s, 1);
    *threads = PyTuple_GET_ITEM(s, 2);
    *via = PyTuple_GET_ITEM(s, 3);
    if (!PyTuple_Check(*stack) || !PyTuple_Check(*values)) {
        PyErr_SetString(PyExc_TypeError, "a sample's stack and values must be tuples");
        return -1;
    }
    return 0;
}

/* ---- lookups through an identity cache ---- */

/* dict[key], filled from fn(key) on a miss, through `seen`: a table by the key object's
   identity. A parse shares equal addresses, so most lookups of a million frames need no
   hashing at all. Sets *fresh (when given) to whether `seen` had not met the key yet.
   Returns a borrowed reference (the dict holds it), NULL on error. */
static PyObject *cached_get(Table *seen, PyObject *dict, PyObject *key, PyObject *fn,
                            int *fresh) {
    uint64_t k = (uint64_t)(uintptr_t)key;
    Slot *s = table_find(seen, &k, 1);
    if (fresh != NULL) *fresh = s->v == NULL;
    if (s->v != NULL) return PyTuple_GET_ITEM(s->v, 1);
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v == NULL) {
        if (PyErr_Occurred()) return NULL;
        PyObject *got = PyObject_CallOneArg(fn, key);
        if (got == NULL) return NULL;
        int bad = PyDict_SetItem(dict, key, got);
        Py_DECREF(got);
        if (bad < 0) return NULL;
        v = got;
    }
    /* The table holds the key too, so its identity is not reused while the table lives. */
    PyObject *pair = PyTuple_Pack(2, key, v);
    if (pair == NULL) return NULL;
    if (table_put(seen, s, &k, 1, pair) < 0) return NULL;
    return v;
}

/* True the first time `key` (by identity) is offered to `seen`; -1 on error. */
static int first_sight(Table *seen, PyObject *key) {
    uint64_t k = (uint64_t)(uintptr_t)key;
    Slot *s = table_find(seen, &k, 1);
    if (s->v != NULL) return 0;
    Py_INCREF(key);
    if (table_put(seen, s, &k, 1, key) < 0) return -1;
    return 1;
}

/* ---- parse_records: the stack records of a heap_v2 dump ---- */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
} Cursor;

static inline int is_blank(unsigned char c) { return c == ' ' || c == '\t'; }

/* Up to 19 decimal digits (64-bit counters; longer numbers are damage). */
static inline int read_decimal(Cursor *c, uint64_t *out) {
    const unsigned char *p = c->p;
    uint64_t v = 0;
    int n = 0;
    while (p < c->end && *p >= '0' && *p <= '9') {
        v = v * 10 + (uint64_t)(*p - '0');
        p++;
        if (++n > 19) return -1;
    }
    if (n == 0) return -1;
    c->p = p;
    *out = v;
    return 0;
}

static inline void skip_blanks(Cursor *c) {
    while (c->p < c->end && is_blank(*c->p)) c->p++;
}

static inline int expect(Cursor *c, unsigned char ch) {
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 0;
    }
    return -1;
}

/* "t*: N: N [N: N]" after the leading blanks, up to the end of the line (exclusive). */
static int read_counts(Cursor *c, uint64_t out[4]) {
    if (expect(c, 't') || expect(c, '*') || expect(c, ':')) return -1;
    skip_blanks(c);
    if (read_decimal(c, &out[0]) || expect(c, ':')) return -1;
    skip_blanks(c);
    if (read_decimal(c, &out[1])) return -1;
    skip_blanks(c);
    if (expect(c, '[')) return -1;
    skip_blanks(c);
    if (read_decimal(c, &out[2]) || expect(c, ':')) return -1;
    skip_blanks(c);
    if (read_decimal(c, &out[3])) return -1;
    skip_blanks(c);
    if (expect(c, ']')) return -1;
    skip_blanks(c);
    return c->p == c->end ? 0 : -1;
}

/* Hex digit values, 0xff for anything else: a table, since branches on each character of
   20 MB of addresses cost more than the rest of the parse. */
static unsigned char hex_value[256];

static void init_hex(void) {
    memset(hex_value, 0xff, sizeof(hex_value));
    for (int i = 0; i < 10; i++) hex_value['0' + i] = (unsigned char)i;
    for (int i = 0; i < 6; i++) {
        hex_value['a' + i] = (unsigned char)(10 + i);
        hex_value['A' + i] = (unsigned char)(10 + i);
    }
}

static PyObject *parse_records_impl(PyObject *self, PyObject *args) {
    PyObject *text, *cls;
    Py_ssize_t start, stop;
    if (!PyArg_ParseTuple(args, "UnnO", &text, &start, &stop, &cls)) return NULL;
    if (check_sample_type(cls) < 0) return NULL;
    if (PyUnicode_READY(text) < 0) return NULL;
    if (PyUnicode_KIND(text) != PyUnicode_1BYTE_KIND) Py_RETURN_NONE;
    Py_ssize_t len = PyUnicode_GET_LENGTH(text);
    if (start < 0 || stop > len || start > stop) {
        PyErr_SetString(PyExc_ValueError, "bad range");
        return NULL;
    }
    const unsigned char *base = PyUnicode_1BYTE_DATA(text);
    const unsigned char *p = base + start, *end = base + stop;

    PyObject *empty = PyTuple_New(0);
    PyObject *out = PyList_New(0);
    Table addrs = {0}, counts = {0};
    uint64_t *frames = NULL;
    size_t cap = 256;
    if (empty == NULL || out == NULL || table_init(&addrs, 8192) < 0 ||
        table_init(&counts, 4096) < 0)
        goto fail;
    frames = PyMem_Malloc(cap * sizeof(uint64_t));
    if (frames == NULL) {
        PyErr_NoMemory();
        goto fail;
    }

    while (p < end) {
        const unsigned char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL) eol = end;
        if (p == eol) { /* blank line */
            p = eol + 1;
            continue;
        }
        if (*p != '@') goto unusual; /* stray text: the line parser knows what to do */
        /* The stack line: "@ 0x… 0x…", leaf first. */
        size_t n = 0;
        const unsigned char *q = p + 1;
        for (;;) {
            while (q < eol && *q == ' ') q++;
            if (q == eol) break;
            if (q + 1 < eol && q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) q += 2;
            uint64_t v = 0;
            const unsigned char *digits = q;
            unsigned char d;
            while (q < eol && (d = hex_value[*q]) != 0xff) {
                v = (v << 4) | d;
                q++;
            }
            if (q == digits || q - digits > 16 || (q < eol && *q != ' ')) goto unusual;
            if (n == cap) {
                cap *= 2;
                uint64_t *bigger = PyMem_Realloc(frames, cap * sizeof(uint64_t));
                if (bigger == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                frames = bigger;
            }
            frames[n++] = v;
        }
        /* Count lines: the first "t*" one is the stack's; per-thread and other lines are
           skipped as the line parser skips them when threads are not asked for. */
        PyObject *values = NULL;
        p = eol < end ? eol + 1 : end;
        while (p < end && (*p == ' ' || *p == '\t' || *p == 't' || *p == '\n')) {
            const unsigned char *e = memchr(p, '\n', (size_t)(end - p));
            if (e == NULL) e = end;
            Cursor c = {p, e};
            skip_blanks(&c);
            if (c.p + 1 < e && c.p[0] == 't' && c.p[1] == '*') {
                uint64_t v[4];
                if (values != NULL || read_counts(&c, v) < 0) goto unusual;
                Slot *s = table_find(&counts, v, 4);
                if (s->v == NULL) {
                    PyObject *tup = Py_BuildValue("(dddd)", (double)v[0], (double)v[1],
                                                  (double)v[2], (double)v[3]);
                    if (tup == NULL || table_put(&counts, s, v, 4, tup) < 0) goto fail;
                    s = table_find(&counts, v, 4);
                }
                values = s->v;
            } else {
                /* A skipped line (per-thread counts, an extension's record, blanks): any
                   other control character or non-ASCII byte may be a line break to the
                   line parser, so leave such text to it. */
                for (const unsigned char *x = c.p; x < e; x++)
                    if ((*x < 0x20 && *x != '\t') || *x >= 0x7f) goto unusual;
            }
            p = e < end ? e + 1 : end;
        }
        if (values == NULL) goto unusual; /* truncated record: the line parser says so */
        PyObject *stack = PyTuple_New((Py_ssize_t)n);
        if (stack == NULL) goto fail;
        for (size_t i = 0; i < n; i++) {
            Slot *s = table_find(&addrs, &frames[i], 1);
            if (s->v == NULL) {
                PyObject *num = PyLong_FromUnsignedLongLong(frames[i]);
                if (num == NULL || table_put(&addrs, s, &frames[i], 1, num) < 0) {
                    Py_XDECREF(num);
                    Py_DECREF(stack);
                    goto fail;
                }
                s = table_find(&addrs, &frames[i], 1);
            }
            Py_INCREF(s->v);
            PyTuple_SET_ITEM(stack, (Py_ssize_t)i, s->v);
        }
        PyObject *sample = new_sample((PyTypeObject *)cls, stack, values, empty, empty);
        Py_DECREF(stack);
        if (sample == NULL || PyList_Append(out, sample) < 0) {
            Py_XDECREF(sample);
            goto fail;
        }
        Py_DECREF(sample);
    }
    PyMem_Free(frames);
    table_free(&addrs);
    table_free(&counts);
    Py_DECREF(empty);
    return out;

unusual:
    PyMem_Free(frames);
    table_free(&addrs);
    table_free(&counts);
    Py_DECREF(empty);
    Py_DECREF(out);
    Py_RETURN_NONE;

fail:
    PyMem_Free(frames);
    table_free(&addrs);
    table_free(&counts);
    Py_XDECREF(empty);
    Py_XDECREF(out);
    return NULL;
}

/* ---- address_sets: every address of any stack, and those in a non-leaf position ---- */

static PyObject *address_sets_impl(PyObject *self, PyObject *samples) {
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *all = PySet_New(NULL), *callers = PySet_New(NULL);
    /* Objects already added, by identity and position (leaf or not): a parse shares equal
       addresses, so most of a million frames are skipped before any hashing. */
    Table seen = {0};
    if (all == NULL || callers == NULL || table_init(&seen, 16384) < 0) goto fail;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto fail;
        Py_ssize_t n = PyTuple_GET_SIZE(stack);
        for (Py_ssize_t j = 0; j < n; j++) {
            PyObject *a = PyTuple_GET_ITEM(stack, j);
            uint64_t k[2] = {(uint64_t)(uintptr_t)a, j ? 1 : 0};
            Slot *s = table_find(&seen, k, 2);
            if (s->v != NULL) continue;
            Py_INCREF(a); /* the table keeps it alive, so its address stays its own */
            if (table_put(&seen, s, k, 2, a) < 0) {
                Py_DECREF(a);
                goto fail;
            }
            if (PySet_Add(j ? callers : all, a) < 0) goto fail;
        }
    }
    if (_PySet_Update(all, callers) < 0) goto fail;
    table_free(&seen);
    PyObject *fa = PyFrozenSet_New(all), *fc = PyFrozenSet_New(callers);
    Py_DECREF(all);
    Py_DECREF(callers);
    Py_DECREF(seq);
    if (fa == NULL || fc == NULL) {
        Py_XDECREF(fa);
        Py_XDECREF(fc);
        return NULL;
    }
    return Py_BuildValue("(NN)", fa, fc);
fail:
    table_free(&seen);
    Py_XDECREF(all);
    Py_XDECREF(callers);
    Py_DECREF(seq);
    return NULL;
}

/* ---- leaf_pairs: each stack's first two addresses, once ---- */

/* Distinct by the identity of the address objects (a parse shares equal ones; a repeat
   only costs its caller a second look). Stacks of one frame give 1-tuples, empty ones
   nothing. In the order of the samples. */
static PyObject *leaf_pairs_impl(PyObject *self, PyObject *samples) {
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(0);
    Table seen = {0};
    if (out == NULL || table_init(&seen, 4096) < 0) goto fail;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto fail;
        Py_ssize_t n = PyTuple_GET_SIZE(stack);
        if (n == 0) continue;
        uint64_t k[2] = {(uint64_t)(uintptr_t)PyTuple_GET_ITEM(stack, 0),
                         n > 1 ? (uint64_t)(uintptr_t)PyTuple_GET_ITEM(stack, 1) : 0};
        Slot *s = table_find(&seen, k, 2);
        if (s->v != NULL) continue;
        PyObject *pair = PyTuple_GetSlice(stack, 0, n > 1 ? 2 : 1);
        if (pair == NULL) goto fail;
        Py_INCREF(pair); /* one for the table (keeps the objects alive), one for the list */
        if (table_put(&seen, s, k, 2, pair) < 0 || PyList_Append(out, pair) < 0) {
            Py_DECREF(pair);
            goto fail;
        }
        Py_DECREF(pair);
    }
    table_free(&seen);
    Py_DECREF(seq);
    return out;
fail:
    table_free(&seen);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- with_values: each sample with its values mapped through fn (memoised) ---- */

static PyObject *with_values_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *fn, *cls;
    if (!PyArg_ParseTuple(args, "OOO", &samples, &fn, &cls)) return NULL;
    if (check_sample_type(cls) < 0) return NULL;
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(ns);
    /* Keyed by the identity of the values tuple: a parse shares equal ones. */
    Table memo = {0};
    if (out == NULL || table_init(&memo, 4096) < 0) goto fail;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto fail;
        if (!PyTuple_Check(threads) || PyTuple_GET_SIZE(threads) != 0) {
            Py_DECREF(out);
            Py_DECREF(seq);
            table_free(&memo);
            Py_RETURN_NONE; /* per-thread values: the Python pass maps those too */
        }
        uint64_t k = (uint64_t)(uintptr_t)values;
        Slot *s = table_find(&memo, &k, 1);
        if (s->v == NULL) {
            PyObject *mapped = PyObject_CallOneArg(fn, values);
            if (mapped == NULL) goto fail;
            if (!PyTuple_Check(mapped)) {
                Py_DECREF(mapped);
                PyErr_SetString(PyExc_TypeError, "fn must return a tuple");
                goto fail;
            }
            /* The memo holds the key tuple alive too, so its address is not reused. */
            PyObject *pair = PyTuple_Pack(2, values, mapped);
            Py_DECREF(mapped);
            if (pair == NULL || table_put(&memo, s, &k, 1, pair) < 0) goto fail;
            s = table_find(&memo, &k, 1);
        }
        PyObject *sample = new_sample((PyTypeObject *)cls, stack, PyTuple_GET_ITEM(s->v, 1),
                                      threads, via);
        if (sample == NULL) goto fail;
        PyList_SET_ITEM(out, i, sample);
    }
    table_free(&memo);
    Py_DECREF(seq);
    return out;
fail:
    table_free(&memo);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- cut_leading: prune's cut of the allocator's frames at the leaf end ---- */

/* codes: address -> 1 allocator frame (cut), 2 unnamed frame (look further), else stop;
   filled from fn(address) on a miss.
   The outermost frame is always kept. memo (a dict or None) maps raw stacks to cut ones,
   shared by the dumps of one process. Returns (samples, leaves). */
static PyObject *cut_leading_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *codes, *fn, *memo, *cls;
    if (!PyArg_ParseTuple(args, "OO!OOO", &samples, &PyDict_Type, &codes, &fn, &memo, &cls))
        return NULL;
    if (check_sample_type(cls) < 0) return NULL;
    if (memo != Py_None && !PyDict_Check(memo)) {
        PyErr_SetString(PyExc_TypeError, "memo must be a dict or None");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(ns), *leaves = PySet_New(NULL);
    Table known = {0}, leafs = {0};
    if (out == NULL || leaves == NULL || table_init(&known, 4096) < 0 ||
        table_init(&leafs, 4096) < 0)
        goto fail;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto fail;
        PyObject *pruned = NULL; /* new reference */
        if (memo != Py_None) {
            pruned = PyDict_GetItemWithError(memo, stack);
            if (pruned == NULL && PyErr_Occurred()) goto fail;
            Py_XINCREF(pruned);
        }
        if (pruned == NULL) {
            Py_ssize_t n = PyTuple_GET_SIZE(stack), cut = 0;
            for (Py_ssize_t j = 0; j + 1 < n; j++) {
                /* Only addresses at a stack's leaf end are ever looked at. */
                PyObject *code = cached_get(&known, codes, PyTuple_GET_ITEM(stack, j), fn, NULL);
                if (code == NULL) goto fail;
                long c = PyLong_AsLong(code);
                if (c == -1 && PyErr_Occurred()) goto fail;
                if (c == 1)
                    cut = j + 1;
                else if (c != 2)
                    break;
            }
            if (cut) {
                pruned = PyTuple_GetSlice(stack, cut, n);
                if (pruned == NULL) goto fail;
            } else {
                Py_INCREF(stack);
                pruned = stack;
            }
            if (memo != Py_None && PyDict_SetItem(memo, stack, pruned) < 0) {
                Py_DECREF(pruned);
                goto fail;
            }
        }
        PyObject *sample;
        if (pruned == stack) {
            Py_INCREF(items[i]);
            sample = items[i];
        } else {
            sample = new_sample((PyTypeObject *)cls, pruned, values, threads, via);
        }
        int first = PyTuple_GET_SIZE(pruned) ? first_sight(&leafs, PyTuple_GET_ITEM(pruned, 0))
                                             : 0;
        if (sample == NULL || first < 0 ||
            (first && PySet_Add(leaves, PyTuple_GET_ITEM(pruned, 0)) < 0)) {
            Py_XDECREF(sample);
            Py_DECREF(pruned);
            goto fail;
        }
        Py_DECREF(pruned);
        PyList_SET_ITEM(out, i, sample);
    }
    table_free(&known);
    table_free(&leafs);
    Py_DECREF(seq);
    return Py_BuildValue("(NN)", out, leaves);
fail:
    table_free(&known);
    table_free(&leafs);
    Py_XDECREF(out);
    Py_XDECREF(leaves);
    Py_DECREF(seq);
    return NULL;
}

/* ---- sites: fold's choice of each stack's site ---- */

/* cands: address -> (own, jni, dependency, plain) frame indexes (-1: none), filled from
   fn(address) on a miss. A stack's site
   is its first address with an own frame; else the first JNI entry, else the first
   dependency frame, else the first frame that is not a wrapper, else (0, 0). Returns a
   list of (address index << 16 | frame index) per sample, 0 for an empty stack. */
static PyObject *sites_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *cands, *fn;
    if (!PyArg_ParseTuple(args, "OO!O", &samples, &PyDict_Type, &cands, &fn)) return NULL;
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(ns);
    Table known = {0};
    if (out == NULL || table_init(&known, 4096) < 0) goto fail;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto fail;
        Py_ssize_t n = PyTuple_GET_SIZE(stack);
        long found = -1, jni = -1, dep = -1, plain = -1;
        for (Py_ssize_t j = 0; j < n && found < 0; j++) {
            /* Only the addresses a search reaches are classified: usually the leaf. */
            PyObject *c = cached_get(&known, cands, PyTuple_GET_ITEM(stack, j), fn, NULL);
            if (c == NULL) goto fail;
            if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 4) {
                PyErr_SetString(PyExc_TypeError, "candidates must be 4-tuples");
                goto fail;
            }
            long v[4];
            for (int m = 0; m < 4; m++) {
                v[m] = PyLong_AsLong(PyTuple_GET_ITEM(c, m));
                if (v[m] == -1 && PyErr_Occurred()) goto fail;
                if (v[m] > 0xffff) {
                    PyErr_SetString(PyExc_ValueError, "too many frames at one address");
                    goto fail;
                }
            }
            if (j > 0x7fff) {
                PyErr_SetString(PyExc_ValueError, "stack too deep");
                goto fail;
            }
            if (v[0] >= 0) found = (long)(j << 16) | v[0];
            if (jni < 0 && v[1] >= 0) jni = (long)(j << 16) | v[1];
            if (dep < 0 && v[2] >= 0) dep = (long)(j << 16) | v[2];
            if (plain < 0 && v[3] >= 0) plain = (long)(j << 16) | v[3];
        }
        long site = found >= 0 ? found : jni >= 0 ? jni : dep >= 0 ? dep : plain >= 0 ? plain : 0;
        PyObject *num = PyLong_FromLong(site);
        if (num == NULL) goto fail;
        PyList_SET_ITEM(out, i, num);
    }
    table_free(&known);
    Py_DECREF(seq);
    return out;
fail:
    table_free(&known);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- fold_cut: fold's cut of each stack at its site ---- */

/* A new tuple with the items of t (never t itself: a via chain must be a tuple of its own,
   reports count chains by identity). */
static PyObject *tuple_copy(PyObject *t) {
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t j = 0; j < n; j++) {
        PyObject *x = PyTuple_GET_ITEM(t, j);
        Py_INCREF(x);
        PyTuple_SET_ITEM(out, j, x);
    }
    return out;
}

/* The memo entry (cut stack, frame index, via) of a stack cut at code (address index << 16 |
   frame index, not 0): its via chain from vias by (addresses up to the site, frame index),
   else made: a copy of via_of[leaf] (filled by frames_via(leaf)) when the leaf alone is cut
   off, else via(stack, i, k); stored in vias. New reference, NULL on error. */
static PyObject *cut_entry(PyObject *stack, long code, PyObject *vias, PyObject *via_of,
                           PyObject *frames_via, PyObject *via_fn) {
    Py_ssize_t i = code >> 16, k = code & 0xffff, n = PyTuple_GET_SIZE(stack);
    if (i >= n) {
        PyErr_SetString(PyExc_ValueError, "a site past the end of its stack");
        return NULL;
    }
    PyObject *head = PyTuple_GetSlice(stack, 0, i + 1);
    if (head == NULL) return NULL;
    PyObject *key = Py_BuildValue("(Nn)", head, k), *via = NULL, *cut = NULL;
    if (key == NULL) return NULL;
    via = PyDict_GetItemWithError(vias, key);
    if (via != NULL) {
        Py_INCREF(via);
    } else {
        if (PyErr_Occurred()) goto fail;
        if (i == 1 && k == 0) {
            PyObject *leaf = PyTuple_GET_ITEM(stack, 0);
            PyObject *got = PyDict_GetItemWithError(via_of, leaf); /* borrowed */
            PyObject *made = NULL;
            if (got == NULL && PyErr_Occurred()) goto fail;
            if (got == NULL || !PyTuple_Check(got) || PyTuple_GET_SIZE(got) == 0) {
                made = PyObject_CallOneArg(frames_via, leaf);
                if (made == NULL) goto fail;
                got = made;
            }
            if (!PyTuple_Check(got)) {
                Py_DECREF(made);
                PyErr_SetString(PyExc_TypeError, "via frames must be a tuple");
                goto fail;
            }
            via = tuple_copy(got);
            Py_XDECREF(made);
        } else {
            via = PyObject_CallFunction(via_fn, "Onn", stack, i, k);
        }
        if (via == NULL || PyDict_SetItem(vias, key, via) < 0) goto fail;
    }
    cut = PyTuple_GetSlice(stack, i, n);
    if (cut == NULL) goto fail;
    Py_DECREF(key);
    return Py_BuildValue("(NnN)", cut, k, via);
fail:
    Py_XDECREF(via);
    Py_DECREF(key);
    return NULL;
}

/* Fold's cut (heapscope.analysis.fold, _Folder.fold): per sample whose code (from sites) is
   not 0, its memo entry (memo: raw stack -> (cut stack, frame index, via), shared by the
   dumps of one process; made by cut_entry on a miss), trims[cut leaf] = frame index when
   frames of the leaf are cut, and a new sample where the stack was cut or has a via chain.
   Returns the list of samples. */
static PyObject *fold_cut_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *codes, *memo, *vias, *via_of, *frames_via, *via_fn, *trims, *cls;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!OOO!O", &samples, &PyList_Type, &codes, &PyDict_Type,
                          &memo, &PyDict_Type, &vias, &PyDict_Type, &via_of, &frames_via,
                          &via_fn, &PyDict_Type, &trims, &cls))
        return NULL;
    if (check_sample_type(cls) < 0) return NULL;
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (PyList_GET_SIZE(codes) != ns) {
        PyErr_SetString(PyExc_ValueError, "one code per sample");
        Py_DECREF(seq);
        return NULL;
    }
    PyObject *out = PyList_New(ns);
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *s = items[i];
        long code = PyLong_AsLong(PyList_GET_ITEM(codes, i));
        if (code == -1 && PyErr_Occurred()) goto fail;
        if (code == 0) {
            Py_INCREF(s);
            PyList_SET_ITEM(out, i, s);
            continue;
        }
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(s, &stack, &values, &threads, &via) < 0) goto fail;
        PyObject *got = PyDict_GetItemWithError(memo, stack);
        if (got != NULL) {
            Py_INCREF(got);
        } else {
            if (PyErr_Occurred()) goto fail;
            got = cut_entry(stack, code, vias, via_of, frames_via, via_fn);
            if (got == NULL) goto fail;
            if (PyDict_SetItem(memo, stack, got) < 0) {
                Py_DECREF(got);
                goto fail;
            }
        }
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 3 ||
            !PyTuple_Check(PyTuple_GET_ITEM(got, 0))) {
            Py_DECREF(got);
            PyErr_SetString(PyExc_TypeError, "memo entries must be (stack, frame, via)");
            goto fail;
        }
        PyObject *cut = PyTuple_GET_ITEM(got, 0), *k = PyTuple_GET_ITEM(got, 1);
        PyObject *chain = PyTuple_GET_ITEM(got, 2);
        int trim = PyObject_IsTrue(k), has_via = PyObject_IsTrue(chain);
        if (trim < 0 || has_via < 0 || (trim && PyTuple_GET_SIZE(cut) == 0)) {
            if (trim > 0) PyErr_SetString(PyExc_ValueError, "an empty stack with frames cut");
            Py_DECREF(got);
            goto fail;
        }
        if (trim && PyDict_SetItem(trims, PyTuple_GET_ITEM(cut, 0), k) < 0) {
            Py_DECREF(got);
            goto fail;
        }
        PyObject *sample;
        if (has_via || cut != stack) {
            sample = new_sample((PyTypeObject *)cls, cut, values, threads, chain);
        } else {
            Py_INCREF(s);
            sample = s;
        }
        Py_DECREF(got);
        if (sample == NULL) goto fail;
        PyList_SET_ITEM(out, i, sample);
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- runs_above: the runs of addresses above given leaves ---- */

/* Each distinct stack[1:depth + 1] of the samples whose stack's leaf is in `leaves` (a set),
   in the order of their first stack, as dict.fromkeys would keep them. */
static PyObject *runs_above_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *leaves;
    Py_ssize_t depth;
    if (!PyArg_ParseTuple(args, "OO!n", &samples, &PySet_Type, &leaves, &depth)) return NULL;
    if (depth < 0) {
        PyErr_SetString(PyExc_ValueError, "depth must be >= 0");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *seen = PyDict_New(), *out = PyList_New(0);
    if (seen == NULL || out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto fail;
        Py_ssize_t n = PyTuple_GET_SIZE(stack);
        if (n == 0) continue;
        int in = PySet_Contains(leaves, PyTuple_GET_ITEM(stack, 0));
        if (in < 0) goto fail;
        if (!in) continue;
        PyObject *run = PyTuple_GetSlice(stack, 1, depth + 1 < n ? depth + 1 : n);
        if (run == NULL) goto fail;
        int known = PyDict_Contains(seen, run);
        if (known < 0 || (!known && (PyDict_SetItem(seen, run, Py_None) < 0 ||
                                     PyList_Append(out, run) < 0))) {
            Py_DECREF(run);
            goto fail;
        }
        Py_DECREF(run);
    }
    Py_DECREF(seen);
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(seen);
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* ---- frames_named: where given functions have frames ---- */

/* For each address of `addresses` (in its iteration order) that has a location, each frame
   k of it whose function is a key of `wanted`: wanted[function].append((address, k)).
   Locations are (address, mapping, module, offset, frames) tuples, frames (function, ...). */
static PyObject *frames_named_impl(PyObject *self, PyObject *args) {
    PyObject *addresses, *locations, *wanted;
    if (!PyArg_ParseTuple(args, "OO!O!", &addresses, &PyDict_Type, &locations, &PyDict_Type,
                          &wanted))
        return NULL;
    PyObject *it = PyObject_GetIter(addresses);
    if (it == NULL) return NULL;
    PyObject *a;
    while ((a = PyIter_Next(it)) != NULL) {
        PyObject *loc = PyDict_GetItemWithError(locations, a); /* borrowed */
        if (loc == NULL) {
            Py_DECREF(a);
            if (PyErr_Occurred()) goto fail;
            continue;
        }
        PyObject *frames = PyTuple_Check(loc) && PyTuple_GET_SIZE(loc) == 5
                               ? PyTuple_GET_ITEM(loc, 4) : NULL;
        if (frames == NULL || !PyTuple_Check(frames)) {
            Py_DECREF(a);
            PyErr_SetString(PyExc_TypeError, "locations must be 5-tuples with a frames tuple");
            goto fail;
        }
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(frames); k++) {
            PyObject *f = PyTuple_GET_ITEM(frames, k);
            if (!PyTuple_Check(f) || PyTuple_GET_SIZE(f) < 1) {
                Py_DECREF(a);
                PyErr_SetString(PyExc_TypeError, "frames must be tuples");
                goto fail;
            }
            PyObject *at = PyDict_GetItemWithError(wanted, PyTuple_GET_ITEM(f, 0));
            if (at == NULL) {
                if (PyErr_Occurred()) {
                    Py_DECREF(a);
                    goto fail;
                }
                continue;
            }
            PyObject *pair = Py_BuildValue("(On)", a, k);
            if (pair == NULL || PyList_Check(at) == 0 || PyList_Append(at, pair) < 0) {
                if (pair != NULL && !PyList_Check(at))
                    PyErr_SetString(PyExc_TypeError, "wanted must map names to lists");
                Py_XDECREF(pair);
                Py_DECREF(a);
                goto fail;
            }
            Py_DECREF(pair);
        }
        Py_DECREF(a);
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
fail:
    Py_DECREF(it);
    return NULL;
}

/* ---- accumulate: flat and cumulative sums per key, the top table's loop ---- */

/* Per-key sums that grow as new key ids appear. */
typedef struct {
    double *flat, *cum;
    Py_ssize_t *stamp;
    Py_ssize_t cap;
} Sums;

static int sums_fit(Sums *m, Py_ssize_t id) {
    if (id < m->cap) return 0;
    Py_ssize_t cap = m->cap ? m->cap : 1024;
    while (cap <= id) cap *= 2;
    double *f = PyMem_Realloc(m->flat, (size_t)cap * sizeof(double));
    if (f != NULL) m->flat = f;
    double *c = PyMem_Realloc(m->cum, (size_t)cap * sizeof(double));
    if (c != NULL) m->cum = c;
    Py_ssize_t *st = PyMem_Realloc(m->stamp, (size_t)cap * sizeof(Py_ssize_t));
    if (st != NULL) m->stamp = st;
    if (f == NULL || c == NULL || st == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t k = m->cap; k < cap; k++) {
        m->flat[k] = m->cum[k] = 0.0;
        m->stamp[k] = -1;
    }
    m->cap = cap;
    return 0;
}

/* key_ids: address -> tuple of key ids (innermost first), filled from fn(address) on a miss,
   so only addresses of stacks with a value are ever keyed. Returns (flat, cum, total, leaf)
   where flat and cum cover ids 0 .. the largest seen, and leaf[i] is the key id sample i's
   flat value went to (-1: value 0). */
static PyObject *accumulate_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *per_addr, *fn;
    Py_ssize_t index, no_stack;
    if (!PyArg_ParseTuple(args, "OnO!On", &samples, &index, &PyDict_Type, &per_addr, &fn,
                          &no_stack))
        return NULL;
    if (no_stack < 0) {
        PyErr_SetString(PyExc_ValueError, "bad key id");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Sums m = {NULL, NULL, NULL, 0};
    Table known = {0}; /* address object -> its ids, by identity: no hashing of ints */
    PyObject *leaf = PyList_New(ns), *result = NULL;
    PyObject *none_leaf = PyLong_FromLong(-1);
    double total = 0.0;
    Py_ssize_t top = no_stack; /* largest key id seen */
    if (leaf == NULL || none_leaf == NULL || sums_fit(&m, no_stack) < 0 ||
        table_init(&known, 16384) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto done;
        if (index < 0 || index >= PyTuple_GET_SIZE(values)) {
            PyErr_SetString(PyExc_IndexError, "value index out of range");
            goto done;
        }
        double v = PyFloat_AsDouble(PyTuple_GET_ITEM(values, index));
        if (v == -1.0 && PyErr_Occurred()) goto done;
        if (v == 0) {
            Py_INCREF(none_leaf);
            PyList_SET_ITEM(leaf, i, none_leaf);
            continue;
        }
        total += v;
        Py_ssize_t n = PyTuple_GET_SIZE(stack), first = -1;
        for (Py_ssize_t j = 0; j < n; j++) {
            int fresh;
            PyObject *ids = cached_get(&known, per_addr, PyTuple_GET_ITEM(stack, j), fn, &fresh);
            if (ids == NULL) goto done;
            if (fresh) { /* a new address: check its ids and make room for them */
                if (!PyTuple_Check(ids)) {
                    PyErr_SetString(PyExc_TypeError, "key ids must be tuples");
                    goto done;
                }
                for (Py_ssize_t x = 0; x < PyTuple_GET_SIZE(ids); x++) {
                    Py_ssize_t id = PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, x));
                    if (id == -1 && PyErr_Occurred()) goto done;
                    if (id < 0) {
                        PyErr_SetString(PyExc_ValueError, "negative key id");
                        goto done;
                    }
                    if (sums_fit(&m, id) < 0) goto done;
                    if (id > top) top = id;
                }
            }
            Py_ssize_t count = PyTuple_GET_SIZE(ids);
            for (Py_ssize_t x = 0; x < count; x++) {
                Py_ssize_t id = PyLong_AsSsize_t(PyTuple_GET_ITEM(ids, x));
                if (first < 0) first = id;
                if (m.stamp[id] != i) { /* once per stack, even under recursion */
                    m.stamp[id] = i;
                    m.cum[id] += v;
                }
            }
        }
        if (first < 0) {
            first = no_stack;
            if (m.stamp[first] != i) {
                m.stamp[first] = i;
                m.cum[first] += v;
            }
        }
        m.flat[first] += v;
        PyObject *num = PyLong_FromSsize_t(first);
        if (num == NULL) goto done;
        PyList_SET_ITEM(leaf, i, num);
    }
    {
        Py_ssize_t nkeys = top + 1;
        PyObject *f = PyList_New(nkeys), *c = PyList_New(nkeys);
        if (f == NULL || c == NULL) {
            Py_XDECREF(f);
            Py_XDECREF(c);
            goto done;
        }
        for (Py_ssize_t k = 0; k < nkeys; k++) {
            PyObject *a = PyFloat_FromDouble(m.flat[k]), *b = PyFloat_FromDouble(m.cum[k]);
            if (a == NULL || b == NULL) {
                Py_XDECREF(a);
                Py_XDECREF(b);
                Py_DECREF(f);
                Py_DECREF(c);
                goto done;
            }
            PyList_SET_ITEM(f, k, a);
            PyList_SET_ITEM(c, k, b);
        }
        Py_INCREF(leaf);
        result = Py_BuildValue("(NNdN)", f, c, total, leaf);
    }
done:
    PyMem_Free(m.flat);
    PyMem_Free(m.cum);
    PyMem_Free(m.stamp);
    table_free(&known);
    Py_XDECREF(leaf);
    Py_XDECREF(none_leaf);
    Py_DECREF(seq);
    return result;
}

/* ---- via_sums: the top table's flat value per key and via chain ---- */

/* Per sample with leaf[n] >= 0 (the key id of its flat row): per_key[leaf[n]][id(via)] +=
   values[index], chains[id(via)] = via on its first sight; dicts made and filled in the
   samples' order, as heapscope.analysis.aggregate.KeyTable.add_via does. */
static PyObject *via_sums_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *leaf, *per_key, *chains;
    Py_ssize_t index;
    if (!PyArg_ParseTuple(args, "OO!nO!O!", &samples, &PyList_Type, &leaf, &index,
                          &PyDict_Type, &per_key, &PyDict_Type, &chains))
        return NULL;
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *zero = PyFloat_FromDouble(0.0);
    if (zero == NULL) goto fail;
    if (PyList_GET_SIZE(leaf) != ns || index < 0) {
        PyErr_SetString(PyExc_ValueError, "one leaf per sample, a value index >= 0");
        goto fail;
    }
    for (Py_ssize_t n = 0; n < ns; n++) {
        PyObject *i = PyList_GET_ITEM(leaf, n);
        long li = PyLong_AsLong(i);
        if (li == -1 && PyErr_Occurred()) goto fail;
        if (li < 0) continue;
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[n], &stack, &values, &threads, &via) < 0) goto fail;
        if (index >= PyTuple_GET_SIZE(values)) {
            PyErr_SetString(PyExc_IndexError, "value index out of range");
            goto fail;
        }
        PyObject *v = PyTuple_GET_ITEM(values, index);
        PyObject *per = PyDict_GetItemWithError(per_key, i); /* borrowed */
        if (per == NULL) {
            if (PyErr_Occurred()) goto fail;
            per = PyDict_New();
            if (per == NULL) goto fail;
            int bad = PyDict_SetItem(per_key, i, per);
            Py_DECREF(per); /* the dict holds it */
            if (bad < 0) goto fail;
        }
        PyObject *c = PyLong_FromVoidPtr(via);
        if (c == NULL) goto fail;
        int known = PyDict_Contains(chains, c);
        if (known < 0 || (!known && PyDict_SetItem(chains, c, via) < 0)) {
            Py_DECREF(c);
            goto fail;
        }
        PyObject *old = PyDict_GetItemWithError(per, c); /* borrowed */
        if (old == NULL && PyErr_Occurred()) {
            Py_DECREF(c);
            goto fail;
        }
        PyObject *sum = PyNumber_Add(old != NULL ? old : zero, v);
        if (sum == NULL || PyDict_SetItem(per, c, sum) < 0) {
            Py_XDECREF(sum);
            Py_DECREF(c);
            goto fail;
        }
        Py_DECREF(sum);
        Py_DECREF(c);
    }
    Py_DECREF(zero);
    Py_DECREF(seq);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(zero);
    Py_DECREF(seq);
    return NULL;
}

/* ---- tree_add: samples merged into a call tree by the path of frame names ---- */

/* frames_of: address -> list of (name id, line, frame, kind) innermost first, filled from
   frames(address) on a miss. children: (parent, name id) -> node, as a dict the Python tree
   also uses; a new node is made by child(parent, frame, kind), which registers it there.
   line: the nodes' lines (set to 0 where merged frames disagree). Adds each sample's first
   `ncols` values to every node on its path into `columns` (lists of floats, one per value,
   as long as the tree once the call returns). Samples whose values are all 0 are skipped. */
static PyObject *tree_add_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *frames_of, *frames, *children, *child, *line, *columns;
    int inverted;
    if (!PyArg_ParseTuple(args, "OO!OO!OO!O!p", &samples, &PyDict_Type, &frames_of, &frames,
                          &PyDict_Type, &children, &child, &PyList_Type, &line, &PyList_Type,
                          &columns, &inverted))
        return NULL;
    Py_ssize_t ncols = PyList_GET_SIZE(columns);
    if (ncols < 1 || ncols > 8) {
        PyErr_SetString(PyExc_ValueError, "1 to 8 value columns");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *result = NULL;
    double *acc = NULL; /* node-major: acc[node * ncols + col] */
    Py_ssize_t acc_cap = 0;
    PyObject **path = NULL; /* the frame entries of one stack, leaf first */
    Py_ssize_t path_cap = 0;
    Py_ssize_t *nodes = NULL;
    Table kids = {0}; /* (parent, name id) -> node, mirrors `children` */
    path_cap = 256;
    path = PyMem_Malloc((size_t)path_cap * sizeof(PyObject *));
    nodes = PyMem_Malloc((size_t)(path_cap + 1) * sizeof(Py_ssize_t));
    if (path == NULL || nodes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (table_init(&kids, 65536) < 0) goto done;
    {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(children, &pos, &key, &value)) {
            if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2) {
                PyErr_SetString(PyExc_TypeError, "children keys must be pairs");
                goto done;
            }
            uint64_t k[2] = {PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(key, 0)),
                             PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(key, 1))};
            if (PyErr_Occurred()) goto done;
            Slot *s = table_find(&kids, k, 2);
            Py_INCREF(value);
            if (table_put(&kids, s, k, 2, value) < 0) goto done;
        }
    }
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto done;
        if (PyTuple_GET_SIZE(values) < ncols) {
            PyErr_SetString(PyExc_IndexError, "too few values");
            goto done;
        }
        double v[8];
        int any = 0;
        for (Py_ssize_t c = 0; c < ncols; c++) {
            v[c] = PyFloat_AsDouble(PyTuple_GET_ITEM(values, c));
            if (v[c] == -1.0 && PyErr_Occurred()) goto done;
            any |= v[c] != 0;
        }
        if (!any) continue;
        /* The stack's frames, leaf first. */
        Py_ssize_t depth = 0;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(stack); j++) {
            PyObject *a = PyTuple_GET_ITEM(stack, j);
            PyObject *fr = PyDict_GetItemWithError(frames_of, a);
            if (fr == NULL) {
                if (PyErr_Occurred()) goto done;
                fr = PyObject_CallOneArg(frames, a);
                if (fr == NULL) goto done;
                int bad = PyDict_SetItem(frames_of, a, fr);
                Py_DECREF(fr);
                if (bad < 0) goto done;
            }
            if (!PyList_Check(fr)) {
                PyErr_SetString(PyExc_TypeError, "frames must be lists");
                goto done;
            }
            for (Py_ssize_t x = 0; x < PyList_GET_SIZE(fr); x++) {
                if (depth == path_cap) {
                    path_cap *= 2;
                    PyObject **p2 = PyMem_Realloc(path, (size_t)path_cap * sizeof(PyObject *));
                    Py_ssize_t *n2 = PyMem_Realloc(nodes,
                                                   (size_t)(path_cap + 1) * sizeof(Py_ssize_t));
                    if (p2 != NULL) path = p2;
                    if (n2 != NULL) nodes = n2;
                    if (p2 == NULL || n2 == NULL) {
                        PyErr_NoMemory();
                        goto done;
                    }
                }
                path[depth++] = PyList_GET_ITEM(fr, x);
            }
        }
        /* Walk from the root: outermost caller first, or the leaf first when inverted. */
        Py_ssize_t k = 0, count = 0;
        nodes[count++] = 0;
        for (Py_ssize_t d = 0; d < depth; d++) {
            PyObject *entry = path[inverted ? d : depth - 1 - d];
            if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4) {
                PyErr_SetString(PyExc_TypeError, "frame entries must be 4-tuples");
                goto done;
            }
            uint64_t key[2] = {(uint64_t)k, PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(entry, 0))};
            if (PyErr_Occurred()) goto done;
            Slot *s = table_find(&kids, key, 2);
            Py_ssize_t next;
            if (s->v == NULL) {
                PyObject *node = PyObject_CallFunction(child, "nOO", k,
                                                       PyTuple_GET_ITEM(entry, 2),
                                                       PyTuple_GET_ITEM(entry, 3));
                if (node == NULL) goto done;
                if (table_put(&kids, s, key, 2, node) < 0) goto done;
                s = table_find(&kids, key, 2);
                next = PyLong_AsSsize_t(s->v);
                if (next == -1 && PyErr_Occurred()) goto done;
            } else {
                next = PyLong_AsSsize_t(s->v);
                if (next < 0 || next >= PyList_GET_SIZE(line)) {
                    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad node");
                    goto done;
                }
                PyObject *have = PyList_GET_ITEM(line, next);
                PyObject *want = PyTuple_GET_ITEM(entry, 1);
                if (have != want) {
                    int eq = PyObject_RichCompareBool(have, want, Py_EQ);
                    if (eq < 0) goto done;
                    if (!eq) {
                        PyObject *zero = PyLong_FromLong(0);
                        if (zero == NULL) goto done;
                        PyList_SetItem(line, next, zero); /* steals */
                    }
                }
            }
            k = next;
            nodes[count++] = k;
        }
        /* Each node lies on the path once, so recursion is not counted twice. */
        for (Py_ssize_t x = 0; x < count; x++) {
            Py_ssize_t node = nodes[x];
            if (node < 0) {
                PyErr_SetString(PyExc_ValueError, "bad node");
                goto done;
            }
            if (node >= acc_cap) {
                Py_ssize_t cap = acc_cap ? acc_cap : 4096;
                while (cap <= node) cap *= 2;
                double *a2 = PyMem_Realloc(acc, (size_t)(cap * ncols) * sizeof(double));
                if (a2 == NULL) {
                    PyErr_NoMemory();
                    goto done;
                }
                memset(a2 + acc_cap * ncols, 0, (size_t)((cap - acc_cap) * ncols) * sizeof(double));
                acc = a2;
                acc_cap = cap;
            }
            for (Py_ssize_t c = 0; c < ncols; c++) acc[node * ncols + c] += v[c];
        }
    }
    /* Add the sums into the tree's columns. */
    for (Py_ssize_t c = 0; c < ncols; c++) {
        PyObject *col = PyList_GET_ITEM(columns, c);
        if (!PyList_Check(col)) {
            PyErr_SetString(PyExc_TypeError, "columns must be lists");
            goto done;
        }
        Py_ssize_t n = PyList_GET_SIZE(col) < acc_cap ? PyList_GET_SIZE(col) : acc_cap;
        for (Py_ssize_t node = 0; node < n; node++) {
            double add = acc[node * ncols + c];
            if (add == 0) continue;
            double was = PyFloat_AsDouble(PyList_GET_ITEM(col, node));
            if (was == -1.0 && PyErr_Occurred()) goto done;
            PyObject *sum = PyFloat_FromDouble(was + add);
            if (sum == NULL) goto done;
            PyList_SetItem(col, node, sum); /* steals */
        }
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_Free(acc);
    PyMem_Free(path);
    PyMem_Free(nodes);
    table_free(&kids);
    Py_DECREF(seq);
    return result;
}

/* ---- ELF symbol tables: the rows of symtab._function_rows ---- */

static uint64_t read_uint(const unsigned char *p, int n, int little) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) {
        int k = little ? n - 1 - i : i;
        v = (v << 8) | p[k];
    }
    return v;
}

typedef struct {
    uint64_t start, end, bind, name;
} SymRow;

static int symrow_cmp(const void *a, const void *b) {
    const SymRow *x = a, *y = b;
    if (x->start != y->start) return x->start < y->start ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    if (x->bind != y->bind) return x->bind < y->bind ? -1 : 1;
    if (x->name != y->name) return x->name < y->name ? -1 : 1;
    return 0;
}

/* The rows symtab._function_rows keeps with named=True, in a C array (*count of them):
   each defined, sized function symbol (STT_FUNC or STT_GNU_IFUNC) of a symbol table's raw
   entries whose name offset points at a non-empty name. 1: an end does not fit in 64 bits
   (the caller returns None and Python does it); -1: out of memory. */
static int symbol_rows(Py_buffer *data, Py_buffer *strings, int elf64, int little,
                       SymRow **rows, Py_ssize_t *count) {
    const unsigned char *d = data->buf, *str = strings->buf;
    Py_ssize_t entsize = elf64 ? 24 : 16, n = data->len / entsize, k = 0;
    SymRow *out = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(SymRow));
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *e = d + i * entsize;
        uint64_t name_off = read_uint(e, 4, little), value, size;
        unsigned info, shndx;
        if (elf64) {
            info = e[4];
            shndx = (unsigned)read_uint(e + 6, 2, little);
            value = read_uint(e + 8, 8, little);
            size = read_uint(e + 16, 8, little);
        } else {
            value = read_uint(e + 4, 4, little);
            size = read_uint(e + 8, 4, little);
            info = e[12];
            shndx = (unsigned)read_uint(e + 14, 2, little);
        }
        unsigned kind = info & 0xf;
        if (size == 0 || shndx == 0 || (kind != 2 && kind != 10)) continue;
        if (name_off >= (uint64_t)strings->len || str[name_off] == 0) continue;
        if (value + size < value) {
            PyMem_Free(out);
            return 1;
        }
        out[k].start = value;
        out[k].end = value + size;
        out[k].bind = info >> 4;
        out[k].name = name_off;
        k++;
    }
    *rows = out;
    *count = k;
    return 0;
}

/* function_columns(data, strings, elf64, little): the named rows sorted (by start, end,
   binding, name offset, as Python sorts the tuples) as five lists: starts, ends, bindings,
   name offsets and reach (the furthest end so far); None as said above. */
static PyObject *function_columns_impl(PyObject *self, PyObject *args) {
    Py_buffer data, strings;
    int elf64, little;
    if (!PyArg_ParseTuple(args, "y*y*pp", &data, &strings, &elf64, &little)) return NULL;
    SymRow *rows = NULL;
    Py_ssize_t n = 0;
    int rc = symbol_rows(&data, &strings, elf64, little, &rows, &n);
    PyBuffer_Release(&data);
    PyBuffer_Release(&strings);
    if (rc != 0) return rc > 0 ? Py_NewRef(Py_None) : NULL;
    qsort(rows, (size_t)n, sizeof(SymRow), symrow_cmp);
    PyObject *cols[5] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *out = NULL;
    for (int c = 0; c < 5; c++)
        if ((cols[c] = PyList_New(n)) == NULL) goto done;
    uint64_t reach = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i == 0 || rows[i].end > reach) reach = rows[i].end;
        uint64_t v[5] = {rows[i].start, rows[i].end, rows[i].bind, rows[i].name, reach};
        for (int c = 0; c < 5; c++) {
            PyObject *o = PyLong_FromUnsignedLongLong(v[c]);
            if (o == NULL) goto done;
            PyList_SET_ITEM(cols[c], i, o);
        }
    }
    out = PyTuple_Pack(5, cols[0], cols[1], cols[2], cols[3], cols[4]);
done:
    for (int c = 0; c < 5; c++) Py_XDECREF(cols[c]);
    PyMem_Free(rows);
    return out;
}

/* ---- direct callers in x86-64 code (heapscope.symbols.callsites) ---- */

/* Index of the last start <= a in starts[0..n), or -1. */
static Py_ssize_t last_start(const int64_t *starts, Py_ssize_t n, int64_t a) {
    Py_ssize_t lo = 0, hi = n;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (starts[mid] <= a) lo = mid + 1;
        else hi = mid;
    }
    return lo - 1;
}

/* direct_callers(segments, starts, ends): per function (starts/ends: sorted int64 arrays
   of the function symbols), the number of distinct other functions whose bytes hold an
   E8 (call) or E9 (jmp) rel32 landing on its first byte; int32 array as bytes. segments:
   (vaddr, code bytes) of the executable segments. Within a segment the callers come in
   address order, so one "last caller counted" per callee removes repeats. */
static PyObject *direct_callers_impl(PyObject *self, PyObject *args) {
    PyObject *segments;
    Py_buffer sb, eb;
    if (!PyArg_ParseTuple(args, "Oy*y*", &segments, &sb, &eb)) return NULL;
    PyObject *out = NULL, *seq = NULL;
    int64_t *last = NULL;
    Py_ssize_t n = sb.len / (Py_ssize_t)sizeof(int64_t);
    if (eb.len != sb.len) {
        PyErr_SetString(PyExc_ValueError, "starts and ends differ in length");
        goto done;
    }
    const int64_t *starts = (const int64_t *)sb.buf, *ends = (const int64_t *)eb.buf;
    seq = PySequence_Fast(segments, "segments must be a sequence");
    if (seq == NULL) goto done;
    out = PyBytes_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    last = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (out == NULL || last == NULL) {
        Py_CLEAR(out);
        if (last == NULL) PyErr_NoMemory();
        goto done;
    }
    int32_t *counts = (int32_t *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        counts[i] = 0;
        last[i] = -1;
    }
    for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(seq); k++) {
        long long vaddr;
        Py_buffer code;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, k), "Ly*", &vaddr, &code)) {
            Py_CLEAR(out);
            goto done;
        }
        const unsigned char *b = code.buf;
        Py_ssize_t caller = -1;
        int64_t caller_end = INT64_MIN;
        for (Py_ssize_t i = 0; i + 5 <= code.len; i++) {
            if (b[i] != 0xE8 && b[i] != 0xE9) continue;
            int32_t rel = (int32_t)((uint32_t)b[i + 1] | (uint32_t)b[i + 2] << 8 |
                                    (uint32_t)b[i + 3] << 16 | (uint32_t)b[i + 4] << 24);
            int64_t at = (int64_t)vaddr + i, target = at + 5 + rel;
            Py_ssize_t callee = last_start(starts, n, target);
            if (callee < 0 || starts[callee] != target) continue;
            while (callee > 0 && starts[callee - 1] == target) callee--; /* aliases: the first */
            if (caller < 0 || at >= caller_end || at < starts[caller]) {
                caller = last_start(starts, n, at);
                if (caller < 0 || at >= ends[caller]) {
                    caller = -1;
                    continue;
                }
                caller_end = ends[caller];
            }
            if (caller != callee && last[callee] != caller) {
                last[callee] = caller;
                counts[callee]++;
            }
        }
        PyBuffer_Release(&code);
    }
done:
    PyMem_Free(last);
    Py_XDECREF(seq);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&eb);
    return out;
}

/* Each entry point with the collector paused (see PAUSE_GC). */
#define WITHOUT_GC(name)                                        \
    static PyObject *name(PyObject *self, PyObject *args) {    \
        PAUSE_GC;                                               \
        PyObject *result = name##_impl(self, args);             \
        RESUME_GC;                                              \
        return result;                                          \
    }
WITHOUT_GC(parse_records)

/* ---- stacks as indices into an address table (heapscope.reuse) ---- */

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* (Every sample's stack as its length then each address's index in `index`, all
   little-endian u32; the positions of the samples with per-thread values or via frames). */
static PyObject *pack_stacks_impl(PyObject *self, PyObject *args) {
    PyObject *samples, *index, *out = NULL, *extra = NULL;
    if (!PyArg_ParseTuple(args, "OO!", &samples, &PyDict_Type, &index)) return NULL;
    PyObject *seq = PySequence_Fast(samples, "samples must be a sequence");
    if (seq == NULL) return NULL;
    /* Indices by the address object's identity: a parse shares equal addresses, so a
       million frames need a few thousand dict lookups. */
    Table seen = {0};
    extra = PyList_New(0);
    if (extra == NULL || table_init(&seen, 16384) < 0) goto fail;
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t words = ns;
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack, *values, *threads, *via;
        if (sample_fields(items[i], &stack, &values, &threads, &via) < 0) goto fail;
        if (PyTuple_GET_SIZE(stack) > (Py_ssize_t)UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "stack too deep");
            goto fail;
        }
        words += PyTuple_GET_SIZE(stack);
        int t = PyObject_IsTrue(threads), v = t ? t : PyObject_IsTrue(via);
        if (t < 0 || v < 0) goto fail;
        if (v) {
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(extra, at) < 0) {
                Py_XDECREF(at);
                goto fail;
            }
            Py_DECREF(at);
        }
    }
    out = PyBytes_FromStringAndSize(NULL, words * 4);
    if (out == NULL) goto fail;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < ns; i++) {
        PyObject *stack = PyTuple_GET_ITEM(items[i], 0);
        Py_ssize_t n = PyTuple_GET_SIZE(stack);
        put_u32(p, (uint32_t)n);
        p += 4;
        for (Py_ssize_t j = 0; j < n; j++) {
            PyObject *a = PyTuple_GET_ITEM(stack, j);
            uint64_t key = (uint64_t)(uintptr_t)a;
            Slot *slot = table_find(&seen, &key, 1);
            if (slot->v == NULL) {
                PyObject *k = PyDict_GetItemWithError(index, a);
                long v = k == NULL ? -1 : PyLong_AsLong(k);
                if (v < 0 || v > (long)UINT32_MAX) {
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_KeyError, "an address has no index");
                    goto fail;
                }
                /* The table keeps the address alive (its identity stays its own) and
                   its index. */
                PyObject *pair = Py_BuildValue("(Ol)", a, v);
                if (pair == NULL) goto fail;
                if (table_put(&seen, slot, &key, 1, pair) < 0) {
                    Py_DECREF(pair);
                    goto fail;
                }
                slot = table_find(&seen, &key, 1);
            }
            put_u32(p, (uint32_t)PyLong_AsLong(PyTuple_GET_ITEM(slot->v, 1)));
            p += 4;
        }
    }
    table_free(&seen);
    Py_DECREF(seq);
    return Py_BuildValue("(NN)", out, extra);
fail:
    table_free(&seen);
    Py_XDECREF(out);
    Py_XDECREF(extra);
    Py_DECREF(seq);
    return NULL;
}

/* Samples (stack, values[i], (), ()) of `sample_type`, the stacks as pack_stacks wrote
   them with table[index] for each index; ValueError when `data` is not exactly one stack
   of valid indices per value. */
static PyObject *unpack_samples_impl(PyObject *self, PyObject *args) {
    Py_buffer buf;
    PyObject *table, *values, *cls;
    if (!PyArg_ParseTuple(args, "y*O!O!O", &buf, &PyTuple_Type, &table, &PyList_Type,
                          &values, &cls))
        return NULL;
    if (check_sample_type(cls) < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    const unsigned char *p = buf.buf, *end = p + buf.len;
    Py_ssize_t nt = PyTuple_GET_SIZE(table), count = PyList_GET_SIZE(values);
    PyObject *empty = PyTuple_New(0);
    PyObject *out = empty == NULL ? NULL : PyList_New(count);
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (end - p < 4) goto bad;
        uint32_t n = get_u32(p);
        p += 4;
        if ((size_t)(end - p) / 4 < n) goto bad;
        PyObject *v = PyList_GET_ITEM(values, i);
        if (!PyTuple_Check(v)) goto bad;
        PyObject *stack = PyTuple_New(n);
        if (stack == NULL) goto fail;
        for (uint32_t j = 0; j < n; j++, p += 4) {
            uint32_t k = get_u32(p);
            if ((Py_ssize_t)k >= nt) {
                Py_DECREF(stack);
                goto bad;
            }
            PyObject *a = PyTuple_GET_ITEM(table, k);
            Py_INCREF(a);
            PyTuple_SET_ITEM(stack, j, a);
        }
        PyObject *sample = new_sample((PyTypeObject *)cls, stack, v, empty, empty);
        Py_DECREF(stack);
        if (sample == NULL) goto fail;
        PyList_SET_ITEM(out, i, sample);
    }
    if (p != end) goto bad;
    Py_DECREF(empty);
    PyBuffer_Release(&buf);
    return out;
bad:
    PyErr_SetString(PyExc_ValueError, "malformed stack data");
fail:
    PyBuffer_Release(&buf);
    Py_XDECREF(empty);
    Py_XDECREF(out);
    return NULL;
}

/* ---- scan_counts: a dump's records as (stack id, count, bytes), for a series ---- */

/* A "t*" line's number as the Python expression takes it: 1 to 19 digits (more is
   damage, which the expression does not match either); -1 when it is not there. */
static int count_digits(const unsigned char **pp, const unsigned char *end, uint64_t *out) {
    const unsigned char *p = *pp;
    uint64_t v = 0;
    int n = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (++n > 19) return -1;
        v = v * 10 + (uint64_t)(*p - '0');
        p++;
    }
    if (n == 0) return -1;
    *pp = p;
    *out = v;
    return 0;
}

static inline const unsigned char *blanks(const unsigned char *p, const unsigned char *end) {
    while (p < end && is_blank(*p)) p++;
    return p;
}

/* A 64-bit hash of a stack's text, a word at a time: the table of known stacks is keyed
   by it (each hit then compared byte for byte), so a record costs no Python object of its
   text unless the stack is new. */
static uint64_t text_hash(const unsigned char *p, size_t n) {
    uint64_t h = 0x243F6A8885A308D3ULL ^ (uint64_t)n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    uint64_t w = 0;
    memcpy(&w, p + i, n - i);
    h = (h ^ w) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ULL;
    h ^= h >> 32;
    return h;
}

static int all_ascii(const unsigned char *p, size_t n) {
    uint64_t acc = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        acc |= w;
    }
    for (; i < n; i++) acc |= p[i];
    return (acc & 0x8080808080808080ULL) == 0;
}

typedef struct {
    const unsigned char *text;
    Py_ssize_t len;
    uint64_t hash;
    double count, nbytes;
} Record;

/* The records of data[start:len] up to the memory map, into *recs (PyMem_Raw: called
   without the GIL, so two threads scan two dumps at once). 0: read, *at is the line
   break before "MAPPED_LIBRARIES:"; 1: unusual; -1: out of memory. */
static int read_records(const unsigned char *base, Py_ssize_t start, Py_ssize_t len,
                        Record **recs, size_t *nrec, const unsigned char **at) {
    const unsigned char *p = base + start;
    size_t cap = 0;
    /* The records end at the first line that starts the memory map (start is the first
       record, after a line break). Only plain ASCII without carriage returns or jemalloc's
       messages is read here: anything else goes the Python way, which decodes the text. */
    static const char maps[] = "\nMAPPED_LIBRARIES:";
    *at = memmem(p - 1, (size_t)(len - start + 1), maps, sizeof maps - 1);
    if (*at == NULL) return 1;
    const unsigned char *end = *at + 1;
    size_t body = (size_t)(end - p);
    if (!all_ascii(p, body) || memchr(p, '\r', body) != NULL ||
        memmem(p, body, "<jemalloc>", 10) != NULL)
        return 1;
    while (p < end) {
        const unsigned char *eol = memchr(p, '\n', (size_t)(end - p));
        if (eol == NULL) break;
        if (*p != '@') {
            p = eol + 1;
            continue;
        }
        const unsigned char *key = blanks(p + 1, eol);
        /* The next line must be the stack's "t*: count: bytes [" line. */
        const unsigned char *q = blanks(eol + 1, end);
        uint64_t count, nbytes;
        if (end - q < 3 || q[0] != 't' || q[1] != '*' || q[2] != ':') return 1;
        q = blanks(q + 3, end);
        if (count_digits(&q, end, &count) < 0 || q >= end || *q != ':') return 1;
        q = blanks(q + 1, end);
        if (count_digits(&q, end, &nbytes) < 0) return 1;
        q = blanks(q, end);
        if (q >= end || *q != '[') return 1;
        if (*nrec == cap) {
            cap = cap ? cap * 2 : 4096;
            Record *bigger = PyMem_RawRealloc(*recs, cap * sizeof(Record));
            if (bigger == NULL) return -1;
            *recs = bigger;
        }
        Py_ssize_t n = eol - key;
        (*recs)[(*nrec)++] = (Record){key, n, text_hash(key, (size_t)n), (double)count,
                                      (double)nbytes};
        const unsigned char *next = memchr(q, '\n', (size_t)(end - q));
        p = next == NULL ? end : next + 1;
    }
    return 0;
}

static PyObject *scan_counts_impl(PyObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start;
    PyObject *ids, *texts;
    if (!PyArg_ParseTuple(args, "y*nO!O!", &buf, &start, &PyDict_Type, &ids, &PyList_Type,
                          &texts))
        return NULL;
    PyObject *out = NULL, *id_bytes = NULL, *count_bytes = NULL, *nbytes_bytes = NULL;
    Record *recs = NULL;
    size_t nrec = 0;
    if (start < 1 || start > buf.len) {
        PyErr_SetString(PyExc_ValueError, "bad start");
        goto done;
    }
    const unsigned char *base = (const unsigned char *)buf.buf, *at = NULL;
    /* First every record is read, without the GIL (nothing is changed if one is
       unusual) ... */
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = read_records(base, start, buf.len, &recs, &nrec, &at);
    Py_END_ALLOW_THREADS
    if (status < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (status > 0) goto unusual;

    /* ... then each is numbered: a known text by its hash (checked byte for byte), a new
       one added to ids and texts. */
    id_bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(nrec * sizeof(int64_t)));
    count_bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(nrec * sizeof(double)));
    nbytes_bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(nrec * sizeof(double)));
    if (id_bytes == NULL || count_bytes == NULL || nbytes_bytes == NULL) goto done;
    int64_t *id_out = (int64_t *)PyBytes_AS_STRING(id_bytes);
    double *count_out = (double *)PyBytes_AS_STRING(count_bytes);
    double *nbytes_out = (double *)PyBytes_AS_STRING(nbytes_bytes);
    for (size_t i = 0; i < nrec; i++) {
        Record *r = &recs[i];
        PyObject *h = PyLong_FromUnsignedLongLong(r->hash);
        if (h == NULL) goto done;
        PyObject *known = PyDict_GetItemWithError(ids, h); /* borrowed */
        int64_t id;
        if (known != NULL) {
            id = PyLong_AsLongLong(known);
            PyObject *text = id >= 0 && id < PyList_GET_SIZE(texts)
                                 ? PyList_GET_ITEM(texts, id) : NULL;
            if (text == NULL || !PyBytes_Check(text) || PyBytes_GET_SIZE(text) != r->len ||
                memcmp(PyBytes_AS_STRING(text), r->text, (size_t)r->len) != 0) {
                Py_DECREF(h); /* two texts with one hash: Python reads this dump */
                if (PyErr_Occurred()) goto done;
                goto unusual;
            }
        } else if (PyErr_Occurred()) {
            Py_DECREF(h);
            goto done;
        } else {
            id = (int64_t)PyList_GET_SIZE(texts);
            PyObject *num = PyLong_FromLongLong(id);
            PyObject *text = PyBytes_FromStringAndSize((const char *)r->text, r->len);
            int bad = num == NULL || text == NULL || PyDict_SetItem(ids, h, num) < 0 ||
                      PyList_Append(texts, text) < 0;
            Py_XDECREF(num);
            Py_XDECREF(text);
            if (bad) {
                Py_DECREF(h);
                goto done;
            }
        }
        Py_DECREF(h);
        id_out[i] = id;
        count_out[i] = r->count;
        nbytes_out[i] = r->nbytes;
    }
    out = Py_BuildValue("(nOOO)", (Py_ssize_t)(at - base), id_bytes, count_bytes,
                        nbytes_bytes);
    goto done;
unusual:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(id_bytes);
    Py_XDECREF(count_bytes);
    Py_XDECREF(nbytes_bytes);
    PyMem_RawFree(recs);
    PyBuffer_Release(&buf);
    return out;
}

WITHOUT_GC(address_sets)
WITHOUT_GC(pack_stacks)
WITHOUT_GC(unpack_samples)
WITHOUT_GC(with_values)
WITHOUT_GC(leaf_pairs)
WITHOUT_GC(cut_leading)
WITHOUT_GC(sites)
WITHOUT_GC(fold_cut)
WITHOUT_GC(frames_named)
WITHOUT_GC(runs_above)
WITHOUT_GC(accumulate)
WITHOUT_GC(via_sums)
WITHOUT_GC(tree_add)
WITHOUT_GC(function_columns)
WITHOUT_GC(scan_counts)
WITHOUT_GC(direct_callers)

static PyMethodDef methods[] = {
    {"parse_records", parse_records, METH_VARARGS,
     "parse_records(text, start, stop, sample_type) -> list of samples, or None when the "
     "records are unusual (the line parser then reads them)."},
    {"address_sets", address_sets, METH_O,
     "address_sets(samples) -> (every address, addresses in a non-leaf position)."},
    {"leaf_pairs", leaf_pairs, METH_O,
     "leaf_pairs(samples) -> each distinct (leaf, caller) start of a stack, in order."},
    {"with_values", with_values, METH_VARARGS,
     "with_values(samples, fn, sample_type) -> samples with values fn(values) (memoised by "
     "identity), or None when a sample has per-thread values."},
    {"cut_leading", cut_leading, METH_VARARGS,
     "cut_leading(samples, codes, fn, memo, sample_type) -> (samples, leaf addresses)."},
    {"sites", sites, METH_VARARGS,
     "sites(samples, candidates, fn) -> per sample (address index << 16 | frame index)."},
    {"fold_cut", fold_cut, METH_VARARGS,
     "fold_cut(samples, codes, memo, vias, via_of, frames_via, via, trims, sample_type) -> "
     "samples, each stack whose code is not 0 cut at its site (as fold's loop)."},
    {"runs_above", runs_above, METH_VARARGS,
     "runs_above(samples, leaves, depth) -> each distinct stack[1:depth + 1] of the stacks "
     "whose leaf is in leaves, in order."},
    {"frames_named", frames_named, METH_VARARGS,
     "frames_named(addresses, locations, wanted): wanted[function].append((address, k)) for "
     "each frame k of each address's location whose function is in wanted."},
    {"accumulate", accumulate, METH_VARARGS,
     "accumulate(samples, index, key_ids, fn, no_stack) -> (flat, cum, total, leaf)."},
    {"via_sums", via_sums, METH_VARARGS,
     "via_sums(samples, leaf, index, per_key, chains): per key id leaf[n] >= 0, the value "
     "summed per via chain (by identity), in the samples' order."},
    {"tree_add", tree_add, METH_VARARGS,
     "tree_add(samples, frames_of, frames, children, child, line, columns, inverted): add "
     "samples into a call tree."},
    {"function_columns", function_columns, METH_VARARGS,
     "function_columns(data, strings, elf64, little) -> (starts, ends, bindings, name "
     "offsets, reach) of the named function symbols, sorted; or None."},
    {"pack_stacks", pack_stacks, METH_VARARGS,
     "pack_stacks(samples, index) -> (bytes: each stack's length and its addresses' "
     "indices (index[address]), little-endian u32; positions of samples with threads or "
     "via)."},
    {"scan_counts", scan_counts, METH_VARARGS,
     "scan_counts(data, start, ids, texts) -> (position of the line break before the "
     "memory map, stack ids as int64, counts and bytes as float64, each as bytes) of the "
     "records from data[start] on; ids maps a hash of each stack's text to its index in "
     "texts (new ones are added to both); None when the text is unusual."},
    {"direct_callers", direct_callers, METH_VARARGS,
     "direct_callers(segments, starts, ends) -> per function of the sorted int64 arrays "
     "starts/ends, the distinct other functions with an E8/E9 rel32 to its first byte in "
     "the (vaddr, code) segments, as int32 bytes."},
    {"unpack_samples", unpack_samples, METH_VARARGS,
     "unpack_samples(data, table, values, sample_type) -> samples (stack, values[i], (), "
     "()) of the stacks pack_stacks wrote, with table[index] for each index."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "heapscope._native",
    "The per-stack loops of reading and reducing heap dumps, in C (see heapscope.native).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) {
    init_hex();
    return PyModule_Create(&module);
}
