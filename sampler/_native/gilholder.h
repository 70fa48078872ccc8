/* Whether a given thread holds the GIL, read by the collector without the GIL.
 *
 * A thread that is neither on a core nor asleep has either been preempted where it
 * was running (on a busy machine, anywhere, holding the GIL or not) or stopped
 * where it handed the GIL over (at an eval-breaker check, right after a long C
 * call that kept it). Only the second is placed by the interpreter rather than by
 * the clock, and only a thread that does not hold the GIL can be in it: a thread
 * preempted inside a GIL-holding C call, found during the feeder's turn, was taken
 * for one parked by the hand-off, and its CPU filed where it had last run (3.11,
 * under load: up to 7% of a regex match's time went to the lines around it).
 *
 * The interpreter's GIL state (last holder, locked) comes from CPython's internal
 * headers: _PyRuntime.ceval.gil before 3.12, the interpreter's ceval.gil after
 * (fixed once the interpreter runs). Both words are written atomically by the
 * holder; a stale read only means this one sample is placed by the older rule.
 */
#ifndef STACKSHOT_GILHOLDER_H
#define STACKSHOT_GILHOLDER_H

#include <Python.h>
#include <stdint.h>

#ifndef Py_BUILD_CORE
#  define Py_BUILD_CORE 1
#  define STACKSHOT_GILHOLDER_BUILD_CORE
#endif
/* (Python.h, included without Py_BUILD_CORE, made this a macro that pycore_gc.h
 * defines again: as a function on 3.12) */
#undef _PyGC_FINALIZED
#if PY_VERSION_HEX >= 0x030C0000
#  include <internal/pycore_interp.h>
#else
#  include <internal/pycore_runtime.h>
#endif
#ifdef STACKSHOT_GILHOLDER_BUILD_CORE
#  undef Py_BUILD_CORE
#  undef STACKSHOT_GILHOLDER_BUILD_CORE
#endif

static struct _gil_runtime_state *ss_gil = NULL;

/* Find the main interpreter's GIL (the caller holds it). */
static void ss_gil_find(void) {
#if PY_VERSION_HEX >= 0x030C0000
    ss_gil = PyInterpreterState_Main()->ceval.gil;
#else
    ss_gil = &_PyRuntime.ceval.gil;
#endif
}

/* 1: thread state `tstate` holds the GIL now; 0: it does not; -1: unknown. */
static inline int ss_gil_held_by(uintptr_t tstate) {
    struct _gil_runtime_state *g = ss_gil;
    if (g == NULL) return -1;
    int locked = __atomic_load_n((int *)&g->locked, __ATOMIC_ACQUIRE);
    uintptr_t holder = __atomic_load_n((uintptr_t *)&g->last_holder, __ATOMIC_RELAXED);
    return locked && holder == tstate;
}

#endif
