/* The greenlet switch hook's common case, in C.
 *
 * sampler/greenlets.py keeps, per OS thread, a greenlet.settrace hook that tells the
 * engines which greenlet runs and logs each switch with the clocks. The hook runs at
 * every switch of a program that may switch hundreds of thousands of times a
 * second, and a Python hook costs a Python call, its body and three calls from it
 * on top of the clock it must read. This type does the common case (a switch to a
 * greenlet the hook knows whole, from one that is known or needs nothing learnt)
 * without a Python frame, and hands every other case, unchanged, to the Python
 * hook's method (`_slow`: the Python twin's __call__, sampler.greenlets.SwitchHook),
 * so both do the same thing by construction: the C one only skips Python where the
 * Python one would do nothing but look things up.
 *
 * The common case, in the order the Python hook does it: the hook is in use
 * (`users`), the event is "switch" or "throw", the thread has switched before
 * (`switched`), the target has a record in `records` (id(greenlet) -> record) that
 * still refers to it, with its outermost frame (`base`) and name (`named`) learnt,
 * and the greenlet switched from needs no base learnt; then `current` becomes the
 * record and (perf_counter_ns(), record, thread_time_ns()) is appended to `log`,
 * both clocks read last, once the hook's work is done (a switch is the switcher's;
 * the CPU clock without a system call where switchclock.h can tell it);
 * then the tracer chained (`previous`) is called. A failure of the hook's own
 * work is swallowed, as in Python (a profiler's trouble never reaches the program);
 * the chained tracer's is the program's and propagates.
 *
 * The lookup itself is cached: a greenlet's record, once whole, stays whole (its base
 * and name are learnt once) and stays its greenlet's entry in `records` for as long
 * as the greenlet lives (sampler.greenlets.record_of replaces an entry only when its
 * greenlet is gone). So the hook keeps, for the last greenlets switched to, the
 * greenlet's address, its whole record and the record's weak reference, and a switch
 * to one of them whose weak reference still names it takes that record without the
 * id's int, the dict and the record's three attributes. Its log entry is built
 * directly and appended through `log.append` looked up once. (A gevent server of 16
 * handlers and 16 clients, some 60,000 switches a second: the hook took about 2,960
 * instructions a switch, callgrind, 4,150 with greenlet's call of it.)
 */
#ifndef STACKSHOT_SWITCHHOOK_H
#define STACKSHOT_SWITCHHOOK_H

#include <Python.h>
#include <structmember.h>
#include <time.h>

#include "switchclock.h"

#define SS_HOOK_KNOWN 64  /* greenlets whose whole record is found without a lookup */

typedef struct {
    PyObject *target;  /* a greenlet's address (compared only: it may be gone) */
    PyObject *rec;     /* its record, whole (a strong reference) */
    PyObject *ref;     /* the record's weak reference to it (strong) */
} ss_hook_known;

typedef struct {
    PyObject_HEAD
    PyObject *previous;  /* the tracer chained (None: none) */
    int users;           /* samplers using the hook (0: inert, passing events on) */
    PyObject *current;   /* the record of the greenlet running (None: not known) */
    PyObject *log;       /* a collections.deque of (perf_counter_ns, record, thread_time_ns) */
    int switched;        /* its thread has switched since the hook was made */
    PyObject *records;   /* sampler.greenlets._records: id(greenlet) -> record */
    unsigned long long slow_calls;  /* events handed to the Python hook */
    int estimate_cpu;    /* the CPU clock may be estimated (switchclock.h); 0: read each time */
    ss_switchclock clock;
    PyObject *known_of;  /* the `records` the known greenlets were found in (strong) */
    PyObject *append;    /* log.append, bound (strong: it holds the log it was looked up on) */
    ss_hook_known known[SS_HOOK_KNOWN];
} ss_switchhook;

static PyObject *ss_str_switch, *ss_str_throw, *ss_str_ref, *ss_str_base, *ss_str_named, *ss_str_slow,
    *ss_str_append;

/* The object a weak reference names now (a new reference; NULL with no error when it
 * is dead). */
static inline PyObject *ss_weak_target(PyObject *ref) {
    if (!PyWeakref_Check(ref)) return NULL;
#if PY_VERSION_HEX >= 0x030D0000
    PyObject *obj = NULL;
    if (PyWeakref_GetRef(ref, &obj) < 0) {
        PyErr_Clear();
        return NULL;
    }
    return obj;
#else
    PyObject *obj = PyWeakref_GetObject(ref);
    if (obj == NULL) {
        PyErr_Clear();
        return NULL;
    }
    if (obj == Py_None) return NULL;
    Py_INCREF(obj);
    return obj;
#endif
}

/* Whether `rec` (a greenlet record) refers to `g`. */
static inline int ss_record_of_is(PyObject *rec, PyObject *g) {
    PyObject *ref = PyObject_GetAttr(rec, ss_str_ref);
    if (ref == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *obj = ss_weak_target(ref);
    Py_DECREF(ref);
    Py_XDECREF(obj);
    return obj == g;
}

/* The truth of attribute `name` of `obj` (-1: not readable). */
static inline int ss_attr_true(PyObject *obj, PyObject *name) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) {
        PyErr_Clear();
        return -1;
    }
    int truth = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (truth < 0) PyErr_Clear();
    return truth;
}

static inline ss_hook_known *ss_known_slot(ss_switchhook *h, PyObject *g) {
    uint64_t x = (uint64_t)(uintptr_t)g * 0x9E3779B97F4A7C15ULL;
    return &h->known[x >> 58];  /* (the top 6 bits: SS_HOOK_KNOWN slots) */
}

/* The whole record of greenlet `g` where the hook knows it (borrowed), else NULL. */
static inline PyObject *ss_known_record(ss_switchhook *h, PyObject *g) {
    ss_hook_known *k = ss_known_slot(h, g);
    if (k->target != g || k->rec == NULL) return NULL;
    PyObject *obj = ss_weak_target(k->ref);
    Py_XDECREF(obj);
    return obj == g ? k->rec : NULL;
}

/* Remember `rec`, the whole record of greenlet `g`. */
static void ss_know(ss_switchhook *h, PyObject *g, PyObject *rec) {
    PyObject *ref = PyObject_GetAttr(rec, ss_str_ref);
    if (ref == NULL) {
        PyErr_Clear();
        return;
    }
    ss_hook_known *k = ss_known_slot(h, g);
    PyObject *old_rec = k->rec, *old_ref = k->ref;
    Py_INCREF(rec);
    k->target = g;
    k->rec = rec;
    k->ref = ref;
    Py_XDECREF(old_rec);  /* (last: freeing them runs no code of the hook's) */
    Py_XDECREF(old_ref);
}

static void ss_forget_known(ss_switchhook *h) {
    for (int i = 0; i < SS_HOOK_KNOWN; i++) {
        h->known[i].target = NULL;
        Py_CLEAR(h->known[i].rec);
        Py_CLEAR(h->known[i].ref);
    }
}

/* The record of `target` looked up in `records` (a new reference) when it is whole:
 * it refers to target, and its base and name are learnt; else NULL, no error. */
static PyObject *ss_whole_record(ss_switchhook *h, PyObject *target) {
    PyObject *key = PyLong_FromVoidPtr(target);  /* (id(target)) */
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *rec = PyDict_GetItemWithError(h->records, key);  /* borrowed */
    Py_DECREF(key);
    if (rec == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_INCREF(rec);
    if (ss_record_of_is(rec, target) && ss_attr_true(rec, ss_str_base) == 1 && ss_attr_true(rec, ss_str_named) == 1)
        return rec;
    Py_DECREF(rec);
    return NULL;
}

/* The common case's work, before the tracer chained: 1 when done, 0 when it is not
 * the common case (the Python hook handles the event), never an error. */
static int ss_switch_fast(ss_switchhook *h, PyObject *event, PyObject *args) {
    if (!h->switched || h->records == NULL || !PyDict_Check(h->records) || h->log == NULL) return 0;
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != 2) return 0;
    PyObject *origin = PyTuple_GET_ITEM(args, 0), *target = PyTuple_GET_ITEM(args, 1);
    if (h->known_of != h->records) {  /* (records found in another dict: none known) */
        ss_forget_known(h);
        Py_INCREF(h->records);
        Py_XSETREF(h->known_of, h->records);
    }
    PyObject *rec = ss_known_record(h, target);
    if (rec != NULL) {
        Py_INCREF(rec);
    } else {
        rec = ss_whole_record(h, target);
        if (rec == NULL) return 0;
        ss_know(h, target, rec);
    }
    /* (the greenlet switched from, if it has no base yet and is the one recorded:
     * the Python hook learns its base now; one the hook knows is whole) */
    PyObject *was = h->current;
    (void)event;
    if (was != NULL && was != Py_None && ss_known_record(h, origin) != was && ss_attr_true(was, ss_str_base) != 1
        && ss_record_of_is(was, origin)) {
        Py_DECREF(rec);
        return 0;
    }
    /* (rec kept by a reference of this function's too until it is logged: making
     * the entry can run a collection, and a finalizer could change `current`) */
    Py_INCREF(rec);
    h->current = rec;  /* (the reference taken above) */
    Py_XDECREF(was);
    long long wall = ss_clock_ns(CLOCK_MONOTONIC);  /* (time.perf_counter_ns's clock on Linux) */
    long long cpu;  /* (time.thread_time_ns's clock) */
    if (h->estimate_cpu) {
        cpu = ss_switchclock_cpu(&h->clock, wall);
    } else {
        cpu = ss_clock_ns(CLOCK_THREAD_CPUTIME_ID);
        h->clock.reads++;
    }
    PyObject *entry = PyTuple_New(3);
    PyObject *wall_v = entry != NULL ? PyLong_FromLongLong(wall) : NULL;
    PyObject *cpu_v = wall_v != NULL ? PyLong_FromLongLong(cpu) : NULL;
    if (cpu_v == NULL) {
        Py_XDECREF(wall_v);
        Py_XDECREF(entry);
        Py_DECREF(rec);
        PyErr_Clear();
        return 1;
    }
    PyTuple_SET_ITEM(entry, 0, wall_v);
    PyTuple_SET_ITEM(entry, 1, rec);  /* (the reference taken for it above) */
    PyTuple_SET_ITEM(entry, 2, cpu_v);
    PyObject *log = h->log;
    PyObject *append = h->append;
    if (log == NULL) {
        Py_DECREF(entry);
        return 1;
    }
    if (append == NULL || PyCFunction_Check(append) == 0 || PyCFunction_GET_SELF(append) != log) {
        append = PyObject_GetAttr(log, ss_str_append);  /* (once per log) */
        if (append == NULL) {
            PyErr_Clear();
            Py_DECREF(entry);
            return 1;
        }
        Py_XSETREF(h->append, append);
    }
    Py_INCREF(append);  /* (kept while it runs: a collection in it could set another log) */
    PyObject *done = PyObject_CallOneArg(append, entry);
    Py_DECREF(append);
    Py_DECREF(entry);
    if (done == NULL) PyErr_Clear();
    Py_XDECREF(done);
    return 1;
}

static PyObject *ss_switchhook_call(ss_switchhook *h, PyObject *call_args, PyObject *kwargs) {
    PyObject *event, *args;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0) {
        PyErr_SetString(PyExc_TypeError, "the switch hook takes (event, args)");
        return NULL;
    }
    if (!PyArg_UnpackTuple(call_args, "SwitchHook", 2, 2, &event, &args)) return NULL;
    if (h->users > 0 && PyUnicode_Check(event)
        && (PyUnicode_Compare(event, ss_str_switch) == 0 || PyUnicode_Compare(event, ss_str_throw) == 0)) {
        if (!ss_switch_fast(h, event, args)) {
            h->slow_calls++;
            return PyObject_CallMethodObjArgs((PyObject *)h, ss_str_slow, event, args, NULL);
        }
    }
    PyObject *previous = h->previous;  /* (kept while it runs: it may replace it) */
    if (previous == NULL || previous == Py_None) Py_RETURN_NONE;
    Py_INCREF(previous);
    PyObject *result = PyObject_Call(previous, call_args, NULL);
    Py_DECREF(previous);
    return result;
}

static int ss_switchhook_traverse(ss_switchhook *h, visitproc visit, void *arg) {
    Py_VISIT(h->previous);
    Py_VISIT(h->current);
    Py_VISIT(h->log);
    Py_VISIT(h->records);
    Py_VISIT(h->known_of);
    Py_VISIT(h->append);
    for (int i = 0; i < SS_HOOK_KNOWN; i++) {
        Py_VISIT(h->known[i].rec);
        Py_VISIT(h->known[i].ref);
    }
    return 0;
}

static int ss_switchhook_clear(ss_switchhook *h) {
    Py_CLEAR(h->previous);
    Py_CLEAR(h->current);
    Py_CLEAR(h->log);
    Py_CLEAR(h->records);
    Py_CLEAR(h->known_of);
    Py_CLEAR(h->append);
    ss_forget_known(h);
    return 0;
}

static void ss_switchhook_dealloc(ss_switchhook *h) {
    PyObject_GC_UnTrack(h);
    ss_switchhook_clear(h);
    ss_switchclock_close(&h->clock);
    Py_TYPE(h)->tp_free((PyObject *)h);
}

static PyMemberDef ss_switchhook_members[] = {
    {"previous", T_OBJECT, offsetof(ss_switchhook, previous), 0, "The tracer chained (None: none)."},
    {"users", T_INT, offsetof(ss_switchhook, users), 0, "Samplers using the hook."},
    {"current", T_OBJECT, offsetof(ss_switchhook, current), 0, "The running greenlet's record."},
    {"log", T_OBJECT, offsetof(ss_switchhook, log), 0, "The switch log (a deque)."},
    {"switched", T_BOOL, offsetof(ss_switchhook, switched), 0, "Its thread has switched greenlets."},
    {"records", T_OBJECT, offsetof(ss_switchhook, records), 0, "id(greenlet) -> its record."},
    {"slow_calls", T_ULONGLONG, offsetof(ss_switchhook, slow_calls), READONLY,
     "Switches handed to the Python hook (all but the common case)."},
    {"estimate_cpu", T_INT, offsetof(ss_switchhook, estimate_cpu), 0,
     "Whether the common case may estimate the CPU clock without a system call (1, as made)."},
    {"clock_turn_ns", T_LONGLONG, offsetof(ss_switchhook, clock.turn_ns), 0,
     "A switch this long (wall ns) after the last reads the clock (switchclock.h)."},
    {"clock_anchor_ns", T_LONGLONG, offsetof(ss_switchhook, clock.anchor_ns), 0,
     "The clock is read at a switch this long (wall ns) after the last reading."},
    {"clock_reads", T_ULONGLONG, offsetof(ss_switchhook, clock.reads), READONLY,
     "CPU clock readings (system calls) of the common case."},
    {"clock_estimates", T_ULONGLONG, offsetof(ss_switchhook, clock.estimates), READONLY,
     "CPU clock values of the common case known without a system call."},
    {NULL, 0, 0, 0, NULL},
};

/* cpu_clock: how the common case knows the CPU clock, and why it reads it each time. */
static PyObject *ss_switchhook_cpu_clock(ss_switchhook *h, void *unused) {
    (void)unused;
    const ss_switchclock *c = &h->clock;
    if (!h->estimate_cpu) return Py_BuildValue("(sO)", "read", Py_None);
    if (c->state == SS_CLOCK_UNTRIED) return Py_BuildValue("(OO)", Py_None, Py_None);
    if (c->state == SS_CLOCK_ESTIMATES) return Py_BuildValue("(sO)", "estimated", Py_None);
    if (c->error == EOPNOTSUPP)
        return Py_BuildValue("(ss)", "read", "perf_event page: the kernel did not mark a rescheduling");
    return Py_BuildValue("(sN)", "read", PyUnicode_FromFormat("perf_event_open: %s", strerror(c->error)));
}

static PyGetSetDef ss_switchhook_getset[] = {
    {"cpu_clock", (getter)ss_switchhook_cpu_clock, NULL,
     "(way, why): 'estimated' between reschedulings, or 'read' at each switch with the reason "
     "(None: told to, by estimate_cpu); (None, None) before its first common-case switch.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *ss_switchhook_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    ss_switchhook *h = (ss_switchhook *)PyType_GenericNew(type, args, kwargs);
    if (h != NULL) {
        h->estimate_cpu = 1;
        ss_switchclock_reset(&h->clock);
        h->clock.turn_ns = SS_CLOCK_TURN_NS;
        h->clock.anchor_ns = SS_CLOCK_ANCHOR_NS;
    }
    return (PyObject *)h;
}

static PyTypeObject ss_switchhook_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.SwitchHook",
    .tp_basicsize = sizeof(ss_switchhook),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The greenlet switch hook's common case in C (see sampler.greenlets.SwitchHook).",
    .tp_new = ss_switchhook_new,
    .tp_call = (ternaryfunc)ss_switchhook_call,
    .tp_traverse = (traverseproc)ss_switchhook_traverse,
    .tp_clear = (inquiry)ss_switchhook_clear,
    .tp_dealloc = (destructor)ss_switchhook_dealloc,
    .tp_members = ss_switchhook_members,
    .tp_getset = ss_switchhook_getset,
};

static int ss_switchhook_add_type(PyObject *m) {
    if (!(ss_str_switch = PyUnicode_InternFromString("switch")) || !(ss_str_throw = PyUnicode_InternFromString("throw"))
        || !(ss_str_ref = PyUnicode_InternFromString("ref")) || !(ss_str_base = PyUnicode_InternFromString("base"))
        || !(ss_str_named = PyUnicode_InternFromString("named"))
        || !(ss_str_slow = PyUnicode_InternFromString("_slow"))
        || !(ss_str_append = PyUnicode_InternFromString("append")))
        return -1;
    if (PyType_Ready(&ss_switchhook_type) < 0) return -1;
    static int forks_watched;
    if (!forks_watched) {
        pthread_atfork(NULL, NULL, ss_switchclock_forked);
        forks_watched = 1;
    }
    Py_INCREF(&ss_switchhook_type);
    if (PyModule_AddObject(m, "SwitchHook", (PyObject *)&ss_switchhook_type) < 0) {
        Py_DECREF(&ss_switchhook_type);
        return -1;
    }
    return 0;
}

#endif
