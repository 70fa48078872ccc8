/* Code objects freed, told to the collectors without a lock.
 *
 * A collector remembers what it read at a code object's address (its fingerprint,
 * its frames' size) and which addresses' names it sent to Python. When a code object
 * is freed and another is made at its address, what it remembers is wrong: the new
 * function's samples take the old one's name, or, when the two agree in every
 * fingerprinted field (a module reloaded after an edit, the same function a few
 * lines lower), its line numbers. (Code made with exec and dropped, two functions
 * taking turns at one address: 70 of 382 samples on 3.10 and 104 of 437 on 3.11
 * were named after the other, with each address read again every 10 ms.)
 *
 * So the collectors hear of each code object's destruction: from 3.12 through a code
 * watcher (PyCode_AddWatcher), the interpreter's own way; before, through the code
 * type's deallocator, wrapped. Either runs under the GIL, before the memory is freed,
 * and writes the address into a ring; each collector keeps how far it has read and,
 * after it has read a stack and before it looks up what it remembers of the stack's
 * code objects, forgets the addresses written since. A code object met in a stack
 * was made before the stack was read, and the end of any code object once at its
 * address was written to the ring before that (its destruction comes before its
 * memory is reused), so what a collector remembers is never older than the stack it
 * names. It can be newer: a code object of the stack freed while the stack was read,
 * or after, and another made at its address before the lookup, would name the stack
 * (3.10: a sample of ['alpha', 'run_omega'], the omega read, gone and alpha made in
 * its place by the time its code was looked up). So the collector notes the ring's
 * head before a walk, and a walk with a code object of its own among those freed
 * since is read again.
 *
 * One writer at a time: destructions happen under the GIL, and the module is
 * single-phase (never imported by an interpreter with a GIL of its own). A collector
 * that falls a whole ring behind (a program freeing thousands of code objects
 * between two of its walks, or a long pause) cannot tell which were freed, and
 * forgets everything (ss_dead_codes returns 1).
 */
#ifndef STACKSHOT_CODEWATCH_H
#define STACKSHOT_CODEWATCH_H

#include <Python.h>
#include <stdint.h>

#define SS_DEAD_RING 4096  /* freed code addresses kept for the collectors to read */

/* Told of code object `code`, the index-th freed since the watcher began. */
typedef void (*ss_forget_code)(void *arg, uintptr_t code, uint64_t index);

static uintptr_t ss_dead_ring[SS_DEAD_RING];
static uint64_t ss_dead_head;    /* addresses written so far (atomic) */
static int ss_code_watch_users;  /* engines relying on the watcher (under the GIL) */

/* Under the GIL, as a code object is destroyed. */
static void ss_code_died(PyObject *co) {
    uint64_t h = __atomic_load_n(&ss_dead_head, __ATOMIC_RELAXED);
    /* (release: a collector that reads this entry sees every earlier head) */
    __atomic_store_n(&ss_dead_ring[h & (SS_DEAD_RING - 1)], (uintptr_t)co, __ATOMIC_RELEASE);
    __atomic_store_n(&ss_dead_head, h + 1, __ATOMIC_RELEASE);
}

#if PY_VERSION_HEX >= 0x030C0000
/* 3.12+: a code watcher, the interpreter's own way to hear of it. */
static int ss_code_watcher = -1;

static int ss_on_code_event(PyCodeEvent event, PyCodeObject *co) {
    if (event == PY_CODE_EVENT_DESTROY) ss_code_died((PyObject *)co);
    return 0;
}

static int ss_code_watch_on(void) {
    if (ss_code_watcher >= 0) return 1;
    int id = PyCode_AddWatcher(ss_on_code_event);
    if (id < 0) {  /* (8 per interpreter, shared with other tools) */
        PyErr_Clear();
        return 0;
    }
    ss_code_watcher = id;
    return 1;
}

static void ss_code_watch_off(void) {
    if (ss_code_watcher >= 0 && PyCode_ClearWatcher(ss_code_watcher) == 0) ss_code_watcher = -1;
    PyErr_Clear();
}
#else
/* 3.10, 3.11: no watchers; the code type's deallocator, wrapped. The code type
 * cannot be subclassed, so every code object ends in this slot, and the interpreter
 * reads the slot at each destruction. Taken off, the wrapper gives the slot back only
 * when it is still the slot's: another tool that wrapped it since calls it, and it
 * stays in that chain (it only writes the ring), never put in a second time. */
static destructor ss_code_dealloc_wrapped;  /* what the wrapper calls */
static int ss_code_dealloc_chained;         /* the wrapper is in the slot's chain */

static void ss_code_dealloc(PyObject *co) {
    ss_code_died(co);
    ss_code_dealloc_wrapped(co);
}

static int ss_code_watch_on(void) {
    if (!ss_code_dealloc_chained) {
        ss_code_dealloc_wrapped = PyCode_Type.tp_dealloc;
        PyCode_Type.tp_dealloc = ss_code_dealloc;
        ss_code_dealloc_chained = 1;
    }
    return 1;
}

static void ss_code_watch_off(void) {
    if (ss_code_dealloc_chained && PyCode_Type.tp_dealloc == ss_code_dealloc) {
        PyCode_Type.tp_dealloc = ss_code_dealloc_wrapped;
        ss_code_dealloc_chained = 0;
    }
}
#endif

/* Under the GIL: an engine begins to rely on the watcher, put on by the first.
 * Returns 1 when it is on, setting *seen to where the engine starts reading; 0 when
 * the interpreter has no watcher left to give: the engine then reads code objects
 * again every period. */
static int ss_code_watch_start(uint64_t *seen) {
    if (!ss_code_watch_on()) return 0;
    ss_code_watch_users++;
    *seen = __atomic_load_n(&ss_dead_head, __ATOMIC_ACQUIRE);
    return 1;
}

/* Under the GIL: an engine that relied on the watcher is gone; the last takes it off. */
static void ss_code_watch_stop(void) {
    if (ss_code_watch_users > 0 && --ss_code_watch_users == 0) ss_code_watch_off();
}

/* Collector side, no lock: where the ring's head is now (how many were freed so far). */
static inline uint64_t ss_dead_count(void) {
    return __atomic_load_n(&ss_dead_head, __ATOMIC_ACQUIRE);
}

/* Collector side, no lock: calls forget(arg, address, index) for each code object freed
 * since *seen, and moves *seen on. Returns 1 when some were written over before they
 * were read: the caller must forget every address. */
static inline int ss_dead_codes(uint64_t *seen, ss_forget_code forget, void *arg) {
    /* (acquire: the stack just read was read before the ring is) */
    uint64_t head = __atomic_load_n(&ss_dead_head, __ATOMIC_ACQUIRE);
    uint64_t from = *seen;
    if (head == from) return 0;
    *seen = head;
    if (head - from > SS_DEAD_RING) return 1;
    for (uint64_t i = from; i < head; i++)
        forget(arg, __atomic_load_n(&ss_dead_ring[i & (SS_DEAD_RING - 1)], __ATOMIC_ACQUIRE), i);
    /* the writer may have gone round the ring onto entries while they were read
     * (once it has written the entry after a full ring, which overwrites the first
     * one read, the head is at least a ring on: a full ring is taken as gone round) */
    return __atomic_load_n(&ss_dead_head, __ATOMIC_ACQUIRE) - from >= SS_DEAD_RING;
}

#endif
