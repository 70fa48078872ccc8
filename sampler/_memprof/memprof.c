/* sampler._memprof: the engine of sampler.memprof (OCaml's Gc.Memprof for CPython).
 *
 * Allocation hooks (PEP 445) wrap the MEM and OBJ domains' allocators in place: every
 * call goes straight to the wrapped allocator with the same arguments and returns its
 * pointer unchanged (no header, no copy). While a profile samples, each allocated word
 * is a Bernoulli(rate) trial, as in OCaml's runtime: a per-thread countdown in words to
 * the next sampled word, drawn from the geometric distribution by a per-thread
 * xoshiro256** generator, is carried across allocations; a block of w words holds
 * n_samples = the number of countdowns that end inside it (binomial(w, rate)).
 *
 * A sampled block gets a record (the callstack of the allocating thread, read in place
 * from its own frames: no allocation, no Python call) and its pointer goes into an exact
 * table. Every free probes the table: first a lock-free counting filter (one load for a
 * block that was never sampled), then, on a filter hit, the table under the lock.
 *
 * Callbacks never run inside the allocator. They run, with the GIL, at safe points:
 *   - the allocating thread's allocation callbacks: at its next Python function call or
 *     generator resumption (a PEP 523 frame evaluator installed only while some thread
 *     has allocation callbacks waiting), and on the main thread also at the next
 *     eval-breaker check (Py_AddPendingCall), and at any collection it runs;
 *   - promotions: at the end of each collection (gc.callbacks, from sampler.memprof);
 *   - deallocations: at the next of those safe points on any thread.
 * A thread running a callback samples nothing and runs no other callback.
 *
 * Everything shared lives under one mutex (never held while calling Python or
 * releasing a reference: a callback's allocation re-enters the hooks); the hot paths
 * (allocation not sampled, free of a block never sampled) take no lock. Memory is
 * bounded: at most MS_MAX_RECORDS blocks are sampled and not yet released; further
 * samples are counted as dropped.
 */
#define PY_SSIZE_T_CLEAN
#include "../_native/pyframes.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MS_WORD ((size_t)sizeof(void *))
#define MS_MINOR_MAX 512                  /* bytes: pymalloc's small-request limit */
#define MS_MAX_RECORDS (1 << 16)          /* sampled blocks alive at once, at most */
#define MS_TABLE_SLOTS (MS_MAX_RECORDS * 2)
#define MS_FILTER_SLOTS (1 << 16)
#define MS_MAX_DEPTH 65536                /* frames kept per callstack, at most */

enum { SRC_NORMAL = 0, SRC_MARSHAL = 1, SRC_CUSTOM = 2 };
/* ST_BUSY: a callback for the block is running (its caller owns the record meanwhile). */
enum { ST_PENDING, ST_BUSY, ST_MINOR, ST_MAJOR, ST_DEALLOC_Q, ST_ORPHAN };
enum { PS_SAMPLING, PS_STOPPED, PS_DISCARDED };

typedef struct { PyObject *code; int lasti; } ms_ref;

struct ms_tls;
struct ms_profile;
struct ms_rec;

/* A doubly-linked list of records; a record is in at most one. */
typedef struct ms_list { struct ms_rec *head, *tail; } ms_list;

typedef struct ms_rec {
    uintptr_t ptr;
    size_t words;
    int64_t n_samples;
    uint64_t alloc_gc;         /* collections started before the block was sampled */
    struct ms_profile *prof;
    struct ms_tls *owner;      /* while ST_PENDING: the thread to run its callback */
    struct ms_rec *next, *prev;    /* in `list`: a pending list, the dealloc queue, ... */
    struct ms_list *list;
    struct ms_rec *aprev, *anext;  /* all records of the profile */
    int state, source, minor, in_table, freed;
    PyObject *value;           /* the tracker's value (ST_MINOR / ST_MAJOR) */
    PyObject *cb;              /* while ST_BUSY: the callback being run (a reference) */
    uint32_t depth;
    ms_ref *stack;             /* while ST_PENDING: the callstack, innermost first */
} ms_rec;

typedef struct ms_profile {
    int state;
    double rate;
    uint32_t callstack_size;
    PyObject *alloc_minor, *alloc_major, *promote, *dealloc_minor, *dealloc_major, *make;
    ms_rec *all;
    int64_t nrecs;
    int64_t samples, sampled_words, dropped, tracked_peak;
    int pyobj_alive;
} ms_profile;

typedef struct ms_tls {
    uint64_t rng[4];
    int64_t countdown;         /* words until the next sampled word (1: the next one) */
    uint64_t epoch;
    int seeded, in_callback, in_lock, registered;
    int npending;
    ms_list pending;           /* its sampled blocks waiting for their allocation callback */
    unsigned long ident;       /* once registered: the thread's ident */
    struct ms_tls *reg_prev, *reg_next;  /* the registered threads (g_threads) */
} ms_tls;

/* ---- shared state --------------------------------------------------------------- */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_key_t g_key;
static _Atomic(ms_profile *) g_sampling = NULL;
static _Atomic uint64_t g_epoch = 0;
static double g_log1m = 0.0;             /* log(1 - rate) of the sampling profile */
static double g_rate = 0.0;
static uint32_t g_callstack_size = 0;
static _Atomic int64_t g_in_table = 0;   /* pointers in the table */
static _Atomic uint8_t g_filter[MS_FILTER_SLOTS];
static struct { uintptr_t ptr; ms_rec *rec; } *g_table = NULL;
static int64_t g_nrecs = 0;
static ms_list g_dealloc = {0};          /* ST_DEALLOC_Q: freed, callback to run */
static ms_list g_orphans = {0};          /* ST_ORPHAN: their thread exited before the callback */
static ms_list g_minor = {0};            /* ST_MINOR records */
static uint64_t g_promoted_upto = 0;     /* collections whose promotions were run */
static int g_threads_waiting = 0;        /* threads with allocation callbacks waiting */
static _Atomic uint64_t g_gc_started = 0, g_gc_completed = 0;
static _Atomic int g_pending_call = 0;   /* a Py_AddPendingCall is queued */
static PyInterpreterState *g_interp = NULL;
static unsigned long g_main_ident = 0;
static int g_hooks_installed = 0;
static int g_live_profiles = 0;          /* started and not discarded */
static _PyFrameEvalFunction g_prev_eval = NULL;
static int g_eval_installed = 0;
static _Atomic int64_t g_delivered = 0;  /* callbacks run (for tests of latency) */
static int64_t g_orphaned = 0;           /* allocation callbacks dropped at a thread's exit */

static __thread ms_tls tls;
static ms_tls *g_threads = NULL;         /* threads that sampled a block and live on */

typedef struct {
    PyMemAllocatorEx orig;
    PyMemAllocatorDomain domain;
    int source;
} ms_domain;
static ms_domain g_dom[2];
static PyMemAllocatorEx g_mine[2];

static inline void lock(ms_tls *t) { pthread_mutex_lock(&g_lock); t->in_lock = 1; }
static inline void unlock(ms_tls *t) { t->in_lock = 0; pthread_mutex_unlock(&g_lock); }

/* ---- random numbers --------------------------------------------------------------- */

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t xoshiro_next(uint64_t *s) {
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3];
    s[2] ^= t; s[3] = rotl(s[3], 45);
    return result;
}

static uint64_t splitmix(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static _Atomic uint64_t g_seed_counter = 0;

static void tls_seed(ms_tls *t) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ (uintptr_t)t;
    x ^= 0x632BE59BD9B4E019ULL * (atomic_fetch_add(&g_seed_counter, 1) + 1);
    for (int i = 0; i < 4; i++) t->rng[i] = splitmix(&x);
    t->seeded = 1;
}

/* The number of trials up to and including the next success: geometric(rate) >= 1. */
static int64_t draw_gap(ms_tls *t) {
    if (g_rate >= 1.0) return 1;
    if (g_rate <= 0.0) return INT64_MAX;
    double u = (double)((xoshiro_next(t->rng) >> 11) + 1) * 0x1.0p-53;  /* (0, 1] */
    double g = floor(log(u) / g_log1m) + 1.0;
    return g >= 9.0e18 ? INT64_MAX : (int64_t)g;
}

/* ---- the table of sampled pointers ------------------------------------------------- */

static inline uint64_t ptr_hash(uintptr_t p) { return ((uint64_t)p >> 4) * 0x9E3779B97F4A7C15ULL; }
static inline size_t filter_slot(uintptr_t p) { return (size_t)(ptr_hash(p) >> 48); }

static void table_insert(ms_rec *r) {  /* under the lock */
    size_t mask = MS_TABLE_SLOTS - 1, i = (size_t)(ptr_hash(r->ptr) >> 20) & mask;
    while (g_table[i].ptr != 0) i = (i + 1) & mask;
    g_table[i].ptr = r->ptr;
    g_table[i].rec = r;
    r->in_table = 1;
    uint8_t c = atomic_load_explicit(&g_filter[filter_slot(r->ptr)], memory_order_relaxed);
    if (c != 255) atomic_store_explicit(&g_filter[filter_slot(r->ptr)], c + 1, memory_order_release);
    atomic_fetch_add(&g_in_table, 1);
}

static ms_rec *table_remove(uintptr_t p) {  /* under the lock; backward-shift deletion */
    size_t mask = MS_TABLE_SLOTS - 1, i = (size_t)(ptr_hash(p) >> 20) & mask;
    while (g_table[i].ptr != p) {
        if (g_table[i].ptr == 0) return NULL;
        i = (i + 1) & mask;
    }
    ms_rec *r = g_table[i].rec;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (g_table[j].ptr == 0) break;
        size_t home = (size_t)(ptr_hash(g_table[j].ptr) >> 20) & mask;
        /* move j back to i unless its home lies cyclically in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
            g_table[i] = g_table[j];
            i = j;
        }
    }
    g_table[i].ptr = 0;
    g_table[i].rec = NULL;
    r->in_table = 0;
    uint8_t c = atomic_load_explicit(&g_filter[filter_slot(p)], memory_order_relaxed);
    if (c != 255) atomic_store_explicit(&g_filter[filter_slot(p)], c - 1, memory_order_relaxed);
    atomic_fetch_sub(&g_in_table, 1);
    return r;
}

/* ---- records (under the lock) ------------------------------------------------------ */

static void list_push(ms_list *l, ms_rec *r) {
    r->next = NULL;
    r->prev = l->tail;
    if (l->tail) l->tail->next = r; else l->head = r;
    l->tail = r;
    r->list = l;
}

static void list_remove(ms_rec *r) {
    ms_list *l = r->list;
    if (l == NULL) return;
    if (r->prev) r->prev->next = r->next; else l->head = r->next;
    if (r->next) r->next->prev = r->prev; else l->tail = r->prev;
    r->next = r->prev = NULL;
    r->list = NULL;
}

static void rec_unlink_all(ms_rec *r) {
    ms_profile *p = r->prof;
    if (r->state == ST_PENDING) {
        ms_tls *t = r->owner;
        if (--t->npending == 0) g_threads_waiting--;
    }
    list_remove(r);
    if (r->aprev) r->aprev->anext = r->anext; else p->all = r->anext;
    if (r->anext) r->anext->aprev = r->aprev;
    p->nrecs--;
    g_nrecs--;
    if (r->in_table) table_remove(r->ptr);
}

static void dealloc_push(ms_rec *r) {
    list_remove(r);
    r->state = ST_DEALLOC_Q;
    list_push(&g_dealloc, r);
}

static void pending_unlink(ms_rec *r) {  /* r is ST_PENDING in r->owner's list */
    ms_tls *t = r->owner;
    list_remove(r);
    r->state = ST_BUSY;
    if (--t->npending == 0) g_threads_waiting--;
}

/* Free a released record's memory; its references go to the caller's list of
 * references to drop once the lock is released. */
typedef struct { PyObject **items; size_t n, cap; } ms_drops;

static void drops_add(ms_drops *d, PyObject *o) {
    if (o == NULL) return;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 64;
        PyObject **items = realloc(d->items, cap * sizeof *items);
        if (items == NULL) return;  /* leak one reference rather than crash */
        d->items = items;
        d->cap = cap;
    }
    d->items[d->n++] = o;
}

static void drops_release(ms_drops *d) {  /* with the GIL, outside the lock */
    for (size_t i = 0; i < d->n; i++) Py_DECREF(d->items[i]);
    free(d->items);
    d->items = NULL;
    d->n = d->cap = 0;
}

static void rec_free(ms_rec *r, ms_drops *d) {  /* under the lock, r unlinked */
    for (uint32_t i = 0; i < r->depth; i++) drops_add(d, r->stack[i].code);
    free(r->stack);
    drops_add(d, r->value);
    free(r);
}

/* Release a record; the last one of a discarded profile whose Python object is gone
 * frees the profile. */
static void rec_release(ms_rec *r, ms_drops *d) {
    ms_profile *p = r->prof;
    rec_unlink_all(r);
    rec_free(r, d);
    if (p->state == PS_DISCARDED && p->nrecs == 0 && !p->pyobj_alive) free(p);
}

/* ---- the allocating thread's own frames -------------------------------------------- */

static uintptr_t own_top_frame(PyThreadState *ts) {
#if PY_VERSION_HEX >= 0x030D0000
    return (uintptr_t)ts->current_frame;
#elif PY_VERSION_HEX >= 0x030B0000
    return (uintptr_t)(ts->cframe ? ts->cframe->current_frame : NULL);
#else
    return (uintptr_t)ts->frame;
#endif
}

/* The callstack of the calling thread, innermost first, read in place (the thread's
 * own frames cannot change under it). Code objects are kept with a new reference
 * (a plain increment: the frame holds one, so the object is alive). */
static uint32_t own_callstack(ms_ref *out, uint32_t max) {
    PyThreadState *ts = _PyThreadState_UncheckedGet();
    if (ts == NULL || ts->interp != g_interp) return 0;
    uint32_t n = 0;
    for (uintptr_t a = own_top_frame(ts); a != 0 && n < max;) {
        ss_frame f;
        ss_decode_frame((const void *)a, a, &f);
        a = f.previous;
        if (f.skip || f.code == 0 || Py_TYPE((PyObject *)f.code) != &PyCode_Type) continue;
        if (out) {
            out[n].code = (PyObject *)f.code;
            out[n].lasti = f.lasti;
            Py_INCREF(out[n].code);
        }
        n++;
    }
    return n;
}

/* ---- the hooks --------------------------------------------------------------------- */

static void schedule_main(void) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&g_pending_call, &expected, 1)) {
        extern int ms_pending_call(void *);
        if (Py_AddPendingCall(ms_pending_call, NULL) != 0) atomic_store(&g_pending_call, 0);
    }
}

static void install_eval(void);

/* A sampled block: record it for the allocating thread's allocation callback. */
static void sampled(ms_tls *t, ms_profile *prof, void *ptr, size_t words, int64_t n, int source, size_t bytes) {
    PyThreadState *ts = _PyThreadState_UncheckedGet();
    if (ts == NULL || ts->interp != g_interp) return;  /* another interpreter: not ours */
    if ((bytes <= MS_MINOR_MAX ? prof->alloc_minor : prof->alloc_major) == Py_None) {
        /* no callback would see it (the null tracker): count it, keep nothing */
        __atomic_fetch_add(&prof->samples, 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&prof->sampled_words, n, __ATOMIC_RELAXED);
        return;
    }
    uint32_t max = g_callstack_size;
    uint32_t depth = own_callstack(NULL, max);
    ms_rec *r = calloc(1, sizeof *r);
    ms_ref *stack = depth ? malloc(depth * sizeof *stack) : NULL;
    if (r == NULL || (depth && stack == NULL)) { free(r); free(stack); return; }
    lock(t);
    if (atomic_load(&g_sampling) != prof || g_nrecs >= MS_MAX_RECORDS) {
        if (atomic_load(&g_sampling) == prof) prof->dropped++;
        unlock(t);
        free(r); free(stack);
        return;
    }
    r->depth = own_callstack(stack, depth);  /* the frames are the same: nothing ran */
    r->stack = stack;
    r->ptr = (uintptr_t)ptr;
    r->words = words;
    r->n_samples = n;
    r->alloc_gc = atomic_load(&g_gc_started);
    r->prof = prof;
    r->owner = t;
    r->state = ST_PENDING;
    r->source = source;
    r->minor = bytes <= MS_MINOR_MAX;
    r->anext = prof->all;
    if (prof->all) prof->all->aprev = r;
    prof->all = r;
    prof->nrecs++;
    g_nrecs++;
    __atomic_fetch_add(&prof->samples, 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&prof->sampled_words, n, __ATOMIC_RELAXED);
    if (prof->nrecs > prof->tracked_peak) prof->tracked_peak = prof->nrecs;
    table_insert(r);
    list_push(&t->pending, r);
    if (t->npending++ == 0) g_threads_waiting++;
    if (!t->registered) {  /* its exit must drop its waiting callbacks: be told of it */
        pthread_setspecific(g_key, t);
        t->registered = 1;
        t->ident = PyThread_get_thread_ident();
        t->reg_next = g_threads;
        if (g_threads) g_threads->reg_prev = t;
        g_threads = t;
    }
    install_eval();
    unlock(t);
    if (PyThread_get_thread_ident() == g_main_ident) schedule_main();
}

static inline void on_alloc(void *ptr, size_t bytes, int source) {
    ms_profile *prof = atomic_load_explicit(&g_sampling, memory_order_acquire);
    if (prof == NULL || ptr == NULL) return;
    ms_tls *t = &tls;
    if (t->in_callback || t->in_lock) return;
    size_t words = (bytes + MS_WORD - 1) / MS_WORD;
    uint64_t epoch = atomic_load_explicit(&g_epoch, memory_order_relaxed);
    if (t->epoch != epoch) {
        if (!t->seeded) tls_seed(t);
        t->epoch = epoch;
        t->countdown = draw_gap(t);
    }
    if ((int64_t)words < t->countdown) { t->countdown -= (int64_t)words; return; }
    /* the countdown ends inside this block: count every gap that does */
    int64_t n = 1, left = (int64_t)words - t->countdown;
    for (;;) {
        int64_t g = draw_gap(t);
        if (g > left) { t->countdown = g - left; break; }
        left -= g;
        n++;
    }
    sampled(t, prof, ptr, words, n, source, bytes);
}

/* The block at ptr is being returned to the allocator: if it is tracked, take it out
 * of the table now (its address may be reused at once) and queue its deallocation. */
static inline void on_free(void *ptr) {
    if (ptr == NULL || atomic_load_explicit(&g_in_table, memory_order_relaxed) == 0) return;
    if (atomic_load_explicit(&g_filter[filter_slot((uintptr_t)ptr)], memory_order_acquire) == 0) return;
    ms_tls *t = &tls;
    if (t->in_lock) return;
    lock(t);
    ms_rec *r = table_remove((uintptr_t)ptr);
    int queued = 0;
    if (r != NULL) {
        r->freed = 1;
        if (r->state == ST_MINOR || r->state == ST_MAJOR) {
            dealloc_push(r);
            queued = 1;
        }
    }
    unlock(t);
    if (queued) schedule_main();
}

static void *hk_malloc(void *ctx, size_t n) {
    ms_domain *d = ctx;
    void *p = d->orig.malloc(d->orig.ctx, n);
    on_alloc(p, n, d->source);
    return p;
}

static void *hk_calloc(void *ctx, size_t nelem, size_t elsize) {
    ms_domain *d = ctx;
    void *p = d->orig.calloc(d->orig.ctx, nelem, elsize);
    on_alloc(p, nelem * elsize, d->source);
    return p;
}

/* A realloc is the old block's deallocation and the new block's allocation (of its
 * whole new size), whether or not the address changes. */
static void *hk_realloc(void *ctx, void *ptr, size_t n) {
    ms_domain *d = ctx;
    on_free(ptr);
    void *p = d->orig.realloc(d->orig.ctx, ptr, n);
    on_alloc(p, n, d->source);
    return p;
}

static void hk_free(void *ctx, void *ptr) {
    ms_domain *d = ctx;
    on_free(ptr);
    d->orig.free(d->orig.ctx, ptr);
}

static void install_hooks(void) {
    if (g_hooks_installed) return;
    PyMemAllocatorDomain doms[2] = {PYMEM_DOMAIN_MEM, PYMEM_DOMAIN_OBJ};
    int sources[2] = {SRC_CUSTOM, SRC_NORMAL};
    for (int i = 0; i < 2; i++) {
        g_dom[i].domain = doms[i];
        g_dom[i].source = sources[i];
        PyMem_GetAllocator(doms[i], &g_dom[i].orig);
        g_mine[i].ctx = &g_dom[i];
        g_mine[i].malloc = hk_malloc;
        g_mine[i].calloc = hk_calloc;
        g_mine[i].realloc = hk_realloc;
        g_mine[i].free = hk_free;
        PyMem_SetAllocator(doms[i], &g_mine[i]);
    }
    g_hooks_installed = 1;
}

/* Take the hooks out when ours are still the installed ones (another wrapper, such as
 * tracemalloc started after us, keeps calling them: they stay, passing through). */
static void uninstall_hooks(void) {
    if (!g_hooks_installed) return;
    for (int i = 0; i < 2; i++) {
        PyMemAllocatorEx cur;
        PyMem_GetAllocator(g_dom[i].domain, &cur);
        if (cur.malloc != hk_malloc || cur.ctx != &g_dom[i]) return;
    }
    for (int i = 0; i < 2; i++) PyMem_SetAllocator(g_dom[i].domain, &g_dom[i].orig);
    g_hooks_installed = 0;
}

/* Under the lock, with the GIL: once every profile is discarded and its last record
 * released (a callback may have been running at discard), the hooks come out. */
static void uninstall_eval(void);
static void uninstall_when_idle(void) {
    if (g_live_profiles == 0 && g_nrecs == 0) {
        uninstall_eval();
        uninstall_hooks();
    }
}

/* ---- callbacks (with the GIL) ------------------------------------------------------ */

static PyObject *call1(PyObject *f, PyObject *arg) {
    if (f == Py_None) Py_RETURN_NONE;  /* a callback left out: as if it returned None */
    PyObject *args = PyTuple_Pack(1, arg);
    if (args == NULL) return NULL;
    PyObject *res = PyObject_Call(f, args, NULL);
    Py_DECREF(args);
    return res;
}

/* A callback's result: a new reference to keep, or NULL (None, or it raised: the
 * exception goes to sys.unraisablehook). */
static PyObject *kept(PyObject *res, PyObject *callback) {
    if (res == NULL) { PyErr_WriteUnraisable(callback); return NULL; }
    if (res == Py_None) { Py_DECREF(res); return NULL; }
    return res;
}

static PyObject *build_allocation(ms_rec *r) {
    PyObject *cs = PyTuple_New(r->depth);
    if (cs == NULL) return NULL;
    for (uint32_t i = 0; i < r->depth; i++) {
        PyObject *pair = Py_BuildValue("(Oi)", r->stack[i].code, r->stack[i].lasti);
        if (pair == NULL) { Py_DECREF(cs); return NULL; }
        PyTuple_SET_ITEM(cs, i, pair);
    }
    PyObject *res = PyObject_CallFunction(r->prof->make, "LnnO", (long long)r->n_samples,
                                          (Py_ssize_t)r->words, (Py_ssize_t)r->source, cs);
    Py_DECREF(cs);
    return res;
}

static void deliver_allocs(ms_tls *t) {
    ms_drops d = {0};
    for (;;) {
        lock(t);
        ms_rec *r = t->pending.head;
        if (r == NULL) { unlock(t); break; }
        pending_unlink(r);
        ms_profile *prof = r->prof;
        PyObject *cb = r->minor ? prof->alloc_minor : prof->alloc_major;
        Py_INCREF(cb);
        unlock(t);
        PyObject *alloc = build_allocation(r), *res = NULL;
        if (alloc == NULL) PyErr_WriteUnraisable(cb);
        else res = kept(call1(cb, alloc), cb);
        Py_XDECREF(alloc);
        atomic_fetch_add(&g_delivered, 1);
        lock(t);
        for (uint32_t i = 0; i < r->depth; i++) drops_add(&d, r->stack[i].code);
        free(r->stack);
        r->stack = NULL;
        r->depth = 0;
        if (res == NULL || prof->state == PS_DISCARDED) {
            drops_add(&d, res);
            rec_release(r, &d);
        } else {
            r->value = res;
            r->state = r->minor ? ST_MINOR : ST_MAJOR;
            if (r->freed) dealloc_push(r);
            else if (r->minor) {
                list_push(&g_minor, r);
                /* a collection ran since it was sampled: promote it at once */
                if (r->alloc_gc < atomic_load(&g_gc_completed)) g_promoted_upto = 0;
            }
        }
        unlock(t);
        drops_add(&d, cb);
        drops_release(&d);
    }
}

/* The next record of a batch taken for callbacks, and (in *cb) the callback kept
 * for it; NULL when the batch is done. */
static ms_rec *take_next(ms_tls *t, ms_list *batch, PyObject **cb) {
    lock(t);
    ms_rec *r = batch->head;
    if (r) list_remove(r);
    unlock(t);
    if (r) {
        *cb = r->cb;
        r->cb = NULL;
    }
    return r;
}

/* Promote the minor blocks sampled before collection number `limit` started. */
static void promote_blocks(ms_tls *t, uint64_t limit) {
    ms_drops d = {0};
    ms_list todo = {0};
    lock(t);
    g_promoted_upto = limit;
    for (ms_rec *r = g_minor.head, *next; r; r = next) {
        next = r->next;
        if (r->alloc_gc < limit && !r->freed) {
            list_remove(r);
            r->state = ST_BUSY;
            r->cb = r->prof->promote;  /* kept alive while unlocked */
            Py_INCREF(r->cb);
            list_push(&todo, r);
        }
    }
    unlock(t);
    PyObject *cb;
    for (ms_rec *r; (r = take_next(t, &todo, &cb)) != NULL;) {
        PyObject *res = kept(call1(cb, r->value), cb);
        atomic_fetch_add(&g_delivered, 1);
        lock(t);
        drops_add(&d, r->value);
        r->value = NULL;
        if (res == NULL || r->prof->state == PS_DISCARDED) {
            drops_add(&d, res);
            rec_release(r, &d);
        } else {
            r->value = res;
            r->state = ST_MAJOR;
            r->minor = 0;
            if (r->freed) dealloc_push(r);
        }
        unlock(t);
        drops_add(&d, cb);
        drops_release(&d);
    }
}

static void deliver_deallocs(ms_tls *t) {
    ms_drops d = {0};
    ms_list q = {0};
    lock(t);
    while (g_orphans.head) rec_release(g_orphans.head, &d);
    while (g_dealloc.head) {
        ms_rec *r = g_dealloc.head;
        list_remove(r);
        r->state = ST_BUSY;
        r->cb = r->minor ? r->prof->dealloc_minor : r->prof->dealloc_major;
        Py_INCREF(r->cb);
        list_push(&q, r);
    }
    unlock(t);
    drops_release(&d);
    PyObject *cb;
    for (ms_rec *r; (r = take_next(t, &q, &cb)) != NULL;) {
        PyObject *res = r->prof->state == PS_DISCARDED ? NULL : call1(cb, r->value);
        if (res == NULL && PyErr_Occurred()) PyErr_WriteUnraisable(cb);
        Py_XDECREF(res);
        atomic_fetch_add(&g_delivered, 1);
        lock(t);
        rec_release(r, &d);
        unlock(t);
        drops_add(&d, cb);
        drops_release(&d);
    }
}

/* Run what this thread may run now: its own allocation callbacks, then the
 * deallocations queued by any thread. Never re-entered on a thread. */
static void run_callbacks(void) {
    ms_tls *t = &tls;
    if (t->in_callback || t->in_lock || g_interp == NULL) return;
    PyThreadState *ts = _PyThreadState_UncheckedGet();
    if (ts == NULL || ts->interp != g_interp) return;
    t->in_callback = 1;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
#endif
    if (t->pending.head) deliver_allocs(t);
    uint64_t done = atomic_load(&g_gc_completed);
    if (g_minor.head && done > g_promoted_upto) promote_blocks(t, done);
    if (g_dealloc.head || g_orphans.head) deliver_deallocs(t);
    if (g_live_profiles == 0 && g_hooks_installed) {
        lock(t);
        uninstall_when_idle();
        unlock(t);
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(et, ev, tb);
#endif
    t->in_callback = 0;
}

int ms_pending_call(void *unused) {
    atomic_store(&g_pending_call, 0);
    run_callbacks();
    return 0;
}

/* ---- the frame evaluator (a safe point on every thread) ----------------------------- */

#if PY_VERSION_HEX >= 0x030B0000
typedef struct _PyInterpreterFrame ms_eval_frame_t;
#else
typedef PyFrameObject ms_eval_frame_t;
#endif

static void uninstall_eval(void);

static PyObject *ms_eval(PyThreadState *ts, ms_eval_frame_t *frame, int exc) {
    ms_tls *t = &tls;
    _PyFrameEvalFunction prev = g_prev_eval;
    if (t->npending && !t->in_callback) run_callbacks();
    if (g_threads_waiting == 0 && g_eval_installed) {
        lock(t);
        if (g_threads_waiting == 0) uninstall_eval();
        unlock(t);
    }
    return prev ? prev(ts, frame, exc) : _PyEval_EvalFrameDefault(ts, frame, exc);
}

static void install_eval(void) {  /* under the lock */
    if (g_eval_installed || g_interp == NULL) return;
    _PyFrameEvalFunction cur = _PyInterpreterState_GetEvalFrameFunc(g_interp);
    if (cur == ms_eval) return;
    g_prev_eval = cur == _PyEval_EvalFrameDefault ? NULL : cur;
    _PyInterpreterState_SetEvalFrameFunc(g_interp, ms_eval);
    g_eval_installed = 1;
}

static void uninstall_eval(void) {  /* under the lock */
    if (!g_eval_installed) return;
    if (_PyInterpreterState_GetEvalFrameFunc(g_interp) == ms_eval)
        _PyInterpreterState_SetEvalFrameFunc(g_interp, g_prev_eval ? g_prev_eval : _PyEval_EvalFrameDefault);
    g_eval_installed = 0;
}

/* A thread exits: its allocation callbacks will never run; the blocks are untracked
 * (the records are released at the next safe point, with the GIL). */
static void tls_destructor(void *arg) {
    ms_tls *t = arg;
    pthread_mutex_lock(&g_lock);
    while (t->pending.head) {
        ms_rec *r = t->pending.head;
        pending_unlink(r);
        if (r->in_table) table_remove(r->ptr);
        r->state = ST_ORPHAN;
        r->owner = NULL;
        list_push(&g_orphans, r);
        g_orphaned++;
    }
    if (t->reg_prev) t->reg_prev->reg_next = t->reg_next; else g_threads = t->reg_next;
    if (t->reg_next) t->reg_next->reg_prev = t->reg_prev;
    t->reg_prev = t->reg_next = NULL;
    t->registered = 0;
    pthread_mutex_unlock(&g_lock);
}

/* ---- the profile object ------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    ms_profile *p;
} CoreObject;

static void drop_pending_of(ms_profile *p, ms_drops *d) {  /* under the lock */
    for (ms_rec *r = p->all, *next; r; r = next) {
        next = r->anext;
        if (r->state == ST_PENDING) rec_release(r, d);
    }
}

static void core_dealloc(CoreObject *self) {
    ms_profile *p = self->p;
    if (p) {
        ms_tls *t = &tls;
        lock(t);
        p->pyobj_alive = 0;
        int gone = p->state == PS_DISCARDED && p->nrecs == 0;
        unlock(t);
        if (gone) free(p);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *core_stop(CoreObject *self, PyObject *unused) {
    ms_profile *p = self->p;
    ms_tls *t = &tls;
    ms_drops d = {0};
    if (p->state != PS_SAMPLING) {
        PyErr_SetString(PyExc_RuntimeError, "this profile is not sampling");
        return NULL;
    }
    lock(t);
    atomic_store(&g_sampling, NULL);
    p->state = PS_STOPPED;
    drop_pending_of(p, &d);
    unlock(t);
    drops_release(&d);
    Py_RETURN_NONE;
}

static PyObject *core_discard(CoreObject *self, PyObject *unused) {
    ms_profile *p = self->p;
    ms_tls *t = &tls;
    ms_drops d = {0};
    if (p->state == PS_SAMPLING) {
        PyErr_SetString(PyExc_RuntimeError, "cannot discard a profile that is still sampling: stop it first");
        return NULL;
    }
    if (p->state == PS_DISCARDED) Py_RETURN_NONE;
    lock(t);
    p->state = PS_DISCARDED;
    for (ms_rec *r = p->all, *next; r; r = next) {
        next = r->anext;
        if (r->state != ST_BUSY) rec_release(r, &d);  /* busy: their caller releases them */
    }
    drops_add(&d, p->alloc_minor); drops_add(&d, p->alloc_major); drops_add(&d, p->promote);
    drops_add(&d, p->dealloc_minor); drops_add(&d, p->dealloc_major); drops_add(&d, p->make);
    p->alloc_minor = p->alloc_major = p->promote = p->dealloc_minor = p->dealloc_major = p->make = NULL;
    g_live_profiles--;
    uninstall_when_idle();
    unlock(t);
    drops_release(&d);
    Py_RETURN_NONE;
}

static PyObject *core_stats(CoreObject *self, PyObject *unused) {
    ms_profile *p = self->p;
    ms_tls *t = &tls;
    lock(t);
    int64_t samples = __atomic_load_n(&p->samples, __ATOMIC_RELAXED);
    int64_t words = __atomic_load_n(&p->sampled_words, __ATOMIC_RELAXED), dropped = p->dropped;
    int64_t live = p->nrecs, peak = p->tracked_peak;
    unlock(t);
    return Py_BuildValue("{sLsLsLsLsL}", "samples", (long long)samples, "sampled_words", (long long)words,
                         "dropped", (long long)dropped, "records", (long long)live, "records_peak", (long long)peak);
}

static PyObject *core_state(CoreObject *self, void *unused) {
    static const char *names[] = {"sampling", "stopped", "discarded"};
    return PyUnicode_FromString(names[self->p->state]);
}

static PyMethodDef core_methods[] = {
    {"stop", (PyCFunction)core_stop, METH_NOARGS, "Stop sampling (pending allocation callbacks are dropped)."},
    {"discard", (PyCFunction)core_discard, METH_NOARGS, "Release all state of a stopped profile."},
    {"stats", (PyCFunction)core_stats, METH_NOARGS, "Counters: samples, sampled_words, dropped, records."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef core_getset[] = {
    {"state", (getter)core_state, NULL, "'sampling', 'stopped' or 'discarded'", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject CoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sampler._memprof.Core",
    .tp_basicsize = sizeof(CoreObject),
    .tp_dealloc = (destructor)core_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The engine's side of one memprof profile.",
    .tp_methods = core_methods,
    .tp_getset = core_getset,
};

/* start(rate, callstack_size, alloc_minor, alloc_major, promote, dealloc_minor,
 *       dealloc_major, make_allocation, main_thread_ident) -> Core */
static PyObject *mod_start(PyObject *m, PyObject *args) {
    double rate;
    unsigned int callstack_size;
    unsigned long main_ident;
    PyObject *cbs[6];
    if (!PyArg_ParseTuple(args, "dIOOOOOOk", &rate, &callstack_size, &cbs[0], &cbs[1], &cbs[2], &cbs[3],
                          &cbs[4], &cbs[5], &main_ident))
        return NULL;
    if (!(rate >= 0.0 && rate <= 1.0)) {
        PyErr_SetString(PyExc_ValueError, "sampling_rate must be between 0.0 and 1.0");
        return NULL;
    }
    if (atomic_load(&g_sampling) != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a memprof profile is already sampling");
        return NULL;
    }
    if (g_table == NULL) {
        g_table = calloc(MS_TABLE_SLOTS, sizeof *g_table);
        if (g_table == NULL) return PyErr_NoMemory();
    }
    ms_profile *p = calloc(1, sizeof *p);
    CoreObject *core = PyObject_New(CoreObject, &CoreType);
    if (p == NULL || core == NULL) { free(p); Py_XDECREF(core); return PyErr_NoMemory(); }
    p->rate = rate;
    p->callstack_size = callstack_size > MS_MAX_DEPTH ? MS_MAX_DEPTH : callstack_size;
    PyObject **slots[6] = {&p->alloc_minor, &p->alloc_major, &p->promote, &p->dealloc_minor,
                           &p->dealloc_major, &p->make};
    for (int i = 0; i < 6; i++) { Py_INCREF(cbs[i]); *slots[i] = cbs[i]; }
    p->state = PS_SAMPLING;
    p->pyobj_alive = 1;
    core->p = p;
    ms_tls *t = &tls;
    lock(t);
    g_interp = PyThreadState_Get()->interp;
    g_main_ident = main_ident;
    g_rate = rate;
    g_log1m = rate < 1.0 ? log1p(-rate) : -INFINITY;
    g_callstack_size = p->callstack_size;
    atomic_fetch_add(&g_epoch, 1);
    g_live_profiles++;
    install_hooks();
    atomic_store_explicit(&g_sampling, p, memory_order_release);
    unlock(t);
    return (PyObject *)core;
}

static PyObject *mod_run_callbacks(PyObject *m, PyObject *unused) {
    run_callbacks();
    Py_RETURN_NONE;
}

/* gc.callbacks, phase "start" (started=True) or "stop". */
static PyObject *mod_gc_phase(PyObject *m, PyObject *arg) {
    int started = PyObject_IsTrue(arg);
    if (started < 0) return NULL;
    if (started) atomic_fetch_add(&g_gc_started, 1);
    else atomic_store(&g_gc_completed, atomic_load(&g_gc_started));
    run_callbacks();
    Py_RETURN_NONE;
}

static PyObject *mod_info(PyObject *m, PyObject *unused) {
    ms_tls *t = &tls;
    lock(t);
    long long recs = g_nrecs, in_table = atomic_load(&g_in_table);
    int waiting = g_threads_waiting, eval = g_eval_installed, hooks = g_hooks_installed;
    long long orphaned = g_orphaned;
    unlock(t);
    return Py_BuildValue("{sLsLsisisisLsL}", "records", recs, "in_table", in_table, "threads_waiting", waiting,
                         "eval_installed", eval, "hooks_installed", hooks, "callbacks_run",
                         (long long)atomic_load(&g_delivered), "orphaned", orphaned);
}

/* The idents of the threads whose allocation callbacks are waiting (tests). */
static PyObject *mod_waiting_threads(PyObject *m, PyObject *unused) {
    ms_tls *t = &tls;
    unsigned long idents[256];
    int n = 0;
    lock(t);  /* no Python allocation under the lock: copy, then build the list */
    for (ms_tls *x = g_threads; x && n < 256; x = x->reg_next)
        if (x->npending) idents[n++] = x->ident;
    unlock(t);
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(idents[i]);
        if (v == NULL || PyList_Append(out, v) < 0) { Py_XDECREF(v); Py_CLEAR(out); break; }
        Py_DECREF(v);
    }
    return out;
}

static PyObject *mod_after_fork(PyObject *m, PyObject *unused) {
    pthread_mutex_init(&g_lock, NULL);
    g_main_ident = PyThread_get_thread_ident();
    tls.in_lock = 0;
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"start", mod_start, METH_VARARGS,
     "start(rate, callstack_size, alloc_minor, alloc_major, promote, dealloc_minor, dealloc_major, "
     "make_allocation, main_thread_ident) -> Core"},
    {"run_callbacks", mod_run_callbacks, METH_NOARGS, "Run the callbacks this thread may run now."},
    {"gc_phase", mod_gc_phase, METH_O, "gc_phase(started): a collection starts (True) or ends (False)."},
    {"info", mod_info, METH_NOARGS, "The engine's global counters (tests, diagnostics)."},
    {"waiting_threads", mod_waiting_threads, METH_NOARGS,
     "The idents of the threads whose allocation callbacks are waiting (tests)."},
    {"after_fork", mod_after_fork, METH_NOARGS, "In a forked child: reset the lock."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sampler._memprof",
    "The engine of sampler.memprof: allocator hooks with per-word Bernoulli sampling.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__memprof(void) {
    if (PyType_Ready(&CoreType) < 0) return NULL;
    if (pthread_key_create(&g_key, tls_destructor) != 0) return PyErr_NoMemory();
    g_main_ident = PyThread_get_thread_ident();
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&CoreType);
    if (PyModule_AddObject(m, "Core", (PyObject *)&CoreType) < 0) {
        Py_DECREF(&CoreType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "WORD_SIZE", (long)MS_WORD);
    PyModule_AddIntConstant(m, "MINOR_MAX_BYTES", MS_MINOR_MAX);
    PyModule_AddIntConstant(m, "MAX_RECORDS", MS_MAX_RECORDS);
    PyModule_AddIntConstant(m, "MAX_DEPTH", MS_MAX_DEPTH);
    PyModule_AddIntConstant(m, "RECORD_BYTES", sizeof(ms_rec));
    PyModule_AddIntConstant(m, "TABLE_BYTES", MS_TABLE_SLOTS * 2 * sizeof(void *));
    return m;
}
