/* A clock's reading in nanoseconds, for every part of the extension that reads one
 * (the collector, the GC hook, the switch hook's clock): -1 where it cannot be read. */
#ifndef STACKSHOT_NSCLOCK_H
#define STACKSHOT_NSCLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t ss_clock_ns(clockid_t clock) {
    struct timespec ts;
    if (clock_gettime(clock, &ts) != 0) return -1;
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
