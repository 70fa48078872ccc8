/* Noticing new threads without the GIL.
 *
 * The interpreter puts each new thread state at the head of its list, and numbers
 * thread states in the order they are made (PyThreadState.id, 3.10-3.13). A thread
 * started from Python gets its state before it runs; the state gets the thread's
 * ident when the thread starts, and a frame when it first calls Python code. So what
 * the head holds changes at each of those steps of the newest thread: the collector
 * reads it each tick and wakes the feeder, instead of the feeder looking for new
 * threads with the GIL every few milliseconds (each look costs the program a GIL
 * hand-off both ways). The head can be freed between the reads (its thread exits):
 * the reads are fault-safe, and garbage read from reused memory only wakes the feeder
 * once for nothing. The head changes too when the newest thread exits: a wake for
 * nothing as well.
 */
#ifndef STACKSHOT_THREADWATCH_H
#define STACKSHOT_THREADWATCH_H

#include "pyframes.h"

/* What the newest thread state of `interp` is: its id, its thread's ident and
 * whether it has a frame, mixed into one number (0: no state, or not readable). A
 * plain read of the head pointer (the interpreter outlives the collector), then a
 * fault-safe read of the state. Also its address (`*head_out`, 0 when not readable)
 * and whether it has a frame (`*framed`): running Python code. */
static inline uint64_t ss_newest_thread(ss_reader *r, PyInterpreterState *interp, uintptr_t *head_out,
                                        int *framed, uint64_t *state_id) {
    PyThreadState *head = PyInterpreterState_ThreadHead(interp);
    ss_tstate_view view;
    *head_out = 0;
    *framed = 0;
    *state_id = 0;
    if (head == NULL || ss_read_tstate(r, (uintptr_t)head, &view) != 0) return 0;
    *head_out = (uintptr_t)head;
    *framed = view.top != 0;
    *state_id = view.id;
    return (view.id * 2 + (view.top != 0)) ^ ((uint64_t)view.thread_id * 0x9E3779B97F4A7C15ULL);
}

#endif
