/* Per-thread mark stacks: where the native collector finds marks without the GIL.
 *
 * `with sampler.mark(key, value):` pushes (frame address, entry id) on the calling
 * thread's stack here and pops it on exit; the collector, walking that thread's
 * frames, keeps the entries whose frame is on the stack it read, so a sample carries
 * exactly the marks of its own frames. The stacks are per-thread-state records
 * (threadrecords.h), never freed, so the collector reads them with plain loads; a
 * sequence counter, odd while the owner writes, tells it to read again.
 */
#ifndef STACKSHOT_MARKSTACKS_H
#define STACKSHOT_MARKSTACKS_H

#include <stdint.h>

#include "threadrecords.h"

#define SS_MAX_MARKS 64

typedef struct {
    uintptr_t frame;  /* the marked frame's address, as the walker reports it */
    uint32_t entry;   /* the mark's id in sampler.marks */
} ss_mark;

typedef struct ss_markstack {
    ss_thread_record record;   /* first: the owner's thread state, the list */
    uint32_t seq;              /* odd while the owner writes */
    uint32_t depth;            /* entries in use (may exceed SS_MAX_MARKS: overflow) */
    ss_mark marks[SS_MAX_MARKS];
} ss_markstack;

static ss_thread_records ss_markstacks = SS_THREAD_RECORDS_INIT;

/* The stack of the thread with this thread state, NULL when it never marked. */
static ss_markstack *ss_markstack_find(uintptr_t tstate) {
    return (ss_markstack *)ss_records_find(&ss_markstacks, tstate);
}

/* The calling thread's stack (it holds the GIL), created on first use. */
static ss_markstack *ss_markstack_of(uintptr_t tstate) {
    return (ss_markstack *)ss_records_get(&ss_markstacks, tstate, sizeof(ss_markstack));
}

static inline void ss_markstack_begin(ss_markstack *s) {
    __atomic_add_fetch(&s->seq, 1, __ATOMIC_ACQ_REL);
}

static inline void ss_markstack_end(ss_markstack *s) {
    __atomic_add_fetch(&s->seq, 1, __ATOMIC_RELEASE);
}

static inline void ss_mark_set(ss_markstack *s, uint32_t i, uintptr_t frame, uint32_t entry) {
    __atomic_store_n(&s->marks[i].frame, frame, __ATOMIC_RELAXED);
    __atomic_store_n(&s->marks[i].entry, entry, __ATOMIC_RELAXED);
}

static void ss_mark_push(ss_markstack *s, uintptr_t frame, uint32_t entry) {
    ss_markstack_begin(s);
    if (s->depth < SS_MAX_MARKS) ss_mark_set(s, s->depth, frame, entry);
    __atomic_store_n(&s->depth, s->depth + 1, __ATOMIC_RELAXED);
    ss_markstack_end(s);
}

/* Remove the entry (searching from the top: a generator's mark may sit under marks
 * pushed after it yielded). Returns 0 when found. */
static int ss_mark_remove(ss_markstack *s, uint32_t entry) {
    uint32_t n = s->depth < SS_MAX_MARKS ? s->depth : SS_MAX_MARKS;
    if (s->depth > SS_MAX_MARKS) {  /* the overflowed entries were never stored */
        ss_markstack_begin(s);
        __atomic_store_n(&s->depth, s->depth - 1, __ATOMIC_RELAXED);
        ss_markstack_end(s);
        return 0;
    }
    for (uint32_t i = n; i-- > 0;) {
        if (s->marks[i].entry == entry) {
            ss_markstack_begin(s);
            for (uint32_t j = i; j + 1 < n; j++) ss_mark_set(s, j, s->marks[j + 1].frame, s->marks[j + 1].entry);
            __atomic_store_n(&s->depth, s->depth - 1, __ATOMIC_RELAXED);
            ss_markstack_end(s);
            return 0;
        }
    }
    return -1;
}

/* Its sequence counter (collector side): the same even value before and after a read
 * of the thread's frames means no mark was entered or left meanwhile. */
static inline uint32_t ss_markstack_seq(const ss_markstack *s) {
    return s ? __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE) : 0;
}

/* Copy the stack (collector side, no GIL) if its counter still reads `expected`.
 * Returns the number of entries copied, or -1 when the owner wrote since (or writes
 * now): the frames read under `expected` and these marks would not belong together. */
static int ss_markstack_copy(const ss_markstack *s, uint32_t expected, ss_mark *out) {
    if (s == NULL) return 0;
    if (expected & 1) return -1;
    uint32_t n = __atomic_load_n(&s->depth, __ATOMIC_RELAXED);
    if (n > SS_MAX_MARKS) n = SS_MAX_MARKS;
    for (uint32_t i = 0; i < n; i++) {
        out[i].frame = __atomic_load_n(&s->marks[i].frame, __ATOMIC_RELAXED);
        out[i].entry = __atomic_load_n(&s->marks[i].entry, __ATOMIC_RELAXED);
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(&s->seq, __ATOMIC_RELAXED) != expected) return -1;
    return (int)n;
}

#endif
