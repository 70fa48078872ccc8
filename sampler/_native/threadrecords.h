/* Per-thread-state records that the collector finds without the GIL: an append-only
 * list, one record per thread state, never freed (a thread that exits leaves its
 * record to the next thread given the same thread state), so the collector walks it
 * with plain loads while owners append under a mutex. Used by the mark stacks
 * (markstacks.h) and the shadow stacks (shadowstacks.h): each record type starts with
 * an ss_thread_record.
 */
#ifndef STACKSHOT_THREADRECORDS_H
#define STACKSHOT_THREADRECORDS_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct ss_thread_record {
    uintptr_t tstate;               /* the owner's thread state */
    struct ss_thread_record *next;  /* the list, newest first */
} ss_thread_record;

typedef struct {
    ss_thread_record *head;  /* read without a lock (acquire), written under lock */
    pthread_mutex_t lock;
} ss_thread_records;

#define SS_THREAD_RECORDS_INIT {NULL, PTHREAD_MUTEX_INITIALIZER}

/* The record of thread state `tstate`, NULL when it has none (any thread, no GIL). */
static ss_thread_record *ss_records_find(ss_thread_records *list, uintptr_t tstate) {
    for (ss_thread_record *r = __atomic_load_n(&list->head, __ATOMIC_ACQUIRE); r; r = r->next)
        if (r->tstate == tstate) return r;
    return NULL;
}

/* The record of `tstate`, made (zeroed, `size` bytes) and appended when it has none;
 * NULL when out of memory. Only the owner asks for its own record, so no other thread
 * appends the same one meanwhile. */
static ss_thread_record *ss_records_get(ss_thread_records *list, uintptr_t tstate, size_t size) {
    ss_thread_record *r = ss_records_find(list, tstate);
    if (r != NULL) return r;
    r = calloc(1, size);
    if (r == NULL) return NULL;
    r->tstate = tstate;
    pthread_mutex_lock(&list->lock);
    r->next = list->head;
    __atomic_store_n(&list->head, r, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&list->lock);
    return r;
}

#endif
