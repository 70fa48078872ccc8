/* sampler._native.GCHook: the gc.callbacks hook of sampler.gctime, in C.
 *
 * One object, put into gc.callbacks, called by the interpreter at the start and the
 * stop of every collection, in the collecting thread, with the GIL held:
 *
 *   start  the thread, CLOCK_MONOTONIC (vDSO: no system call), the generation, and
 *          the stack that triggered the collection (code objects, increfed, and byte
 *          offsets, innermost first, at most SS_GC_MAX_DEPTH) and the address of its
 *          outermost frame (which greenlet it was), read from the thread state's
 *          frame chain with pyframes.h (plain reads: the GIL is held);
 *   stop   the durations, and the event is committed to a bounded ring; take()
 *          (Python, under the GIL) drains it as the tuples sampler.gctime documents.
 *
 * The thread's CPU clock is a system call (about 1.6 µs each where measured): it is
 * read, at both ends, only for a collection whose generation's previous collection
 * lasted at least cpu_above_ns of wall time (where the time is). A collection not
 * measured is charged its wall duration, at most cpu_above_ns (the recorder then
 * caps it by the CPU its thread used in the interval; see sampler/gctime.py).
 *
 * Why C: the hook calls no Python code, so the GIL cannot change hands inside a
 * collection because of it (a Python hook lets it; see sampler/gctime.py on the
 * CPython 3.11 crash this caused), and it costs a fraction of a Python callback.
 *
 * Storage: a ring of events and a ring of frames (code, offset) shared by their
 * stacks, both of fixed size; a collection that finds either full is dropped and
 * counted (dropped). Nothing here allocates inside a collection.
 */
#ifndef STACKSHOT_GCHOOK_H
#define STACKSHOT_GCHOOK_H

#include "pyframes.h"
#include "nsclock.h"
#include <structmember.h>
#include <time.h>

#define SS_GC_MAX_DEPTH 128   /* frames kept of a triggering stack (innermost ones) */
#define SS_GC_BASE_DEPTH 256  /* frames walked for its outermost one's address (cost: ~3 ns each) */
#define SS_GC_GENERATIONS 3

typedef struct {
    PyObject *code;  /* a strong reference */
    int32_t lasti;
} ss_gc_frame;

#define SS_GC_MEMO 8  /* stacks take() remembers (a collection's stack mostly repeats) */

typedef struct {
    PyObject *stack;  /* a tuple take() returned (strong: it keeps the codes alive), or NULL */
    uint64_t hash;    /* of its frames (ss_gc_frames_hash) */
    uint32_t depth;
} ss_gc_stack_memo;

typedef struct {
    unsigned long ident;
    int generation;
    int64_t end_ns, wall_ns, cpu_ns;
    uint64_t first;  /* index (not wrapped) of its first frame in the frame ring */
    uint32_t depth;
    uint64_t base;   /* the outermost frame's address, as the engine reports it (0: too deep) */
} ss_gc_event;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int64_t origin_ns;        /* the recorder's start, on CLOCK_MONOTONIC */
    int64_t cpu_above_ns;     /* read the CPU clock after a collection this long */
    int active;
    unsigned long long collections, dropped;
    ss_gc_event *events;
    size_t n_events;          /* a power of two */
    uint64_t ev_head, ev_tail;
    ss_gc_frame *frames;
    size_t n_frames;          /* a power of two */
    uint64_t fr_head, fr_tail;
    /* the collection under way (at most one: the interpreter never nests them) */
    int open;                 /* 0 none, 1 recording, 2 not recorded (full, paused) */
    PyThreadState *open_ts;
    unsigned long open_ident;
    int open_gen;
    int64_t open_wall, open_cpu;  /* open_cpu < 0: CPU clock not read */
    uint32_t open_depth;
    uint64_t open_base;
    int64_t last_wall[SS_GC_GENERATIONS];  /* -1: none yet (measure the first) */
    /* take(): the stacks it built last, each given again (the same tuple) to a later
     * event of the same take() whose frames are the same: the recorder interns a
     * stack once per tuple, not once per collection (sampler/recorder.py,
     * collection_stack). Emptied as take() returns: no code object is kept past it. */
    ss_gc_stack_memo memo[SS_GC_MEMO];
    unsigned memo_next;
} GCHook;

static PyObject *ss_gc_generation_key;  /* interned "generation" */

/* The calling thread's frames into the frame ring from fr_head (not committed); *base
 * the address of its outermost frame (the engine's walk's base: it tells a greenlet's
 * stack apart), 0 when the stack is deeper than SS_GC_BASE_DEPTH. */
static uint32_t ss_gc_read_stack(GCHook *h, PyThreadState *ts, uint64_t *base) {
    uint32_t depth = 0;
    size_t free_slots = h->n_frames - (size_t)(h->fr_head - h->fr_tail);
    uintptr_t addr = ss_current_frame_addr(ts);
    int walked = 0;
    *base = 0;
    while (addr != 0 && walked++ < SS_GC_BASE_DEPTH) {
        ss_frame fr;
        ss_decode_frame((const void *)addr, addr, &fr);
        if (!fr.skip) *base = addr;
        addr = fr.previous;
        if (depth >= SS_GC_MAX_DEPTH || depth >= free_slots) continue;  /* kept enough */
        if (fr.skip || fr.code == 0 || fr.lasti < 0) continue;  /* shims, frames not started */
        PyObject *code = (PyObject *)fr.code;
        if (!PyCode_Check(code)) continue;  /* 3.13: frames that run no bytecode */
#if PY_VERSION_HEX >= 0x030B0000
        /* Incomplete frames, which frame.f_back skips too: not past their RESUME yet,
         * and 3.13's static __init__ shim (_Py_InitCleanup), never past it and not a
         * code object to keep (a weak reference to it crashes). */
        if (fr.lasti < ((PyCodeObject *)code)->_co_firsttraceable * (int32_t)sizeof(_Py_CODEUNIT)) continue;
#endif
        ss_gc_frame *slot = &h->frames[(h->fr_head + depth) & (h->n_frames - 1)];
        Py_INCREF(code);
        slot->code = code;
        slot->lasti = fr.lasti;
        depth++;
    }
    if (addr != 0) *base = 0;  /* deeper than we walk: unknown */
    return depth;
}

static void ss_gc_release_open(GCHook *h) {
    for (uint32_t i = 0; i < h->open_depth; i++) {
        ss_gc_frame *slot = &h->frames[(h->fr_head + i) & (h->n_frames - 1)];
        Py_CLEAR(slot->code);
    }
    h->open_depth = 0;
    h->open = 0;
}

static void ss_gc_start(GCHook *h, PyObject *info) {
    if (h->open == 1) ss_gc_release_open(h);  /* a stop never came (cannot happen) */
    h->open = 2;
    if (!h->active) return;
    if ((size_t)(h->ev_head - h->ev_tail) >= h->n_events ||
        (size_t)(h->fr_head - h->fr_tail) >= h->n_frames) {
        h->dropped++;
        return;
    }
    int gen = 0;
    PyObject *g = PyDict_Check(info) ? PyDict_GetItemWithError(info, ss_gc_generation_key) : NULL;
    if (g != NULL && PyLong_Check(g)) gen = (int)PyLong_AsLong(g);
    if (gen < 0 || gen >= SS_GC_GENERATIONS) gen = SS_GC_GENERATIONS - 1;
    PyErr_Clear();
    PyThreadState *ts = PyThreadState_Get();
    h->open = 1;
    h->open_ts = ts;
    h->open_ident = ts->thread_id;
    h->open_gen = gen;
    h->open_depth = ss_gc_read_stack(h, ts, &h->open_base);
    h->open_cpu = h->last_wall[gen] < 0 || h->last_wall[gen] >= h->cpu_above_ns
        ? ss_clock_ns(CLOCK_THREAD_CPUTIME_ID) : -1;
    h->open_wall = ss_clock_ns(CLOCK_MONOTONIC);  /* last: the stack walk is the hook's */
}

static void ss_gc_stop(GCHook *h) {
    if (h->open != 1) {
        h->open = 0;
        return;
    }
    int64_t end = ss_clock_ns(CLOCK_MONOTONIC);
    int64_t cpu = h->open_cpu >= 0 ? ss_clock_ns(CLOCK_THREAD_CPUTIME_ID) : -1;
    PyThreadState *ts = PyThreadState_Get();
    if (ts != h->open_ts || !h->active) {  /* not this thread's (cannot happen), or paused */
        ss_gc_release_open(h);
        return;
    }
    int64_t wall = end - h->open_wall;
    if (wall < 0) wall = 0;
    int gen = h->open_gen;
    h->last_wall[gen] = wall;
    int64_t charged;
    if (h->open_cpu >= 0 && cpu >= 0) {
        /* no more than the wall time it spans: the CPU clock's reads bracket the wall
         * clock's, and the kernel charges the thread the interrupts it serves
         * between them (no IRQ time accounting: 420 us for a 98 us collection, on a
         * loaded VM) */
        charged = cpu - h->open_cpu;
        if (charged < 0) charged = 0;
        if (charged > wall) charged = wall;
    } else {
        charged = wall < h->cpu_above_ns ? wall : h->cpu_above_ns;
    }
    ss_gc_event *ev = &h->events[h->ev_head & (h->n_events - 1)];
    ev->ident = ts->thread_id;
    ev->generation = gen;
    ev->end_ns = end - h->origin_ns;
    ev->wall_ns = wall;
    ev->cpu_ns = charged;
    ev->first = h->fr_head;
    ev->depth = h->open_depth;
    ev->base = h->open_base;
    h->fr_head += h->open_depth;
    h->ev_head++;
    h->collections++;
    h->open_depth = 0;
    h->open = 0;
}

/* hook(phase, info): what gc.callbacks calls. Never raises: a collection must not
 * fail because of it. */
static PyObject *GCHook_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    GCHook *h = (GCHook *)self;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (n >= 2 && kwnames == NULL && PyUnicode_Check(args[0]) && PyUnicode_GET_LENGTH(args[0]) >= 3) {
        Py_UCS4 c = PyUnicode_READ_CHAR(args[0], 2);  /* st'a'rt, st'o'p */
        if (c == 'a') {
            ss_gc_start(h, args[1]);
        } else if (c == 'o') {
            ss_gc_stop(h);
        }
    }
    Py_RETURN_NONE;
}

static size_t ss_gc_pow2(long long n) {
    size_t p = 1;
    while ((long long)p < n && p < ((size_t)1 << 40)) p <<= 1;
    return p;
}

static int GCHook_init(GCHook *h, PyObject *args, PyObject *kw) {
    static char *names[] = {"origin_ns", "max_events", "max_frames", "cpu_above_ns", NULL};
    long long origin = 0, n_events = 100000, n_frames = 1 << 20, above = 100000;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L|LLL", names, &origin, &n_events, &n_frames, &above))
        return -1;
    if (n_events < 1 || n_frames < 1 || above < 0) {
        PyErr_SetString(PyExc_ValueError, "GCHook: max_events and max_frames must be >= 1, cpu_above_ns >= 0");
        return -1;
    }
    if (h->events != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "GCHook is initialised once");
        return -1;
    }
    h->n_events = ss_gc_pow2(n_events);
    h->n_frames = ss_gc_pow2(n_frames);
    h->events = PyMem_RawCalloc(h->n_events, sizeof(ss_gc_event));
    h->frames = PyMem_RawCalloc(h->n_frames, sizeof(ss_gc_frame));
    if (h->events == NULL || h->frames == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    h->origin_ns = origin;
    h->cpu_above_ns = above;
    for (int g = 0; g < SS_GC_GENERATIONS; g++) h->last_wall[g] = -1;
    h->vectorcall = GCHook_vectorcall;
    return 0;
}

static uint64_t ss_gc_frames_hash(const GCHook *h, const ss_gc_event *ev) {
    uint64_t x = 1469598103934665603ULL;
    for (uint32_t i = 0; i < ev->depth; i++) {
        const ss_gc_frame *slot = &h->frames[(ev->first + i) & (h->n_frames - 1)];
        x = (x ^ (uint64_t)(uintptr_t)slot->code) * 1099511628211ULL;
        x = (x ^ (uint64_t)(uint32_t)slot->lasti) * 1099511628211ULL;
    }
    return x;
}

/* The tuple take() gave an earlier event with the very frames of ev (the same code
 * objects, by address, at the same offsets), new reference; NULL if none. The
 * memo's tuples hold their codes, so an address in one is that code's still. */
static PyObject *ss_gc_memo_find(GCHook *h, const ss_gc_event *ev, uint64_t hash) {
    for (unsigned m = 0; m < SS_GC_MEMO; m++) {
        ss_gc_stack_memo *e = &h->memo[m];
        if (e->stack == NULL || e->hash != hash || e->depth != ev->depth) continue;
        uint32_t i = 0;
        for (; i < ev->depth; i++) {
            const ss_gc_frame *slot = &h->frames[(ev->first + i) & (h->n_frames - 1)];
            PyObject *pair = PyTuple_GET_ITEM(e->stack, i);
            if (PyTuple_GET_ITEM(pair, 0) != slot->code) break;
            long lasti = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
            if (lasti != (long)slot->lasti) break;
        }
        if (i == ev->depth) {
            Py_INCREF(e->stack);
            return e->stack;
        }
    }
    PyErr_Clear();  /* (PyLong_AsLong of a small int never fails) */
    return NULL;
}

static void ss_gc_memo_keep(GCHook *h, PyObject *stack, uint64_t hash, uint32_t depth) {
    ss_gc_stack_memo *e = &h->memo[h->memo_next++ % SS_GC_MEMO];
    Py_INCREF(stack);
    Py_XSETREF(e->stack, stack);
    e->hash = hash;
    e->depth = depth;
}

static void ss_gc_memo_clear(GCHook *h) {
    for (unsigned m = 0; m < SS_GC_MEMO; m++) Py_CLEAR(h->memo[m].stack);
}

/* take(until_us=None) -> [(ident, ((code, lasti), ...), generation, end_us, wall_us,
 * cpu_us, base), ...]: the events that ended at or before until_us, oldest first.
 * No more than were committed when it began: each event taken allocates, and where
 * a collection follows every allocation (gc.set_threshold(1)) each allocation
 * commits another event from this very thread, so a loop until the ring is empty
 * need never end (the Python twin's did, and its list reached 17 GB in a test). */
static PyObject *GCHook_take(GCHook *h, PyObject *const *args, Py_ssize_t nargs) {
    int64_t until = INT64_MAX;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "take() takes at most one argument");
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        long long u = PyLong_AsLongLong(args[0]);
        if (u == -1 && PyErr_Occurred()) return NULL;
        until = (int64_t)u;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL || h->events == NULL) return out;
    const uint64_t head = h->ev_head;
    while (h->ev_tail != head) {
        ss_gc_event *ev = &h->events[h->ev_tail & (h->n_events - 1)];
        int64_t end_us = ev->end_ns / 1000;
        if (end_us > until) break;
        uint64_t hash = ss_gc_frames_hash(h, ev);
        PyObject *stack = ss_gc_memo_find(h, ev, hash);
        if (stack == NULL) {
            stack = PyTuple_New(ev->depth);
            if (stack == NULL) goto fail;
            for (uint32_t i = 0; i < ev->depth; i++) {
                ss_gc_frame *slot = &h->frames[(ev->first + i) & (h->n_frames - 1)];
                PyObject *pair = Py_BuildValue("(Oi)", slot->code, (int)slot->lasti);
                if (pair == NULL) {
                    Py_DECREF(stack);
                    goto fail;
                }
                PyTuple_SET_ITEM(stack, i, pair);
            }
            ss_gc_memo_keep(h, stack, hash, ev->depth);
        }
        PyObject *item = Py_BuildValue("(kNiLLLK)", ev->ident, stack, ev->generation, (long long)end_us,
                                       (long long)(ev->wall_ns / 1000), (long long)(ev->cpu_ns / 1000),
                                       (unsigned long long)ev->base);
        if (item == NULL || PyList_Append(out, item) != 0) {
            Py_XDECREF(item);
            goto fail;
        }
        Py_DECREF(item);
        for (uint32_t i = 0; i < ev->depth; i++)
            Py_CLEAR(h->frames[(ev->first + i) & (h->n_frames - 1)].code);
        h->fr_tail = ev->first + ev->depth;
        h->ev_tail++;
    }
    ss_gc_memo_clear(h);
    return out;
fail:
    ss_gc_memo_clear(h);
    Py_DECREF(out);
    return NULL;
}

/* clear(): drop every event not taken, and a collection under way. */
static PyObject *GCHook_clear(GCHook *h, PyObject *unused) {
    if (h->events == NULL) Py_RETURN_NONE;
    if (h->open == 1) ss_gc_release_open(h);
    h->open = 0;
    while (h->ev_tail != h->ev_head) {
        ss_gc_event *ev = &h->events[h->ev_tail & (h->n_events - 1)];
        for (uint32_t i = 0; i < ev->depth; i++)
            Py_CLEAR(h->frames[(ev->first + i) & (h->n_frames - 1)].code);
        h->fr_tail = ev->first + ev->depth;
        h->ev_tail++;
    }
    Py_RETURN_NONE;
}

static PyObject *GCHook_pending(GCHook *h, void *closure) {
    return PyLong_FromUnsignedLongLong((unsigned long long)(h->ev_head - h->ev_tail));
}

/* The collection under way, if recorded: (its thread's ident, when it began, in
 * microseconds since the origin); else None. Read under the GIL by the engines,
 * which hold a thread's samples while it is inside a collection: finalizers that
 * run Python let the GIL go mid-collection (sampler.gctime). */
static PyObject *GCHook_opened(GCHook *h, void *closure) {
    if (h->open != 1) Py_RETURN_NONE;
    return Py_BuildValue("(kL)", h->open_ident, (long long)((h->open_wall - h->origin_ns) / 1000));
}

static PyObject *GCHook_get_active(GCHook *h, void *closure) {
    return PyBool_FromLong(h->active);
}

static int GCHook_set_active(GCHook *h, PyObject *value, void *closure) {
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "active cannot be deleted");
        return -1;
    }
    int on = PyObject_IsTrue(value);
    if (on < 0) return -1;
    h->active = on;
    return 0;
}

static void GCHook_dealloc(GCHook *h) {
    if (h->events != NULL) {
        PyObject *r = GCHook_clear(h, NULL);
        Py_XDECREF(r);
    }
    PyMem_RawFree(h->events);
    PyMem_RawFree(h->frames);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyMethodDef GCHook_methods[] = {
    {"take", (PyCFunction)(void (*)(void))GCHook_take, METH_FASTCALL,
     "take(until_us=None) -> the collections that ended by until_us, oldest first"},
    {"clear", (PyCFunction)GCHook_clear, METH_NOARGS, "Drop every collection not taken."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef GCHook_members[] = {
    {"collections", T_ULONGLONG, offsetof(GCHook, collections), READONLY, "Collections recorded."},
    {"dropped", T_ULONGLONG, offsetof(GCHook, dropped), READONLY, "Collections dropped: the rings were full."},
    {"max_events", T_PYSSIZET, offsetof(GCHook, n_events), READONLY, "Events the ring holds."},
    {"max_frames", T_PYSSIZET, offsetof(GCHook, n_frames), READONLY, "Frames the ring holds."},
    {"cpu_above_ns", T_LONGLONG, offsetof(GCHook, cpu_above_ns), READONLY,
     "A generation's collections read the CPU clock after one at least this long."},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef GCHook_getset[] = {
    {"active", (getter)GCHook_get_active, (setter)GCHook_set_active, "Whether collections are recorded.", NULL},
    {"pending", (getter)GCHook_pending, NULL, "Events not taken yet.", NULL},
    {"opened", (getter)GCHook_opened, NULL,
     "The collection under way, if recorded: (thread ident, start in us since the origin); else None.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GCHookType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sampler._native.GCHook",
    .tp_doc = "GCHook(origin_ns, max_events=100000, max_frames=1<<20, cpu_above_ns=100000): "
              "a gc.callbacks hook timing every collection (see sampler.gctime).",
    .tp_basicsize = sizeof(GCHook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(GCHook, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)GCHook_init,
    .tp_dealloc = (destructor)GCHook_dealloc,
    .tp_methods = GCHook_methods,
    .tp_members = GCHook_members,
    .tp_getset = GCHook_getset,
};

/* Called once from the module's init: the type, ready, added to module m. */
static int ss_gc_add_type(PyObject *m) {
    ss_gc_generation_key = PyUnicode_InternFromString("generation");
    if (ss_gc_generation_key == NULL || PyType_Ready(&GCHookType) < 0) return -1;
    Py_INCREF(&GCHookType);
    if (PyModule_AddObject(m, "GCHook", (PyObject *)&GCHookType) < 0) {
        Py_DECREF(&GCHookType);
        return -1;
    }
    PyModule_AddIntConstant(m, "GC_MAX_DEPTH", SS_GC_MAX_DEPTH);
    return 0;
}

#endif
