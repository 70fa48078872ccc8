/* The thread's CPU clock at a greenlet switch, without a system call where it can be
 * known without one.
 *
 * The switch hook (switchhook.h) logs the thread's CPU clock at every switch, so that
 * the filing knows what each greenlet used between two samples. Linux has no vDSO for
 * CLOCK_THREAD_CPUTIME_ID: each reading is a system call (0.6 us on the virtual
 * machines measured, four tenths of the hook's cost, against 24 ns for
 * CLOCK_MONOTONIC, which the hook reads anyway). A chatty gevent server switches 50,000
 * times a second and more.
 *
 * Between two moments at which the thread was never off its CPU, its CPU clock moves
 * as the wall clock does. The kernel says when a thread was put back on a CPU: on
 * every schedule-in it bumps the `lock` sequence of the user page of each perf event
 * the thread has open (perf_event_mmap_page), a plain memory read for the thread. So
 * each thread opens one software event that counts nothing (PERF_COUNT_SW_DUMMY, user
 * space only, itself only: allowed at perf_event_paranoid 2, Linux's default) and maps
 * its page. At a switch, if the lock has not moved since the last reading of the real
 * clock (the anchor) and the wall clock has moved little, the CPU clock is the
 * anchor's plus the wall clock's progress; otherwise it is read, and becomes the anchor.
 *
 * Nearly every schedule-in: one nap in 24 of a test's run went unmarked once (CI,
 * 3.13), which the wall-time limit below catches (a nap is a turn over 100 us).
 *
 * Where the two clocks part without a rescheduling: a virtual machine's host that
 * stops the virtual CPU (steal time, left out of the thread's CPU clock). Measured
 * here, about 20 such stops a second, from a few microseconds to 3 ms, and none
 * between (the two clocks agreed to within the cost of reading them). So the real clock
 * is read at a switch after more than SS_CLOCK_TURN_NS of wall time since the last
 * reading (a stop that long falls in the turn, and is seen), and at least every
 * SS_CLOCK_ANCHOR_NS (what shorter stops add up to is never carried further). The
 * clock logged never goes back (an estimate a stop made too large is not undone).
 *
 * Where the event cannot be opened (perf_event_paranoid 3, a seccomp profile that
 * refuses perf_event_open as Docker's does, no perf events in the kernel), or the
 * kernel is found not to bump the lock (checked once per thread, across naps),
 * every switch reads the clock as before. After a fork, the child's copy of the page
 * is its parent thread's, and its thread's clock starts from zero: a hook that finds
 * the process forked since it last started starts over (and opens an event of its
 * own). A hook called from another thread than its own reads the clock.
 */
#ifndef STACKSHOT_SWITCHCLOCK_H
#define STACKSHOT_SWITCHCLOCK_H

#include <Python.h>
#include <errno.h>
#include "nsclock.h"
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <linux/perf_event.h>  /* (the extension is built on Linux only: setup.py) */
#include <sys/mman.h>
#include <sys/syscall.h>

#define SS_CLOCK_TURN_NS 100000LL   /* 100 us */
#define SS_CLOCK_ANCHOR_NS 1000000LL  /* 1 ms */
/* (each clock's own limits start at these: the tests widen them, to see what the lock
 * alone tells) */

enum { SS_CLOCK_UNTRIED = 0, SS_CLOCK_ESTIMATES = 1, SS_CLOCK_READS = -1 };

typedef struct {
    int state;          /* SS_CLOCK_*: whether it estimates, or reads each time */
    int error;          /* why it reads each time: the errno met (0: it was told to) */
    int fd;             /* the perf event's (open only while `page` is mapped) */
    void *page;         /* its user page (NULL: none) */
    unsigned long generation;  /* ss_fork_generation when last reset */
    pthread_t owner;    /* the thread whose event it is */
    uint32_t lock;      /* the page's lock at the anchor */
    long long anchor_wall, anchor_cpu;  /* the last real reading, ns */
    long long last_wall, last_cpu;      /* the last clock given, ns */
    long long turn_ns, anchor_ns;       /* SS_CLOCK_TURN_NS, SS_CLOCK_ANCHOR_NS */
    unsigned long long reads, estimates;
} ss_switchclock;

/* Forks seen (bumped in the child, by pthread_atfork: no Python runs there first). */
static unsigned long ss_fork_generation;

static void ss_switchclock_forked(void) { ss_fork_generation++; }

static void ss_switchclock_close(ss_switchclock *c) {
    if (c->page != NULL) {
        munmap(c->page, (size_t)sysconf(_SC_PAGESIZE));
        close(c->fd);
    }
    c->page = NULL;
}

/* Start over: a new hook (zeroed), or one in a forked child, whose thread's CPU clock
 * starts from zero and whose page is its parent thread's. */
static void ss_switchclock_reset(ss_switchclock *c) {
    ss_switchclock_close(c);
    c->state = SS_CLOCK_UNTRIED;
    c->anchor_wall = c->anchor_cpu = c->last_wall = c->last_cpu = 0;
    c->generation = ss_fork_generation;
}

static inline uint32_t ss_page_lock(void *page) {
    return __atomic_load_n(&((struct perf_event_mmap_page *)page)->lock, __ATOMIC_ACQUIRE);
}

/* Open the calling thread's event and check that the kernel bumps its lock across a
 * nap (called with the GIL held: let go for the nap); on failure, the clock reads
 * each time, and `error` says why. */
static void ss_switchclock_open(ss_switchclock *c) {
    c->state = SS_CLOCK_READS;
    struct perf_event_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_DUMMY;
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    int fd = (int)syscall(SYS_perf_event_open, &attr, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
    if (fd < 0) {
        c->error = errno;
        return;
    }
    void *page = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE), PROT_READ, MAP_SHARED, fd, 0);
    if (page == MAP_FAILED) {
        c->error = errno;
        close(fd);
        return;
    }
    /* (a short sleep need not switch: the timer can expire before the thread is off
     * its CPU, and the scheduler then picks it again; 1 us missed once in some 50
     * threads. A nap of 100 us, up to three times, costs a thread at most 0.3 ms once,
     * with the GIL let go: the other threads run meanwhile.) */
    uint32_t before = ss_page_lock(page);
    struct timespec nap = {0, 100000};
    Py_BEGIN_ALLOW_THREADS
    for (int tries = 0; tries < 3 && ss_page_lock(page) == before; tries++) nanosleep(&nap, NULL);
    Py_END_ALLOW_THREADS
    if (ss_page_lock(page) == before) {  /* the kernel does not say: no estimates */
        c->error = EOPNOTSUPP;
        munmap(page, (size_t)sysconf(_SC_PAGESIZE));
        close(fd);
        return;
    }
    c->fd = fd;
    c->page = page;
    c->owner = pthread_self();
    c->state = SS_CLOCK_ESTIMATES;
    c->error = 0;
}

/* The thread's CPU clock (ns) at a switch whose wall clock (CLOCK_MONOTONIC) read
 * `wall` just before: estimated, or read (see above). Never less than the last. */
static long long ss_switchclock_cpu(ss_switchclock *c, long long wall) {
    if (c->generation != ss_fork_generation) ss_switchclock_reset(c);
    if (c->state == SS_CLOCK_UNTRIED) ss_switchclock_open(c);
    int mine = c->state == SS_CLOCK_ESTIMATES && pthread_equal(c->owner, pthread_self());
    if (mine) {
        uint32_t lock = ss_page_lock(c->page);  /* (read after `wall`) */
        if (lock == c->lock && wall >= c->last_wall && wall - c->last_wall <= c->turn_ns
            && wall - c->anchor_wall <= c->anchor_ns) {
            long long cpu = c->anchor_cpu + (wall - c->anchor_wall);
            if (cpu < c->last_cpu) cpu = c->last_cpu;
            c->last_wall = wall;
            c->last_cpu = cpu;
            c->estimates++;
            return cpu;
        }
    }
    /* The anchor: the lock first, then the clocks, so that a rescheduling in between
     * leaves the lock moved at the next switch (which then reads again). */
    uint32_t lock = mine ? ss_page_lock(c->page) : 1;
    long long cpu = ss_clock_ns(CLOCK_THREAD_CPUTIME_ID);
    c->reads++;
    if (mine) {
        c->lock = lock;
        c->anchor_cpu = cpu;
        c->anchor_wall = ss_clock_ns(CLOCK_MONOTONIC);
    }
    if (cpu < c->last_cpu) cpu = c->last_cpu;
    c->last_wall = wall;
    c->last_cpu = cpu;
    return cpu;
}

#endif
