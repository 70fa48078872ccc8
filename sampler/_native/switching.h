/* The threads that switch greenlets, as the collector needs to know them.
 *
 * The collector files a stretch of samples that show one stack as its last sample
 * alone (engine.c, file_read). In a thread that switches greenlets, the same stack at
 * two ticks can be the gevent hub's loop, waiting again after other greenlets ran in
 * between: the interval's switches must stay with it (sampler/greenlets.py logs
 * them, and the filing splits the thread's time there). So a thread's samples are
 * never coalesced from its first switch on. The greenlet switch hook tells this
 * module of each thread's first switch (under the GIL, before the switch completes);
 * the collector reads the list without the GIL. Threads are known by their thread
 * state's number (PyThreadState.id), which the interpreter never gives twice: an
 * ident or an address is reused by a later thread, which would then keep every
 * sample too. Numbers are only added; past the list's room (that many threads
 * that switched greenlets, ended or not), every thread counts as switching.
 */
#ifndef STACKSHOT_SWITCHING_H
#define STACKSHOT_SWITCHING_H

#include <Python.h>

#define SS_SWITCHING_MAX 256

static uint64_t ss_switching[SS_SWITCHING_MAX];
static int ss_n_switching;  /* entries published (atomic); SS_SWITCHING_MAX + 1: all */

/* Whether the thread whose state has number `state_id` has switched greenlets
 * (collector side, no GIL). */
static inline int ss_switches_greenlets(uint64_t state_id) {
    int n = __atomic_load_n(&ss_n_switching, __ATOMIC_ACQUIRE);
    if (n > SS_SWITCHING_MAX) return 1;
    for (int i = 0; i < n; i++)
        if (ss_switching[i] == state_id) return 1;
    return 0;
}

/* note_switching(): the calling thread switches greenlets (under the GIL: one writer
 * at a time). */
static PyObject *ss_note_switching(PyObject *module, PyObject *unused) {
    (void)module;
    (void)unused;
    uint64_t state_id = PyThreadState_Get()->id;
    int n = __atomic_load_n(&ss_n_switching, __ATOMIC_RELAXED);
    if (n > SS_SWITCHING_MAX || ss_switches_greenlets(state_id)) Py_RETURN_NONE;
    if (n == SS_SWITCHING_MAX) {
        __atomic_store_n(&ss_n_switching, SS_SWITCHING_MAX + 1, __ATOMIC_RELEASE);
        Py_RETURN_NONE;
    }
    ss_switching[n] = state_id;
    __atomic_store_n(&ss_n_switching, n + 1, __ATOMIC_RELEASE);  /* the entry first, then its count */
    Py_RETURN_NONE;
}

#define SS_SWITCHING_METHODS \
    {"note_switching", ss_note_switching, METH_NOARGS, \
     "note_switching(): the calling thread switches greenlets (its samples are never coalesced)"},

#endif
