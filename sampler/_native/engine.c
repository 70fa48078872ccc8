/* sampler._native: stackshot's native sampling engine.
 *
 * A collector thread of its own (a pthread that never takes the GIL and never calls
 * the Python API) wakes at absolute deadlines, one drawn at random in each slot of
 * the delay (tick_offset), and, for each target thread, reads its
 * CPU clock and, when the thread has run since its last sample, its frame chain,
 * with fault-safe reads (saferead.h) decoded with the interpreter's own layouts
 * (pyframes.h). A sample falls where the thread is at that moment, whether or not it
 * holds the GIL, and the program is never stopped to be looked at.
 *
 * Samples go into the active one of two bounded buffers; `drain()` (called from
 * Python, with the GIL) swaps them and turns the full one into Python values. A
 * full buffer drops samples and counts them: memory stays bounded however long
 * Python takes to drain. Code objects are recorded as addresses with a fingerprint,
 * and the names, file and line table of each (address, fingerprint) are copied into
 * the buffer once, for Python to resolve the samples' frames with; the collector
 * hears which code objects were freed (codewatch.h).
 */
#define PY_SSIZE_T_CLEAN
#include "pyframes.h"
#include "codewatch.h"
#include "nsclock.h"
#include "markstacks.h"
#include "shadowstacks.h"
#include "gchook.h"
#include "gilholder.h"
#include "threadwatch.h"
#include "switching.h"
#include "switchhook.h"
#include "turnmerge.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SS_MAX_DEPTH 16384           /* frames kept per sample (innermost first) */
#define SS_WALK_TRIES 8              /* reads of a stack per tick before it counts as torn */
#define SS_MAX_CHUNKS 512            /* older data-stack chunks looked at per walk */
#define SS_CHUNK_COPY_MAX (1 << 20)  /* bytes of one data-stack chunk copied at once */
#define SS_CHUNK_SLACK 2048          /* bytes past the last walk's use read with the state (walk) */
#define SS_ASLEEP_MEMORY 8           /* samples a thread is asked whether it sleeps after it last did */
#define SS_CODE_CACHE 8192           /* code fingerprints remembered within a period */
#define SS_CODE_FRESH_NS 10000000LL  /* 10 ms: code fingerprints are read again after at most this, */
#define SS_CODE_FRESH_WATCHED_NS 100000000LL  /* 100 ms where the collector hears of their ends */
#define SS_CODE_PROBES 8             /* slots of SS_CODE_CACHE an address may take (from its hash on) */
#define SS_COPIED 16384              /* code objects whose names were copied already */
#define SS_COPIED_PROBES 16          /* slots of SS_COPIED an address may take */
#define SS_CODE_GENERATIONS 4096     /* addresses' generations (codes freed there), hashed */
#define SS_SLOW_WALK_NS 50000        /* a walk's reads took longer (plus per frame below): */
#define SS_SLOW_WALK_FRAME_NS 2000   /* its callers are read again (callers_still_there) */
#define SS_CALLERS_CHECKED 64        /* callers read again one by one, at most */
#define SS_DEFAULT_BUFFER (8 << 20)  /* bytes per sample buffer (two of them) */
#define SS_THREAD_WAKE_GAP 20000000  /* ns: the feeder is woken for new threads at most this often */

enum { SS_REPEAT = 1, SS_TRUNCATED = 2, SS_ASLEEP = 4, SS_ONCPU = 8, SS_PARKED = 16, SS_PREEMPTED = 32,
       SS_SAME = 64 };
enum { SS_TAG_SAMPLE = 1, SS_TAG_CODE = 2 };

/* One sample in a buffer; followed by nframes ss_entry, then nmarks uint32 (padded). */
typedef struct {
    uint32_t tag;      /* SS_TAG_SAMPLE */
    uint32_t ctx;
    uint32_t flags;
    uint32_t nframes;
    int64_t read_ns;   /* when its read began: the stack is no older (a greenlet is
                        * told by the switches logged from then to wall_ns) */
    int64_t wall_ns;
    int64_t cpu_ns;
    uint64_t base;     /* the outermost frame's address */
    uint32_t nmarks;
    uint32_t pad;
} ss_record;

/* What a profile needs of one code object, copied when the collector first meets it
 * (or meets another object at its address): Python resolves sampled addresses from
 * these alone, never by touching the address, which may have been freed since.
 * Followed by the name, file name and line table bytes (padded). */
typedef struct {
    uint32_t tag;      /* SS_TAG_CODE */
    uint32_t fingerprint;
    uint64_t code;
    int32_t firstlineno;
    uint32_t code_bytes;
    uint32_t name_bytes, file_bytes, table_bytes;
    uint8_t name_kind, file_kind, pad[2];
} ss_code_record;

typedef struct {
    uint64_t code;
    int32_t lasti;
    uint32_t fingerprint;  /* 0: the address did not hold a live code object */
} ss_entry;

typedef struct {
    uint32_t ctx;
    uintptr_t tstate;
    unsigned long ident;
    clockid_t clock;
    int has_clock;
    int has_last;      /* a sample was taken: an unchanged CPU clock repeats it */
    int gone;          /* the thread has exited (clock or thread state says so) */
    int64_t last_cpu;
    int held_gil;      /* it held the GIL at its last sample (unchanged while it does not run) */
    int handed_over;   /* held the GIL in a feeder's turn, not seen holding it again since */
    long tid;          /* the kernel's thread id, 0 when unknown */
    int stat_fd;       /* /proc/self/task/<tid>/stat, opened when first needed; -1 */
    int status_fd;     /* /proc/self/task/<tid>/status, likewise */
    long long voluntary;  /* its voluntary context switches when last read; -1 unknown */
    uintptr_t cframe;  /* 3.11-3.12: the C frame its state named at the last walk (ss_top_field) */
    uintptr_t chunk_hint;     /* 3.11+: the data-stack chunk current at the last walk (0: none) */
    size_t chunk_hint_bytes;  /* how much of it the next walk reads with the thread state */
    uintptr_t outside_hint;   /* the first frame outside the data-stack chunks at the last walk */
    uint32_t since_asleep;    /* its samples since one found it asleep (task_state) */
    int held;          /* `held_rec` is a sample not in the buffer yet (flush_held) */
    ss_record held_rec;  /* its latest sample of a stretch filed once (REPEAT or SAME) */
    size_t last_off;   /* where its last sample with frames is in the active buffer, */
    uint32_t last_epoch;  /* in this epoch of it (0: none) */
    uint64_t state_id; /* its thread state's number, read at each walk (switching.h) */
} ss_target;

typedef struct {
    char *data;
    size_t used;
    size_t cap;
} ss_buffer;

typedef struct {
    uintptr_t addr;
    uint32_t fingerprint;
    uint32_t epoch;
    int32_t framesize;  /* words on the data stack (3.11+), 0 when unknown */
    uint32_t code_bytes;  /* its bytecode's length (3.11+), 0 when unknown */
} ss_code_slot;

typedef struct {
    uintptr_t addr;
    uint32_t fingerprint;
} ss_copied_slot;

typedef struct {
    PyObject_HEAD
    pthread_mutex_t lock;      /* guards everything below that the thread shares */
    pthread_cond_t wake;
    pthread_t thread;
    int thread_started;
    int thread_running;
    int short_slice;   /* the kernel gave the collector a short slice (ask_short_slice) */
    clockid_t thread_clock;
    int has_thread_clock;
    double final_cpu;
    /* steering */
    int64_t delay_ns;
    int paused;
    int stopped;
    /* targets */
    ss_target *targets;
    Py_ssize_t n_targets;
    pthread_mutex_t pending_lock;  /* guards the two below: held only to copy */
    ss_target pending[64];     /* threads announced since the last tick */
    int n_pending;
    int want_marks;
    int64_t feeder_due_ns;     /* the feeder's turn with the GIL begins (atomic;
                                  INT64_MAX: not due) */
    /* the feeder's wait (feeder_wait): the collector, or Python, ends it early */
    pthread_mutex_t feeder_lock;
    pthread_cond_t feeder_cond;
    int feeder_kicked;         /* guarded by feeder_lock */
    int watch_threads;         /* wake the feeder when a thread state is made (atomic) */
    PyInterpreterState *interp;
    uint64_t newest_thread;    /* collector-only: ss_newest_thread when last read */
    int thread_news;           /* collector-only: it changed, the feeder not woken yet */
    int64_t thread_wake_ns;    /* collector-only: when the feeder was last woken for it */
    int half_full_told;        /* the feeder was woken for the active buffer's fill */
    /* output */
    ss_buffer active, spare;
    uint32_t epoch;
    uint32_t code_epoch;       /* collector-only: the period of code_fresh_ns the tick is in */
    int64_t code_fresh_ns;     /* how often code fingerprints are read again (code_identity) */
    int watching_codes;        /* the code watcher tells which addresses were freed */
    uint64_t dead_seen;        /* collector-only: how far it read the watcher's ring */
    uint32_t *code_generations;  /* collector-only: code objects freed at addresses, hashed */
    uint32_t code_generation;  /* collector-only: times it forgot every address */
    uint64_t codes_forgotten;  /* code objects freed while it remembered them */
    uint64_t slow_walks;       /* walks held up, whose callers were read again */
    uint64_t slow_walks_torn;  /* ... and ran other code then */
    uint64_t walk_dead_from;   /* collector-only: the ring's head as the walk began ... */
    int walk_depth;            /* ... its frames (e->frames) ... */
    int walk_lost_code;        /* ... and whether one's code was freed since (forget_code) */
    uint64_t walks_lost_code;  /* walks read again for that */
    int walk_left_top;         /* collector-only: the last walk left its frames above the data stack out */
    uint64_t tops_left_out;    /* walks filed so (read_without_top) */
    uint64_t tops_read_again;  /* walks that did, read again in the same call and filed whole */
    /* statistics */
    uint64_t ticks, late_ticks, missed_ticks, torn, lost, samples, walks, reads_failed;
    uint64_t sleep_asks;       /* reads of a thread's state from /proc (task_state) */
    uint64_t walks_running;    /* walks during which the thread's CPU clock moved */
    uint64_t found_asleep;     /* walks after which /proc said the thread sleeps */
    uint64_t torn_reads;       /* walks thrown away as not one moment (each read again) */
    /* collector-only scratch (never touched by Python) */
    ss_reader reader;
    ss_entry *frames;
    uintptr_t *addrs;          /* the frames' own addresses, for marks */
    int32_t *framesizes;       /* the frames' sizes on the data stack, for walk_is_one_moment */
    ss_entry *frames_kept;     /* a walk kept while another is read (read_without_top) */
    ss_mark *marks_copy;
    uint32_t *marks_out;
    char *chunk_copy;          /* the current data-stack chunk, copied */
    char *older_copy;          /* one older chunk, copied when the walk reaches it */
    ss_code_slot *codes;
    ss_copied_slot *copied;    /* (address, fingerprint) pairs sent to Python already */
    char *name_copy, *file_copy, *table_copy;
    /* use_errortrace: sample the threads' shadow stacks (shadowstacks.h) */
    int shadow;
    uintptr_t *shadow_copy;    /* collector-only scratch, SS_SHADOW_MAX entries */
    uint64_t shadow_reads, shadow_misses;
} Engine;

/* Where the frames of one walk can be decoded from without a read each. */
typedef struct {
    uintptr_t lo, hi;             /* the current chunk's copied range */
    uintptr_t alloc_hi;           /* where the current chunk's memory ends */
    uintptr_t older_lo, older_hi; /* the older chunk in older_copy */
    int n_older;                  /* older chunk ranges known, -1: not looked up yet */
    uintptr_t older[SS_MAX_CHUNKS][2];
    uintptr_t hint_addr;          /* a frame outside the chunks read with the thread state, */
    const char *hint_bytes;       /* its bytes (walk: the target's outside_hint) */
    uintptr_t outside_first;      /* the first frame met outside the copied chunks */
} ss_regions;

static int64_t mono_ns(void) { return ss_clock_ns(CLOCK_MONOTONIC); }

static int read_clock_ns(clockid_t clock, int64_t *out) {
    *out = ss_clock_ns(clock);
    return *out < 0 ? -1 : 0;
}

/* ---- code objects (collector side) ---------------------------------------------- */

static size_t code_hash(uintptr_t code) {
    return (size_t)((code >> 4) * 11400714819323198485ULL);
}

static void append_bytes(ss_buffer *b, const void *data, size_t n) {
    memcpy(b->data + b->used, data, n);
    b->used += n;
}

/* Send Python what it needs of the code object at `code` (whose copied leading bytes
 * are `window`). Returns 0 when the record went into the buffer. */
static int send_code(Engine *e, uintptr_t code, uint32_t fp, const char *window) {
    ss_code_fields f;
    if (ss_code_fields_of(&e->reader, window, &f) != 0) return -1;
    ss_code_record rec = {SS_TAG_CODE, fp, (uint64_t)code, f.firstlineno, f.code_bytes, 0, 0, 0, 0, 0, {0, 0}};
    rec.name_bytes = ss_copy_string(&e->reader, f.qualname, e->name_copy, &rec.name_kind);
    rec.file_bytes = ss_copy_string(&e->reader, f.filename, e->file_copy, &rec.file_kind);
    rec.table_bytes = ss_copy_bytes(&e->reader, f.linetable, e->table_copy, SS_TABLE_MAX);
    size_t payload = (size_t)rec.name_bytes + rec.file_bytes + rec.table_bytes;
    size_t padded = (payload + 7) & ~(size_t)7;
    ss_buffer *b = &e->active;
    if (b->used + sizeof rec + padded > b->cap) return -1;
    append_bytes(b, &rec, sizeof rec);
    append_bytes(b, e->name_copy, rec.name_bytes);
    append_bytes(b, e->file_copy, rec.file_bytes);
    append_bytes(b, e->table_copy, rec.table_bytes);
    memset(b->data + b->used, 0, padded - payload);
    b->used += padded - payload;
    return 0;
}

/* Make sure Python has the names of (code, fp): copy them once per pair. */
static void ensure_sent(Engine *e, uintptr_t code, uint32_t fp, const char *window) {
    size_t h = code_hash(code) & (SS_COPIED - 1);
    for (int probe = 0; probe < SS_COPIED_PROBES; probe++) {
        ss_copied_slot *slot = &e->copied[(h + probe) & (SS_COPIED - 1)];
        if (slot->addr == code && slot->fingerprint == fp) return;
        if (slot->addr == 0) {
            if (send_code(e, code, fp, window) == 0) {
                slot->addr = code;
                slot->fingerprint = fp;
            }
            return;
        }
    }
    /* the neighbourhood is full: start over (names are sent again as met) */
    memset(e->copied, 0, sizeof(ss_copied_slot) * SS_COPIED);
    if (send_code(e, code, fp, window) == 0) {
        e->copied[h].addr = code;
        e->copied[h].fingerprint = fp;
    }
}

/* Forget what was read and sent of the code object that was at `code`: it was freed
 * (codewatch.h). Every slot holding it goes (a chain cut short only reads or sends
 * some other code object again), and the address begins a new generation: the next
 * code object there gets another identity even where it agrees with this one in
 * every fingerprinted field (see code_identity). */
static void forget_code(void *arg, uintptr_t code, uint64_t index) {
    Engine *e = arg;
    size_t h = code_hash(code);
    int held = 0;
    if (index >= e->walk_dead_from)  /* (freed since the walk being looked up began) */
        for (int i = 0; i < e->walk_depth && !e->walk_lost_code; i++)
            e->walk_lost_code = e->frames[i].code == code;
    e->code_generations[h & (SS_CODE_GENERATIONS - 1)]++;
    for (int probe = 0; probe < SS_CODE_PROBES; probe++) {
        ss_code_slot *s = &e->codes[(h + probe) & (SS_CODE_CACHE - 1)];
        if (s->addr == code && s->epoch != 0) {
            s->epoch = 0;
            held = 1;
        }
    }
    for (int probe = 0; probe < SS_COPIED_PROBES; probe++) {
        ss_copied_slot *s = &e->copied[(h + probe) & (SS_COPIED - 1)];
        if (s->addr == code) {
            s->addr = 0;
            s->fingerprint = 0;
            held = 1;
        }
    }
    e->codes_forgotten += held;
}

/* Forget every code object read and sent (the watcher's ring went round unread):
 * every address begins a new generation. */
static void forget_all_codes(Engine *e) {
    memset(e->codes, 0, sizeof(ss_code_slot) * SS_CODE_CACHE);  /* (epoch 0: none) */
    memset(e->copied, 0, sizeof(ss_copied_slot) * SS_COPIED);
    e->code_generation++;
}

/* Forget the code objects freed since the collector last heard (codewatch.h); all of
 * them where the ring went round unread. While a walk's code objects are looked up
 * (walk_depth), one of its own among them marks the walk lost (forget_code), and so
 * does a ring gone round: which were freed is not known. */
static void hear_of_freed_codes(Engine *e) {
    if (!e->watching_codes || !ss_dead_codes(&e->dead_seen, forget_code, e)) return;
    forget_all_codes(e);
    if (e->walk_depth > 0) e->walk_lost_code = 1;
}

/* The identity of the code object at `code` whose fields' fingerprint is fp: with the
 * watcher, fp mixed with the address's generation, so that two code objects one after
 * the other at an address never share one. (Two that agree in every field, one made
 * where the other was, e.g. with code.replace: the second's names, sent again, came
 * to Python under the first one's identity, and Python, which learns a drain's
 * copies before its samples, named the first one's samples of that drain after the
 * second, or, its frames made already, the second after the first.) */
static uint32_t with_generation(Engine *e, uintptr_t code, uint32_t fp) {
    if (fp == 0 || !e->watching_codes) return fp;
    uint64_t h = (uint64_t)fp * 0x9E3779B97F4A7C15ULL;
    h ^= (uint64_t)e->code_generations[code_hash(code) & (SS_CODE_GENERATIONS - 1)] * 0xC2B2AE3D27D4EB4FULL;
    h ^= (uint64_t)e->code_generation * 0x165667B19E3779F9ULL;
    uint32_t id = (uint32_t)(h ^ (h >> 32));
    return id ? id : 1;
}

/* The identity of the code object at `code` (its fingerprint, with the address's
 * generation), read once per period of code_fresh_ns (code_epoch) and whenever the
 * collector heard that the object there was freed (codewatch.h), so each address is
 * named by the object there when its stack was read. (The period is longer with the
 * watcher, 100 ms, and still matters: a torn walk can name an address where a code
 * object is being made, and the read then mixes its fields with the freed one's;
 * read again, the identity comes right within the period. At 10 ms a 5 ms sampler
 * read every code object of its stacks again every other tick: 22.7 reads a tick
 * for a stack of 40 functions, against 5.3 at 1 ms. Without the watcher, 3.12+ with
 * none left to take, it is 10 ms: a code object made where a freed one was keeps that
 * one's identity until the period ends: read once per drain instead, up to 250 ms, a
 * program's first function called after its imports was named after a module whose
 * code, run and freed just before, had had its address, its whole run misnamed (the
 * CLI test of a script exiting non-zero, 3 runs in 4 on 3.10 in CI's venv); read once
 * per tick, a stack of 40 functions cost the collector 40 reads a walk, 120 us a tick
 * for 50.)
 * 0 when it is not a readable code object. Sets
 * *framesize (when not NULL) to the words its frames take on the data stack, and
 * *code_bytes (likewise) to its bytecode's length (0: unknown). */
static uint32_t code_identity(Engine *e, uintptr_t code, int32_t *framesize, uint32_t *code_bytes) {
    if (framesize) *framesize = 0;
    if (code_bytes) *code_bytes = 0;
    if (code == 0) return 0;
    hear_of_freed_codes(e);  /* (after the stack was read: see codewatch.h) */
    size_t h = code_hash(code) & (SS_CODE_CACHE - 1);
    ss_code_slot *slot = NULL;
    for (int probe = 0; probe < SS_CODE_PROBES; probe++) {
        ss_code_slot *s = &e->codes[(h + probe) & (SS_CODE_CACHE - 1)];
        if (s->epoch == e->code_epoch && s->addr == code) {
            if (framesize) *framesize = s->framesize;
            if (code_bytes) *code_bytes = s->code_bytes;
            return s->fingerprint;
        }
        if (s->epoch != e->code_epoch) {
            slot = s;
            break;
        }
    }
    char window[SS_CODE_FULL_WINDOW];
    uint32_t fp = 0;
    int32_t size = 0;
    uint32_t nbytes = 0;
    if (ss_read(&e->reader, window, code, sizeof window) == 0) fp = with_generation(e, code, ss_code_fingerprint(window));
    if (fp) {
        size = ss_code_framesize(window);
        nbytes = ss_code_nbytes(window);
        ensure_sent(e, code, fp, window);
    }
    if (slot != NULL) {
        slot->addr = code;
        slot->fingerprint = fp;
        slot->framesize = size;
        slot->code_bytes = nbytes;
        slot->epoch = e->code_epoch;
    }
    if (framesize) *framesize = size;
    if (code_bytes) *code_bytes = nbytes;
    return fp;
}

/* ---- walking one thread (collector side) ------------------------------------- */

/* Read the stack of thread state `tstate` into e->frames (innermost first).
 * Returns the depth, or -1 when the thread state could not be read or is no longer
 * the thread's. Sets *base to the outermost frame's address, *flags. */
#if PY_VERSION_HEX >= 0x030B0000
/* The ranges of the older data-stack chunks (each holds the frames of callers that
 * did not fit in the chunks after it), read from their headers once per walk. */
static void find_older_chunks(Engine *e, ss_regions *r) {
    r->n_older = 0;
    if (r->hi == 0) return;
    _PyStackChunk header;
    uintptr_t p = (uintptr_t)((_PyStackChunk *)e->chunk_copy)->previous;
    while (p && r->n_older < SS_MAX_CHUNKS) {
        if (ss_read(&e->reader, &header, p, offsetof(_PyStackChunk, data)) != 0) break;
        uintptr_t lo = p + offsetof(_PyStackChunk, data);
        r->older[r->n_older][0] = lo;
        r->older[r->n_older][1] = lo + header.top * sizeof(PyObject *);
        r->n_older++;
        p = (uintptr_t)header.previous;
    }
}
#endif

/* The SS_FRAME_SIZE bytes of the frame at addr: from a copied chunk when it lies in
 * one, else read on their own (generator frames, C-stack shims). NULL when unreadable. */
/* Whether [addr, addr + n) lies within [lo, hi), without overflowing on a garbage
 * address (a torn read can hand the walker any value at all). */
static inline int within(uintptr_t addr, size_t n, uintptr_t lo, uintptr_t hi) {
    return lo < hi && addr >= lo && addr < hi && hi - addr >= n;
}

static const char *frame_bytes(Engine *e, ss_regions *r, uintptr_t addr, char *own) {
    if (within(addr, SS_FRAME_SIZE, r->lo, r->hi)) return e->chunk_copy + (addr - r->lo);
    if (within(addr, SS_FRAME_SIZE, r->older_lo, r->older_hi)) return e->older_copy + (addr - r->older_lo);
#if PY_VERSION_HEX >= 0x030B0000
    if (r->n_older < 0) find_older_chunks(e, r);
    for (int i = 0; i < r->n_older; i++) {
        uintptr_t lo = r->older[i][0], hi = r->older[i][1];
        if (within(addr, SS_FRAME_SIZE, lo, hi) && hi - lo <= SS_CHUNK_COPY_MAX) {
            if (ss_read(&e->reader, e->older_copy, lo, hi - lo) != 0) break;
            r->older_lo = lo;
            r->older_hi = hi;
            return e->older_copy + (addr - lo);
        }
    }
#endif
    if (r->outside_first == 0) r->outside_first = addr;
    if (addr == r->hint_addr) return r->hint_bytes;
    return ss_read(&e->reader, own, addr, SS_FRAME_SIZE) == 0 ? own : NULL;
}

#if PY_VERSION_HEX >= 0x030B0000
/* Which data-stack chunk holds the frame at addr: 0 the current one (copied or not:
 * frames pushed after the view was read lie past its copy), 1 + i the older chunk
 * i, -1 none (a generator's frame, a C-stack shim). */
static int chunk_of(const ss_regions *r, uintptr_t addr) {
    if (within(addr, SS_FRAME_SIZE, r->lo, r->alloc_hi)) return 0;
    for (int i = 0; i < r->n_older; i++)
        if (within(addr, SS_FRAME_SIZE, r->older[i][0], r->older[i][1])) return 1 + i;
    return -1;
}
#endif

#if PY_VERSION_HEX >= 0x030B0000
/* Whether a frame read at an address of a data-stack chunk can be there. A shim
 * (3.12+) lives on the C stack; a Python frame has a caller there but a thread's
 * (or a greenlet's) outermost frame, which is pushed at the start of a chunk, and
 * which on 3.12+ has a shim under it but while greenlet switches. Bytes read
 * where the thread has just pushed or popped a frame can decode as either, and
 * would end the walk early: the rest of the stack silently lost. */
static int frame_may_be_here(const ss_regions *r, const ss_frame *f) {
    int chunk = chunk_of(r, f->addr);
    if (chunk < 0) return 1;
    if (f->skip) return 0;
    if (f->previous != 0) return 1;
    /* (3.12+: while greenlet switches, a greenlet's frames are "exposed", their
     * links rewritten to skip the C-stack shims, which live on a C stack greenlet
     * saves away: the outermost then has no caller. Refused as torn, such walks
     * made gevent_chatty at 1 ms read again 45% of its walks on 3.12 (60% on
     * 3.13), 20% since, and lean 6 points to its parsing on 3.12, 1 since.) */
    uintptr_t data = chunk == 0 ? r->lo + offsetof(_PyStackChunk, data) : r->older[chunk - 1][0];
    return f->addr == data + sizeof(PyObject *);  /* (the root chunk skips data[0]) */
}
#endif

/* Whether the frames just walked are one moment of the thread's stack. The thread
 * runs on while it is read, and the copy of a chunk is not atomic: a frame read
 * where the thread has since returned from may be stale, and its caller's address
 * may hold another frame by then, or the middle of one. Seen on 3.11 and 3.12 under
 * load: a sample in 30 mixed two call chains or began at a frame with no code.
 * What holds for frames read at one moment: each runs a live code object, and
 * (3.11+) a frame on the data stack lies right after its caller's frame in the same
 * chunk (it is pushed at datastack_top, which the caller's push moved by the
 * caller's frame size; shims and generator frames live elsewhere and are not
 * checked). Not caught: a stale frame on a caller of the very size of the one it
 * replaced (two moments that agree in every size). */
static int walk_is_one_moment(Engine *e, const ss_regions *r, int depth) {
    for (int i = 0; i < depth; i++) {
        if (e->frames[i].fingerprint == 0) return 0;
#if PY_VERSION_HEX >= 0x030B0000
        int chunk = chunk_of(r, e->addrs[i]);
        if (chunk >= 0 && i + 1 < depth && chunk_of(r, e->addrs[i + 1]) == chunk) {
            int32_t size = e->framesizes[i + 1];
            if (size <= 0 || e->addrs[i] != e->addrs[i + 1] + (uintptr_t)size * sizeof(PyObject *)) return 0;
        }
#else
        (void)r;
#endif
    }
    return 1;
}

#if PY_VERSION_HEX >= 0x030B0000
/* The last frame on the current data-stack chunk when the thread state was read (as
 * the chunk's copy shows it, up to view.chunk_top) that has begun its body: its
 * address, or 0 when the copy does not hold the chunk's frames end to end. A
 * suspended generator found on top of a walk ran, when the state was read, above
 * that frame (its own frame lives in its generator, not on the data stack), called
 * from it or from other generators above it. The frames of a chunk lie one after
 * the other from its first (data[1] in a thread's first chunk, data[0] in the
 * others: CPython's push_chunk), each as long as its code's frame size; they must
 * end exactly at chunk_top, each with a live code object. */
static uintptr_t chunk_last_frame(Engine *e, const ss_regions *r, uintptr_t chunk, uintptr_t chunk_top) {
    if (r->lo == 0 || r->lo != chunk || chunk_top > r->hi) return 0;
    const _PyStackChunk *head = (const _PyStackChunk *)e->chunk_copy;
    uintptr_t at = chunk + offsetof(_PyStackChunk, data) + (head->previous == NULL ? sizeof(PyObject *) : 0);
    uintptr_t last = 0, before_last = 0;
    int32_t last_lasti = -1;
    for (int n = 0; at < chunk_top; n++) {
        if (n == SS_MAX_DEPTH || !within(at, SS_FRAME_SIZE, r->lo, r->hi)) return 0;
        ss_frame f;
        ss_decode_frame(e->chunk_copy + (at - r->lo), at, &f);
        int32_t size = 0;
        uint32_t code_bytes;
        if (f.skip || f.generator || f.code == 0 || code_identity(e, f.code, &size, &code_bytes) == 0 || size <= 0)
            return 0;
        before_last = last;
        last = at;
        last_lasti = f.lasti;
        at += (uintptr_t)size * sizeof(PyObject *);
    }
    if (at != chunk_top) return 0;
    /* A last frame that has not begun its body is being pushed: its code is written
     * before its caller link, which can still be the link of the frame popped from
     * that address (a generator function's, called from a generator: 3.11 filed
     * ['_gen_delegate', '_inner_gen'], its caller _outer_gen lost, 1 run in 100 of
     * generators_run_from_c). Its caller, the frame under it on the data stack or a
     * generator above that frame, is at its call: the frame under it is the last. */
    return last_lasti <= 0 ? before_last : last;
}
#endif

/* Whether the callers of a walk whose reads were held up still run the code they were
 * read with. A copy is not atomic: the kernel copies a chunk from its low end (the
 * outermost frames) up, and a collector preempted in the middle of it (or between
 * two reads, 3.10) reads the callers at one moment and the frames above at a later
 * one. A caller that returned in between and another function called at its
 * address, of the very frame size, is not told by walk_is_one_moment: two functions
 * taking turns from one loop, made to the same shape, had a sample in 25 test runs
 * of ~900 walks filed as one calling the other's callee (one of them under
 * ['omega', 'run_alpha'], with 74 ticks late that run). Read again now, such a
 * caller runs other code. The frames in the current chunk are read in one system
 * call, the others one by one, up to SS_CALLERS_CHECKED of them. */
static int callers_still_there(Engine *e, const ss_regions *r, int depth) {
    char own[SS_FRAME_SIZE];
    uintptr_t lo = 0, hi = 0;
#if PY_VERSION_HEX >= 0x030B0000
    for (int i = 1; i < depth; i++) {
        uintptr_t a = e->addrs[i];
        if (!within(a, SS_FRAME_SIZE, r->lo, r->hi)) continue;
        if (lo == 0 || a < lo) lo = a;
        if (a + SS_FRAME_SIZE > hi) hi = a + SS_FRAME_SIZE;
    }
    if (lo != 0 && (hi - lo > SS_CHUNK_COPY_MAX || ss_read(&e->reader, e->older_copy, lo, hi - lo) != 0)) return 0;
#else
    (void)r;
#endif
    int alone = 0;
    for (int i = 1; i < depth; i++) {
        uintptr_t a = e->addrs[i];
        const char *bytes;
        if (lo != 0 && a >= lo && a + SS_FRAME_SIZE <= hi) {
            bytes = e->older_copy + (a - lo);
        } else {
            if (++alone > SS_CALLERS_CHECKED) continue;
            if (ss_read(&e->reader, own, a, sizeof own) != 0) return 0;
            bytes = own;
        }
        ss_frame f;
        ss_decode_frame(bytes, a, &f);
        if (f.code != e->frames[i].code) return 0;
    }
    return 1;
}

#if PY_VERSION_HEX >= 0x030B0000
/* Whether a top frame on the data stack that had not begun its body when it was read
 * (its first instruction, or before it) was pushed whole then. A frame is pushed in
 * two steps: its code and instruction pointer are written where the last frame was
 * popped, and its caller link only right before the thread state names it. A top
 * read while the popped frame was the thread's, and its bytes copied between the two
 * steps of the next push there, mixed the new code with the old frame's caller: on
 * 3.13, ['_gen_delegate', '_inner_gen'], its caller _outer_gen (a generator, above
 * the data stack) lost, 1 sample in 1,814 of a CI run of the generators_run_from_c
 * stress scenario read through /proc/self/mem (the frame popped there had been
 * _outer_gen's own, made into its generator, called from _gen_delegate); 7-25 in
 * 9,700 samples of a loop that does only that. So the frame is read again, then what
 * the state names, then the frame once more: the state must still name the frame
 * the walk began at (named: what it named then), and the frame hold the code and
 * the link read both times. (The link read alone passed 1-3 samples in 9,700 of that
 * loop: the next push there, from the same caller as the popped frame's.) No read
 * that lets the thread run rules the race out: a loop that pushes a frame there
 * every microsecond can be caught pushing in each read, the state naming the frame
 * in between (1 run in 300-600 of the stress scenario generators_made_by_generators,
 * about 2,000 samples a run, still has one such sample on 3.13; none in 600 runs on
 * 3.11 and 3.12). A thread that has moved on since is read again, as every walk was
 * before the top's lag was let be: samples at a function's first instruction are
 * rare, but for a thread waiting there for the GIL, which stays. */
static int unbegun_top_was_pushed(Engine *e, const ss_target *t, uintptr_t named, const ss_frame *top) {
    uintptr_t now_named = 0;
    char before[SS_FRAME_SIZE], after[SS_FRAME_SIZE];
    void *dst[3] = {before, &now_named, after};
    uintptr_t src[3] = {top->addr, ss_top_field(t->tstate, t->cframe), top->addr};
    size_t len[3] = {sizeof before, sizeof now_named, sizeof after};
    if (src[1] == 0) return 0;  /* (3.11-3.12: the C frame not known yet) */
    if (ss_readv(&e->reader, dst, src, len, 3) != 3 || now_named != named) return 0;
    ss_frame f;
    ss_decode_frame(before, top->addr, &f);
    if (f.code != top->code || f.previous != top->previous) return 0;
    ss_decode_frame(after, top->addr, &f);
    return f.code == top->code && f.previous == top->previous;
}
#endif

/* Read the stack of target t into e->frames (innermost first). Returns the depth; -1
 * when the thread state could not be read or is no longer the thread's; -2 when the
 * stack changed under the walk (the caller reads again). Sets *base to the outermost
 * frame's address and *flags. */
static int walk(Engine *e, ss_target *t, uint64_t *base, uint32_t *flags) {
    int64_t began = mono_ns();
    e->walk_left_top = 0;
    uint64_t dead_before = e->watching_codes ? ss_dead_count() : 0;
    /* One system call reads, in this order: where the top frame is (the sample's
     * moment: ss_top_field), the thread state, and (3.11+) the data-stack chunk that
     * was current at the last walk, as far as it was used then and a little further
     * (SS_CHUNK_SLACK). Most walks find the same chunk, used about as far: then they
     * take one system call, not three or four (each 1-3 us here, and most of a
     * tick's own CPU). What the state says otherwise is read after it, as before. */
    PyThreadState ts;
    uintptr_t top = 0;
    char outside[SS_FRAME_SIZE];
    void *dst[SS_READV_MAX];
    uintptr_t src[SS_READV_MAX];
    size_t len[SS_READV_MAX];
    int n = 0, at_top = -1, at_chunk = -1, at_outside = -1;
    uintptr_t top_field = ss_top_field(t->tstate, t->cframe);  /* (0: 3.11-3.12 before the C frame is known) */
    if (top_field) {
        at_top = n;
        dst[n] = &top, src[n] = top_field, len[n++] = sizeof top;
    }
    int at_state = n;
    dst[n] = &ts, src[n] = t->tstate, len[n++] = sizeof ts;
    if (t->chunk_hint) {
        at_chunk = n;
        dst[n] = e->chunk_copy, src[n] = t->chunk_hint, len[n++] = t->chunk_hint_bytes;
    }
    if (t->outside_hint) {
        at_outside = n;
        dst[n] = outside, src[n] = t->outside_hint, len[n++] = SS_FRAME_SIZE;
    }
    int whole = ss_readv(&e->reader, dst, src, len, n);
    int top_first = at_top >= 0 && whole > at_top;
    if (whole <= at_state && ss_read(&e->reader, &ts, t->tstate, sizeof ts) != 0) return -1;
    int chunk_read = at_chunk >= 0 && whole > at_chunk;
    ss_tstate_view view;
    if (ss_decode_tstate(&e->reader, &ts, top_first ? t->cframe : 0, top, &view) != 0) return -1;
    if (view.thread_id != t->ident) return -1;
    t->state_id = view.id;
    if (view.cframe != t->cframe) {  /* (3.11-3.12: the top read first hangs off another C frame) */
        t->cframe = view.cframe;
        top_first = 0;
    }
    if (top_first) view.top = top;
    ss_regions r = {0, 0, 0, 0, 0, -1};
    if (at_outside >= 0 && whole > at_outside) {
        r.hint_addr = t->outside_hint;
        r.hint_bytes = outside;
    }
#if PY_VERSION_HEX >= 0x030B0000
    /* Most frames live in the current data-stack chunk: copy the chunk (header and
     * frames) in one read and decode frames from the copy. The top and
     * datastack_top are read at two moments while the thread runs on, so the top
     * frame can lie past datastack_top (popped after the top was read, or pushed
     * after datastack_top was): the copy goes up to the top frame. (Copied up to
     * datastack_top, each frame past it was read on its own, a system call of ~2 us
     * per frame: 3.8 reads a tick on the deep benchmark instead of 3.1, counted with
     * perf stat.) The longer copy fails where the top is in a chunk pushed since and
     * not adjacent: then the shorter one. */
    uintptr_t copy_end = view.chunk_top;
    if (view.top + SS_FRAME_SIZE > view.chunk_top && view.top >= view.chunk
        && view.top - view.chunk <= SS_CHUNK_COPY_MAX - SS_FRAME_SIZE)
        copy_end = view.top + SS_FRAME_SIZE;
    if (view.chunk && view.chunk_top > view.chunk && copy_end - view.chunk <= SS_CHUNK_COPY_MAX) {
        /* (the chunk read with the state holds the bytes wanted when it is the same
         * chunk and reaches far enough: read just after the state, as they would be) */
        int copied = chunk_read && view.chunk == t->chunk_hint && copy_end - view.chunk <= t->chunk_hint_bytes;
        if (!copied) copied = ss_read(&e->reader, e->chunk_copy, view.chunk, copy_end - view.chunk) == 0;
        if (!copied && copy_end != view.chunk_top) {
            copy_end = view.chunk_top;
            copied = ss_read(&e->reader, e->chunk_copy, view.chunk, copy_end - view.chunk) == 0;
        }
        if (copied) {
            r.lo = view.chunk;
            r.hi = copy_end;
            size_t size = ((_PyStackChunk *)e->chunk_copy)->size;  /* bytes, header included */
            r.alloc_hi = size >= view.chunk_top - view.chunk && size <= ((size_t)1 << 32) ? view.chunk + size
                                                                                         : view.chunk_top;
        }
    }
    /* what the next walk reads with the state: this chunk, as far as it was used and
     * a little further, never past the chunk's end */
    t->chunk_hint = 0;
    if (r.lo != 0) {
        size_t want = ((r.hi - r.lo) + SS_CHUNK_SLACK + 511) & ~(size_t)511;
        size_t room = r.alloc_hi - r.lo;
        if (want > room) want = room;
        if (want > SS_CHUNK_COPY_MAX) want = SS_CHUNK_COPY_MAX;
        t->chunk_hint = r.lo;
        t->chunk_hint_bytes = want;
    }
#else
    (void)chunk_read;
#endif
    uintptr_t addr = view.top;
    int depth = 0;
    *base = 0;
    *flags = 0;
    int steps = 0;
    /* A torn read can link frames into a cycle. Followed to the step bound, one
     * read a frame where the frames are not in a copied chunk, it cost 65 ms of
     * system calls (3.13, a thread forking: ticks missed for 70 ms, a 50 ms profile
     * left with no sample). Brent's check ends it within twice the cycle's length:
     * the address at each power-of-two step is kept, and meeting it again is a
     * cycle (a real chain never holds a frame twice). */
    uintptr_t seen = 0;
    int since_seen = 0, next_keep = 1;
    char own[SS_FRAME_SIZE];
    /* (3.11+) Frames above the data stack (a generator's, a C-stack shim) are read
     * one by one after the top, and can have moved on meanwhile. Until the walk
     * reaches the data stack, a read that fails there (unreadable, a cycle, a
     * generator suspended since) goes on from the data stack's last frame as it was
     * when the state was read instead, those frames left out, once per walk
     * (read_without_top says why and what is filed). */
    int above_stack = 1, left_top = 0, base_generator = 0;
#if PY_VERSION_HEX >= 0x030B0000
    ss_frame unbegun_top = {0};  /* (see unbegun_top_was_pushed) */
#endif
    for (;;) {
        if (addr == 0) {
#if PY_VERSION_HEX >= 0x030B0000
            /* A chain that ends at a generator's frame without having met the data
             * stack, while the data stack held frames: those frames were the
             * generator's callers (a thread's frames on its data stack are all
             * running, under whatever runs above them), so a link was read stale.
             * On 3.12 a generator resumed from C links to a shim, and a shim read
             * as the one under a thread's outermost frame (its caller link 0: an
             * earlier shim at that address, overwritten since) ended the walk there:
             * ['<genexpr>'] or ['_inner_gen'] alone, 1 run in 150 of the
             * generators_run_from_c stress scenario. A thread whose outermost frame
             * is a generator (run from C) has an empty data stack under it. */
            if (base_generator && above_stack && view.chunk != 0
                && view.chunk_top > view.chunk + offsetof(_PyStackChunk, data) + sizeof(PyObject *))
                goto torn_above;
#endif
            break;
        }
        if (++steps > 2 * SS_MAX_DEPTH) return -2;  /* a chain too long to be real */
        if (addr == seen) goto torn_above;          /* a cycle: a torn read */
        if (++since_seen == next_keep) {
            seen = addr;
            since_seen = 0;
            next_keep <<= 1;
        }
        const char *bytes = frame_bytes(e, &r, addr, own);
        if (bytes == NULL) goto torn_above;
        ss_frame f;
        ss_decode_frame(bytes, addr, &f);
#if PY_VERSION_HEX >= 0x030B0000
        if (within(addr, SS_FRAME_SIZE, r.lo, r.hi)) above_stack = 0;
        if (!frame_may_be_here(&r, &f)) return -2;
#else
        /* A caller is executing (a call is under way in it). A frame that ended was
         * freed under the walk: its f_back leads through the free list, a stack of
         * dead frames in reverse (CI, 3.10: ['release', 'run', 'run_and_announce',
         * 'run', 'serve', 'handle', ...] as threads ended), or nowhere (an ended
         * generator's frame, alone: ['<genexpr>'] in 5 runs of 5 of the
         * threads_churn stress scenario before this check). */
        if (steps > 1 && f.state != FRAME_EXECUTING) return -2;
        /* A top that has ended since the thread state named it is still the sample's
         * top: the function the thread was in at that moment (its code is checked
         * live below). Given to its caller instead, every function shorter than a
         * read lost its samples to its caller: nbody's nb_pair got 50% of the time
         * for py-spy's 70%, nb_move 0.5% for 10.5%. One with no caller left is torn,
         * and so is one not started or suspended with none: a frame the code kept
         * for reuse (its zombie frame) or freed, taken since for a call not begun,
         * was filed as a stack of that frame alone (['<genexpr>'], 1 sample in
         * 2,000 of generators_run_from_c read through /proc/self/mem). */
        if (steps == 1 && f.state != FRAME_EXECUTING && f.state != FRAME_UNWINDING && f.previous == 0) return -2;
#endif
        /* A generator's frame links to its caller only while it runs: one without a
         * caller was suspended after its callee's link to it was read, and the walk
         * would end there (json's encoder: 5% of io_mix's CPU filed under roots at
         * _iterencode_dict). A generator run as a thread's outermost frame (started
         * from C, before 3.12) is lost to this check. (3.11+: see torn_above.) */
        if (f.generator && f.previous == 0 && !f.skip) goto torn_above;
        /* Bytes of no one moment: a frame being pushed, a 3.12 shim being written
         * (pyframes.h, ss_shim_code). The walk after would also throw out the first;
         * the second runs no Python code and would be filed as a top. (A shim's own
         * instruction pointer is no code's: 3.13's runs no code object.) */
        if (!f.skip && f.lasti == SS_LASTI_TORN) goto torn_above;
#if PY_VERSION_HEX >= 0x030B0000
        /* A frame with no caller off the data stack that is no generator's: a
         * generator's frame being copied out of the data-stack frame that made it
         * (its owner not yet set: ['<genexpr>'] alone, read through a C frame's stale
         * link, 1 run in 100 of generators_run_from_c on 3.11 and 3.13). From 3.12
         * every Python frame has a caller (a shim under a thread's outermost); on
         * 3.11 one that has not begun its body is taken as such a copy (a
         * greenlet's outermost frame, when its switch falls between the top's read
         * and the state's, is elsewhere and has begun). */
        if (!f.skip && !f.generator && f.previous == 0 && chunk_of(&r, addr) < 0
            && (PY_VERSION_HEX >= 0x030C0000 || f.lasti <= 0))
            goto torn_above;
#endif
#if PY_VERSION_HEX >= 0x030B0000
        if (!f.skip && depth == 0 && f.lasti <= 0 && chunk_of(&r, addr) >= 0) {
            unbegun_top = f;
        }
#endif
        if (!f.skip) {
            if (depth < SS_MAX_DEPTH) {
                e->frames[depth].code = f.code;
                e->frames[depth].lasti = f.lasti;
                e->frames[depth].fingerprint = 0;
                e->addrs[depth] = addr;
                depth++;
            } else {
                *flags |= SS_TRUNCATED;
            }
            *base = addr;
            base_generator = f.generator;
        }
        addr = f.previous;
        continue;
    torn_above:  /* (a read above the data stack failed: see above_stack) */
#if PY_VERSION_HEX >= 0x030B0000
        if (above_stack && !left_top && !e->want_marks) {
            uintptr_t last = chunk_last_frame(e, &r, view.chunk, view.chunk_top);
            if (last != 0) {
                left_top = e->walk_left_top = 1;
                base_generator = 0;
                unbegun_top.addr = 0;
                depth = 0;
                *base = 0;
                *flags = 0;
                seen = 0;
                since_seen = 0;
                next_keep = 1;
                addr = last;
                continue;
            }
        }
#else
        (void)above_stack, (void)left_top, (void)base_generator;
#endif
        return -2;
    }
#if PY_VERSION_HEX >= 0x030B0000
    if (unbegun_top.addr != 0 && !unbegun_top_was_pushed(e, t, view.top, &unbegun_top)) return -2;
#endif
    if (mono_ns() - began > SS_SLOW_WALK_NS + (int64_t)steps * SS_SLOW_WALK_FRAME_NS) {
        e->slow_walks++;
        if (!callers_still_there(e, &r, depth)) {
            e->slow_walks_torn++;
            return -2;
        }
    }
    /* The top is not read again to see whether it changed while the rest was read:
     * a walk thrown away for that is read again a few microseconds later, so a
     * function that runs for less than a read (a system call or three) lost nearly
     * all its samples to whatever ran longer around it (nbody's nb_move: 0.5% of
     * the time for py-spy's 10.5%, on 3.11-3.13; 10-12% without the check). What
     * the read mixes instead is at most a few microseconds of the top: the function
     * the thread has just left, or has just called, at the top's address. */
    /* The code objects are looked up hearing of those freed as it goes: one of the
     * walk's own freed since the walk began, and the object now at its address (which
     * a lookup would name) is not the one the walk saw: read again (codewatch.h).
     * Heard once more after the last lookup, none freed before a lookup is missed. */
    e->walk_dead_from = dead_before;
    e->walk_depth = depth;
    e->walk_lost_code = 0;
    int torn = 0;
    for (int i = 0; i < depth && !torn; i++) {
        uint32_t code_bytes;
        e->frames[i].fingerprint = code_identity(e, (uintptr_t)e->frames[i].code, &e->framesizes[i], &code_bytes);
        /* An instruction pointer past its code's end: most likely the bytes of a
         * frame being pushed, its caller link written and its code not yet, so
         * the code read is whatever that memory held before. On 3.13, 1 run in
         * ~1,000 of the two_call_chains stress scenario named a function no
         * thread of the process ever ran (Future.__init__, write_text) right
         * above a real caller. The instruction pointer is written after the code,
         * so in such bytes it is stale as well, and almost never inside the code.
         * (One before the code is caught as the frame is read: SS_LASTI_TORN.) */
        torn = code_bytes && e->frames[i].lasti >= (int32_t)code_bytes;
    }
    hear_of_freed_codes(e);
    int lost = e->walk_lost_code;
    e->walk_dead_from = UINT64_MAX;
    e->walk_depth = 0;
    e->walks_lost_code += (uint64_t)lost;
    if (torn || lost) return -2;
    if (!walk_is_one_moment(e, &r, depth)) return -2;
    /* (read with the next walk's thread state: on 3.12+ the C-stack shim under a
     * thread's outermost frame, where it started running Python, or a generator's
     * frame the stack runs in) */
    t->outside_hint = r.outside_first;
    return depth;
}

/* Returns 0 when the record is in the buffer, -1 when it was full (the record lost). */
static int append_record(Engine *e, const ss_record *rec, const ss_entry *frames, const uint32_t *marks) {
    size_t marks_bytes = ((size_t)rec->nmarks * sizeof(uint32_t) + 7) & ~(size_t)7;
    size_t need = sizeof *rec + (size_t)rec->nframes * sizeof(ss_entry) + marks_bytes;
    ss_buffer *b = &e->active;
    if (b->used + need > b->cap) {
        e->lost++;
        return -1;
    }
    char *p = b->data + b->used;
    memcpy(p, rec, sizeof *rec);
    p += sizeof *rec;
    if (rec->nframes) memcpy(p, frames, (size_t)rec->nframes * sizeof(ss_entry));
    p += (size_t)rec->nframes * sizeof(ss_entry);
    if (rec->nmarks) memcpy(p, marks, (size_t)rec->nmarks * sizeof(uint32_t));
    b->used += need;
    e->samples++;
    return 0;
}

/* A stretch of samples of one thread is filed as its last sample alone: the stretch
 * in which it did not run (REPEAT: its CPU clock did not move, so neither did its
 * stack), and the stretch in which it was read again and again with the same frames
 * at the same instructions, the same marks and the same flags (SAME: a thread
 * waiting for the GIL wakes at each switch interval, uses a few microseconds and
 * waits again; one in a long C call). The sample before the stretch showed the same
 * stack, so the one sample at its end carries all its time to that stack under
 * every interval rule, as the samples in between did (each gave its interval to
 * that stack); only their number is lower. The held sample is filed before any
 * other record of its thread, and before a drain or a change of targets.
 * Measured: a pool of idle threads cost the feeder a sample each per tick (8
 * threads at 1 ms kept it holding the GIL 1.9% of the time); so did threads
 * taking turns with the GIL, each found waiting at most ticks. */
static void flush_held(Engine *e, ss_target *t) {
    if (!t->held) return;
    t->held = 0;
    append_record(e, &t->held_rec, NULL, NULL);
}

static void flush_held_all(Engine *e) {
    for (Py_ssize_t i = 0; i < e->n_targets; i++) flush_held(e, &e->targets[i]);
}

/* Keep back a REPEAT or SAME sample of t, as the last of the stretch held so far
 * when it can be: a REPEAT (the thread has not run since) extends any stretch to
 * its time; a SAME ends a stretch of REPEATs, or of SAMEs with the same flags (a
 * thread woken and found waiting in the same place has its CPU filed as a run
 * before the wait: filed as one, the runs of the stretch add up to the same). A
 * SAME with other flags is a new stretch. */
static void hold(Engine *e, ss_target *t, const ss_record *rec) {
    ss_record *h = &t->held_rec;
    if (t->held) {
        if (rec->flags == SS_REPEAT) {  /* (its CPU clock is no later than the held one's) */
            h->wall_ns = rec->wall_ns;
            return;
        }
        if (h->flags == SS_REPEAT || h->flags == rec->flags) {
            *h = *rec;
            return;
        }
        flush_held(e, t);
    }
    *h = *rec;
    t->held = 1;
}

/* Whether a sample just read of t shows what its last sample with frames showed: the
 * same frames (code, instruction, fingerprint), the same outermost frame and marks,
 * the same truncation. That sample is compared where it lies in the buffer, so only
 * while the buffer holds it (until the next drain). */
static int same_as_last_read(const Engine *e, const ss_target *t, const ss_record *rec, const ss_entry *frames,
                             const uint32_t *marks) {
    if (t->last_epoch != e->epoch) return 0;
    const ss_record *last = (const ss_record *)(e->active.data + t->last_off);
    if (last->nframes != rec->nframes || last->nmarks != rec->nmarks || last->base != rec->base
        || ((last->flags ^ rec->flags) & SS_TRUNCATED))
        return 0;
    const char *p = (const char *)(last + 1);
    size_t frames_bytes = (size_t)rec->nframes * sizeof(ss_entry);
    if (frames_bytes && memcmp(p, frames, frames_bytes) != 0) return 0;
    return rec->nmarks == 0 || memcmp(p + frames_bytes, marks, (size_t)rec->nmarks * sizeof(uint32_t)) == 0;
}

/* File a sample read with its frames: kept back as SAME (no frames: the thread's
 * last ones, Python keeps them) while it repeats the last one filed with frames,
 * else written out. Not for a thread that switches greenlets (switching.h): the
 * same stack at two ticks can be the hub's, waiting again after other greenlets
 * ran between them, and filing keeps each interval's switches apart. */
static void file_read(Engine *e, ss_target *t, ss_record *rec, const ss_entry *frames, const uint32_t *marks) {
    if (!ss_switches_greenlets(t->state_id) && same_as_last_read(e, t, rec, frames, marks)) {
        rec->flags |= SS_SAME;
        rec->nframes = 0;
        rec->nmarks = 0;
        hold(e, t, rec);
        return;
    }
    flush_held(e, t);
    size_t at = e->active.used;
    if (append_record(e, rec, frames, marks) == 0) {
        t->last_off = at;
        t->last_epoch = e->epoch;
    }
}

/* Open /proc/self/task/<tid>/<name> once per target (the fd is kept in *fd); -1 when
 * it cannot be (then the tid is forgotten: never asked again). */
static int task_file(ss_target *t, int *fd, const char *name) {
    if (*fd >= 0) return *fd;
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/%s", t->tid, name);
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) t->tid = 0;
    return *fd;
}

/* How many times the thread has blocked (its voluntary context switches), or -1. */
static long long voluntary_switches(ss_target *t) {
    if (t->tid <= 0 || task_file(t, &t->status_fd, "status") < 0) return -1;
    char buf[4096];
    ssize_t n = pread(t->status_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return -1;
    buf[n] = 0;
    const char *line = strstr(buf, "\nvoluntary_ctxt_switches:");
    if (line == NULL) return -1;
    return strtoll(line + sizeof "\nvoluntary_ctxt_switches:" - 1, NULL, 10);
}

/* The state the kernel has the thread in ('R', 'S', 'D', 't', ...), 0 unknown.
 * Only asked of threads that ran since their last sample. */
static char task_state(ss_target *t) {
    if (t->tid <= 0 || task_file(t, &t->stat_fd, "stat") < 0) return 0;
    char buf[128];
    ssize_t n = pread(t->stat_fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    /* "tid (comm) S ...": the name may hold spaces and parentheses; the state
     * follows the last ") " in the line (the name is at most 16 bytes) */
    char *end = NULL;
    for (char *p = buf; (p = strstr(p, ") ")) != NULL; p++) end = p;
    return end == NULL ? 0 : end[2];
}

/* Asleep: waiting for something, not on a CPU nor waiting for one. A thread whose
 * CPU clock moved since its last sample and that is asleep now ran, then blocked:
 * the CPU went into whatever it did before blocking, not into the call it blocks in. */
static int state_is_asleep(char state) {
    return state == 'S' || state == 'D' || state == 'I';
}

/* Stopped from outside (a tracer: py-spy, a debugger; or SIGSTOP), where it was
 * computing: preempted, not asleep. (Counted asleep, with py-spy stopping the
 * process 1,000 times a second, nbody's nb_pair came out 3.1 +- 0.5 points under
 * py-spy's share of the same processes: one sample in nine was found stopped, and
 * its CPU went to the place of the sample before.) */
static int state_is_stopped(char state) {
    return state == 't' || state == 'T';
}

static void close_target(ss_target *t) {
    if (t->stat_fd >= 0) close(t->stat_fd);
    if (t->status_fd >= 0) close(t->status_fd);
    t->stat_fd = t->status_fd = -1;
}

/* Replace the frames just walked by the thread's shadow stack, when it has one for
 * this session (the walk still gave the base and the marks): code objects at their
 * first line (lasti -1), C callables as (id, lasti -2). */
static void use_shadow(Engine *e, ss_target *t, ss_record *rec) {
    int truncated;
    int n = ss_shadow_copy(t->tstate, e->shadow_copy, SS_SHADOW_MAX, &truncated);
    e->shadow_reads++;
    if (n < 0) {
        e->shadow_misses++;
        return;
    }
    for (int i = 0; i < n; i++) {
        uintptr_t entry = e->shadow_copy[i];
        if (entry & 1) {
            e->frames[i].code = entry >> 1;
            e->frames[i].lasti = -2;
            e->frames[i].fingerprint = 0;
        } else {
            e->frames[i].code = entry;
            e->frames[i].lasti = -1;
            e->frames[i].fingerprint = code_identity(e, entry, NULL, NULL);
        }
    }
    rec->nframes = (uint32_t)n;
    if (truncated) rec->flags |= SS_TRUNCATED;
    /* inside a C call (its entry on top), not at an eval-breaker check: not parked */
    if (n > 0 && (e->shadow_copy[0] & 1)) rec->flags &= ~(uint32_t)SS_PARKED;
}

/* A walk that could not read the frames above the data stack whole (walk, at
 * torn_above) holds the frames the thread ran when its state was read from the
 * data stack's last one on (chunk_last_frame): the stack of that moment, less the
 * generators (and 3.12+ shims) it ran above them. Why not read again instead: a
 * generator resumed from C and suspended every few hundred nanoseconds (a
 * generator expression fed to str.join) is found suspended, or its frames gone,
 * at a third of the walks in it, and each walk read again comes 5-10 us later (a
 * read of a few pages costs 1.3-5 us here): the function running it lost a third
 * of its samples to the code after it, 9-15 points of a loop's CPU on 3.11-3.13
 * (and part of the 7-12 points gevent_chatty's handler leaned to its parsing on an
 * AMD host: scribblings/sampler.md).
 * The thread is read again all the same, until a walk is whole (at most
 * SS_WALK_TRIES walks in all): where it finds the same function in the same place
 * (address, code, and as many frames under it: the same call, or the same function
 * called again from the same callers), that walk is filed, generators and all
 * (json's encoder chain, whose generators json.dump resumes for each chunk it
 * writes, keeps its frames: kept out, dump's own time was 51% of a dump loop's for
 * 37% read again as before and py-spy's 17%); else the walk kept is, and the
 * generators' own time goes to the frame that ran them. Returns
 * the depth of the walk filed, in e->frames, *base and *flags (e->addrs are then
 * the other walk's: walks with marks never leave frames out). */
static int read_without_top(Engine *e, ss_target *t, int depth, uint64_t *base, uint32_t *flags) {
    if (depth <= 0) return depth;
    uint64_t last_code = e->frames[0].code;
    uintptr_t last_addr = e->addrs[0];
    uint64_t kept_base = *base;
    uint32_t kept_flags = *flags;
    memcpy(e->frames_kept, e->frames, (size_t)depth * sizeof *e->frames);
    for (int attempt = 1; attempt < SS_WALK_TRIES; attempt++) {
        int again = walk(e, t, base, flags);
        e->torn_reads += (uint64_t)(again == -2);
        if (again == -2 || (again > 0 && e->walk_left_top)) continue;  /* (not whole: read again) */
        int i = 0;
        while (i < again && e->addrs[i] != last_addr) i++;
        if (i < again && e->frames[i].code == last_code && again - i == depth) {
            e->tops_read_again++;
            return again;
        }
        break;  /* whole, and out of that call */
    }
    memcpy(e->frames, e->frames_kept, (size_t)depth * sizeof *e->frames);
    *base = kept_base;
    *flags = kept_flags;
    e->tops_left_out++;
    return depth;
}

/* A sample's time is read per target, when its walk has ended, not once per tick: on
 * a busy machine this thread can lose its core for milliseconds anywhere in a tick
 * (seen: 6 ms between the tick's clock and a walk), and a stack must be placed no
 * earlier than it was read: greenlets are told apart by the switches logged from
 * the time the read began (read_ns) to the time it ended (wall_ns): the greenlet in
 * force then whose frames the stack starts with (sampler/greenlets.py). */
static void sample_target(Engine *e, ss_target *t) {
    int64_t cpu = 0;
    if (t->gone) return;
    /* (the wall clock first: for a thread found not to have run, no collection can
     * end after the CPU clock said so and before the sample's wall time, to be filed
     * before the sample and charged none of the CPU it has used since) */
    int64_t wall = mono_ns();
    if (t->has_clock && read_clock_ns(t->clock, &cpu) != 0) {
        t->gone = 1;  /* the kernel no longer knows the thread */
        flush_held(e, t);
        return;
    }
    ss_record rec = {SS_TAG_SAMPLE, t->ctx, 0, 0, wall, wall, cpu, 0, 0, 0};
    if (t->has_clock && t->has_last && cpu == t->last_cpu) {
        /* (not having run, it holds the GIL as it did then: see PARKED below) */
        if (t->held_gil && wall >= __atomic_load_n(&e->feeder_due_ns, __ATOMIC_RELAXED)) t->handed_over = 1;
        rec.flags = SS_REPEAT;  /* it has not run: its stack cannot have changed */
        hold(e, t, &rec);       /* kept back: only the last of a run of these is filed */
        return;
    }
    /* With marks, a walk counts only if the thread's mark stack did not change while
     * it ran (same even counter before the walk and after the copy of the marks):
     * else a sample could hold a marked frame without its mark, or the reverse. A
     * thread that had no mark stack before the walk and has one after it made its
     * first mark meanwhile: read again (else the first sample of a thread's first
     * marked frame could come without the mark: 1 run in 30 under load). */
    /* A torn walk is read again, up to SS_WALK_TRIES times: a tick with no whole read
     * is lost, and its interval's CPU goes with the next sample, often into the next
     * function. Generators nested as deep as the data they encode (json.dump) resume
     * and suspend every few microseconds, and a walk reading them one at a time spans
     * one more often than not: with three tries 18% of the ticks on such a thread
     * were lost (the io_mix benchmark's encoder lost 4.7 points of the CPU at 5 ms),
     * with eight 1%. A try costs a walk, tens of microseconds at worst. */
    ss_markstack *marks = NULL;
    int depth = -2;
    int nmarks = 0;
    uint64_t base = 0;
    uint32_t flags = 0;
    for (int attempt = 0; attempt < SS_WALK_TRIES && depth == -2; attempt++) {
        if (e->want_marks && marks == NULL) marks = ss_markstack_find(t->tstate);
        uint32_t seq = ss_markstack_seq(marks);
        depth = walk(e, t, &base, &flags);
        e->torn_reads += (uint64_t)(depth == -2);
        if (depth >= 0 && marks != NULL) {
            nmarks = ss_markstack_copy(marks, seq, e->marks_copy);
            if (nmarks < 0) depth = -2;
        } else if (depth >= 0 && e->want_marks && ss_markstack_find(t->tstate) != NULL) {
            depth = -2;
        }
    }
    if (depth >= 0 && e->walk_left_top) depth = read_without_top(e, t, depth, &base, &flags);
    rec.wall_ns = mono_ns();
    e->walks++;
    if (depth == -2) {
        e->torn++;
        return;
    }
    if (depth < 0) {
        e->reads_failed++;
        return;
    }
    /* The sample's CPU time is read with its wall time, after the walk: collections
     * that ended before that wall time are filed before the sample, within the CPU
     * it reports (read before the walk, a collection that ended during a walk that
     * was read again lost its CPU to that cap: GC time 23% short on 3.12 in CI). */
    int64_t cpu_after;
    int moved = 0;
    if (t->has_clock && read_clock_ns(t->clock, &cpu_after) == 0) {
        moved = cpu_after > cpu;
        rec.cpu_ns = cpu_after;
    }
    /* Asked of the kernel (a read of /proc: 5-8 us here, the dearest part of a walk)
     * only where the answer can be yes: of a thread whose clock stood still during
     * the walk, or that was found asleep in one of its last SS_ASLEEP_MEMORY samples.
     * A thread computing without a break is not asked each tick; what it loses is a
     * thread that ran while it was read, blocked just after and had not blocked for
     * that long: its interval's CPU goes where it was read instead of to its last
     * place seen running, for one sample. */
    int ask = t->has_last && (!moved || t->since_asleep < SS_ASLEEP_MEMORY);
    e->sleep_asks += (uint64_t)ask;
    e->walks_running += (uint64_t)moved;
    char state = ask ? task_state(t) : 0;
    if (state_is_asleep(state)) {
        flags |= SS_ASLEEP;
        t->since_asleep = 0;
        e->found_asleep++;
    } else if (t->since_asleep < UINT32_MAX) {
        t->since_asleep++;
    }
    /* On a core now, not just runnable: its CPU clock moved while we read it (the
     * kernel brings a running thread's clock up to date on every read). A thread
     * found in a place where it also waits (a C call that lets the GIL go, then
     * waits to take it back) is computing there only if so. */
    if (!(flags & SS_ASLEEP) && moved) flags |= SS_ONCPU;
    /* Neither asleep nor on a core: runnable. A thread that has not blocked since an
     * earlier look (the same count of voluntary context switches) was not waiting in
     * between, for the GIL or anything else: it was preempted, computing where it is
     * found, and its CPU goes there (not to where it last ran, as a thread woken from
     * a wait into a place it also waits in, or parked by the feeder's turn). Seen:
     * with other work on the thread's core, the io_mix benchmark's hashlib (computing
     * without the GIL, and waiting for it after) was preempted there and charged as
     * waiting: 12% of the CPU for 23%. A thread that has blocked since is judged by
     * the rules below. */
    if (!(flags & (SS_ASLEEP | SS_ONCPU)) && t->has_last) {
        long long voluntary = voluntary_switches(t);
        /* (a stop is a voluntary switch to the kernel: it counts, and is no wait) */
        if (state_is_stopped(state) || (voluntary >= 0 && voluntary == t->voluntary)) flags |= SS_PREEMPTED;
        t->voluntary = voluntary;
    }
    /* Parked by the hand-off to the feeder: a thread that held the GIL during the
     * feeder's turn with it (from when the feeder's wait ends, so from its request
     * on) hands it over at its first eval-breaker check after the request (right
     * after a long C call that kept it), and is found there without the GIL until
     * it has it back: not asleep but waiting for a core (or preempted by the
     * feeder it woke). Its CPU since its last sample ran before that point. Not a
     * thread found holding the GIL: preempted where it runs. Nor one found on a
     * core without it, nor one that did not hold it as the turn began: computing
     * in a C call that lets the GIL go (hashlib on a large buffer), which the
     * feeder does not stop; from a thread on a core without the GIL no hand-off is
     * pending any more (taken for one, the io_mix benchmark's 64 KiB hashlib
     * updates got 19-21% of the CPU for 29%). (gilholder.h) */
    int holds_gil = ss_gil_held_by(t->tstate) == 1;
    int in_turn = rec.wall_ns >= __atomic_load_n(&e->feeder_due_ns, __ATOMIC_RELAXED);
    if (in_turn && (holds_gil || t->held_gil)) t->handed_over = 1;
    else if (!in_turn && holds_gil) t->handed_over = 0;
    if (!holds_gil && (flags & SS_ONCPU)) t->handed_over = 0;
    t->held_gil = holds_gil;
    if (!(flags & (SS_ASLEEP | SS_ONCPU | SS_PREEMPTED)) && t->handed_over && !holds_gil) flags |= SS_PARKED;
    rec.flags = flags;
    rec.base = base;
    rec.nframes = (uint32_t)depth;
    if (nmarks > 0) {
        /* The marks of this thread whose frames are on the stack just read, innermost
         * first (a suspended generator's marks stay on the stack but not its frame). */
        const ss_mark *copied = e->marks_copy;
        uint32_t kept = 0;
        for (uint32_t i = (uint32_t)nmarks; i-- > 0;) {
            for (int d = 0; d < depth; d++) {
                if (e->addrs[d] == copied[i].frame) {
                    e->marks_out[kept++] = copied[i].entry;
                    break;
                }
            }
        }
        rec.nmarks = kept;
    }
    if (e->shadow) use_shadow(e, t, &rec);
    file_read(e, t, &rec, e->frames, e->marks_out);
    t->has_last = 1;
    /* (the clock before the walk: a thread that ran while it was read may have left
     * the stack read, and must be read again even if it has not run since; seen: a
     * thread read as it went to sleep kept the stack before its nap for all of it) */
    t->last_cpu = cpu;
}

/* ---- the collector thread ------------------------------------------------------ */

static void take_pending(Engine *e);

/* End the feeder's wait now (from the collector or from Python). */
static void wake_feeder(Engine *e) {
    pthread_mutex_lock(&e->feeder_lock);
    e->feeder_kicked = 1;
    pthread_cond_signal(&e->feeder_cond);
    pthread_mutex_unlock(&e->feeder_lock);
}

/* Whether the thread state at `tstate`, numbered `state_id`, is one the collector
 * reads. By its number too: a thread started as another ends gets its thread state's
 * memory (and often its pthread id), and taken for the old target, which the
 * collector still read until it learnt that thread had ended, it was not looked up:
 * a thread of 100 ms started with _thread right after another one ended was never
 * sampled, once in CI. */
static int is_target(Engine *e, uintptr_t tstate, uint64_t state_id) {
    for (Py_ssize_t i = 0; i < e->n_targets; i++)
        if (e->targets[i].tstate == tstate && e->targets[i].state_id == state_id && !e->targets[i].gone) return 1;
    return 0;
}

/* The feeder takes its turn (and the GIL) only every REFRESH_STATIC seconds while
 * nothing needs it sooner; the collector wakes it at once for what does: a thread
 * starting (to look up: threadwatch.h) and a buffer half full (drained before it
 * fills, however many threads are read and however deep). For threads, at most once
 * per SS_THREAD_WAKE_GAP, as often as the feeder looked for them before: a program
 * whose C threads call Python through a fresh thread state each time (a callback
 * from a foreign thread) changes the newest state at every call, and must not get
 * a turn of the feeder at every tick. (The feeder itself looks again every 2 ms
 * while it sees a thread starting.)
 *
 * Only for a newest thread that runs Python and is not read yet: a thread started
 * with threading announces itself as it starts (add_target) and is read from then
 * on, and one that has not called Python yet has nothing to read (it is looked at
 * again at the next tick). Woken at every change of the newest state instead, for
 * each thread as it was made and again as it ended (the newest state is then an
 * older one), the feeder took 3.6 turns with the GIL for each thread a program
 * started: three threads started every 90 ms lost 2.6% of their time at 5 ms, the
 * same three kept running 1.0%; now both about 0.3%. */
static void tick(Engine *e) {
    /* (the code fingerprints' period: all are read again at its turn, see code_identity) */
    uint32_t period = (uint32_t)(mono_ns() / e->code_fresh_ns) + 1;
    e->code_epoch = period ? period : 1;
    take_pending(e);
    for (Py_ssize_t i = 0; i < e->n_targets; i++) sample_target(e, &e->targets[i]);
    e->ticks++;
    int wake = 0;
    if (__atomic_load_n(&e->watch_threads, __ATOMIC_RELAXED)) {
        uintptr_t head;
        int framed;
        uint64_t state_id;
        uint64_t newest = ss_newest_thread(&e->reader, e->interp, &head, &framed, &state_id);
        if (newest != e->newest_thread) {
            e->newest_thread = newest;
            e->thread_news = 1;
        }
        if (e->thread_news && head != 0 && is_target(e, head, state_id)) e->thread_news = 0;
        int64_t now = mono_ns();
        if (e->thread_news && (framed || head == 0) && now - e->thread_wake_ns >= SS_THREAD_WAKE_GAP) {
            e->thread_news = 0;
            e->thread_wake_ns = now;
            wake = 1;
        }
    }
    if (!e->half_full_told && e->active.used > e->active.cap / 2) {
        e->half_full_told = 1;
        wake = 1;
    }
    if (wake) wake_feeder(e);
}

/* Ask the kernel for a short time slice (Linux 6.12 and later, unprivileged), so
 * that the collector, woken on a core where a thread of the program runs, gets the
 * core at once for its tick instead of after the running thread's slice.
 * Measured on a 2-core VM, 8 busy threads, 1 ms: with the default slice (or
 * SCHED_BATCH) the timer often woke the collector on the busy core while the other
 * was idle, and 8% of its wake-ups waited 1-5 ms for it (perf sched timehist): 82-88%
 * of the requested rate. With a 0.1 ms slice: 96-99%. The tick is short (tens of
 * microseconds), so the thread it displaces loses that much, and only when the
 * wake-up lands on its core. Older kernels ignore the slice and keep their own
 * wake-up rules; a refusal (a seccomp filter) leaves the default. Returns 1 if the
 * kernel gave the slice. */
static int ask_short_slice(void) {
#if defined(__linux__) && defined(SYS_sched_setattr)
    struct {
        uint32_t size, policy;
        uint64_t flags;
        int32_t nice;
        uint32_t priority;
        uint64_t runtime, deadline, period;  /* runtime: the slice, for SCHED_OTHER */
    } attr;
    /* (only for a thread of the default policy, and at its own nice value: never a
     * change of priority, up or down, which the program chose for its threads) */
    if (sched_getscheduler(0) != SCHED_OTHER) return 0;
    errno = 0;
    int nice = getpriority(PRIO_PROCESS, 0);  /* the calling thread's, on Linux */
    if (nice == -1 && errno != 0) return 0;
    memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.policy = SCHED_OTHER;
    attr.nice = nice;
    attr.runtime = 100000;  /* ns: the shortest slice the kernel allows */
    if (syscall(SYS_sched_setattr, 0, &attr, 0) != 0) return 0;
    /* a kernel without custom slices takes the call and ignores the runtime; one with
     * them reports the slice back */
    memset(&attr, 0, sizeof attr);
    if (syscall(SYS_sched_getattr, 0, &attr, sizeof attr, 0) != 0) return 0;
    return attr.runtime == 100000;
#else
    return 0;
#endif
}

/* Where in its slot of `delay` the next tick falls: a point drawn uniformly from
 * [0, delay), by a xorshift64* generator of the collector's own (`state`). Ticks a
 * fixed `delay` apart lock onto a program that repeats at a fixed period: a loop on a
 * 4 ms grid parsing for 1 ms and responding for 1 ms, sampled every 1 ms, had its
 * parsing charged 33-56% of the CPU for 50% under 'split' and 9-32% under 'end' in 6
 * runs of 2 s, and, sampled every 5 ms on a 10 ms grid, its responder none at all in
 * one run of 4: every tick fell at the same two points of the loop. Drawn in each
 * slot, a tick is as likely to fall at any point of any period (a period of k
 * delays: the slot is one of k, the point in it uniform), and the rate stays one
 * tick a delay (ticks are 0 to 2 delays apart, one apart on average). The interval
 * rules assume just that: that where the work changes falls anywhere in an interval. */
static int64_t tick_offset(uint64_t *state, int64_t delay) {
    if (delay <= 0) return 0;
    uint64_t x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return (int64_t)((x * 0x2545F4914F6CDD1DULL) % (uint64_t)delay);
}

static void *collector_main(void *arg) {
    Engine *e = (Engine *)arg;
    /* slot: where the current slot of `delay` begins (0: at the next pass, a new run
     * of ticks, its first tick at once); deadline: the tick's point in it */
    int64_t slot = 0, deadline = 0;
    uint64_t draws = (uint64_t)mono_ns() ^ ((uint64_t)(uintptr_t)e << 16) ^ 0x9E3779B97F4A7C15ULL;
    if (draws == 0) draws = 1;
    int short_slice = ask_short_slice();
    pthread_mutex_lock(&e->lock);
    e->short_slice = short_slice;
    while (!e->stopped) {
        if (e->paused) {
            pthread_cond_wait(&e->wake, &e->lock);
            slot = 0;
            continue;
        }
        int64_t now = mono_ns();
        if (slot == 0) slot = deadline = now;
        if (now < deadline) {
            struct timespec until = {(time_t)(deadline / 1000000000), (long)(deadline % 1000000000)};
            pthread_cond_timedwait(&e->wake, &e->lock, &until);
            continue;
        }
        int64_t delay = e->delay_ns;
        int64_t lateness = now - deadline;
        if (delay > 0) {
            if (lateness > delay / 2) e->late_ticks++;
            if (lateness >= delay) {
                int64_t skipped = lateness / delay;
                e->missed_ticks += (uint64_t)skipped;
                slot += skipped * delay;
            }
        }
        tick(e);
        slot += delay > 0 ? delay : 0;
        deadline = slot + tick_offset(&draws, delay);
        if (delay <= 0) {  /* back to back: let the lock go between ticks */
            pthread_mutex_unlock(&e->lock);
            sched_yield();
            pthread_mutex_lock(&e->lock);
        }
    }
    /* Deadlines that passed while the thread waited to be scheduled, unseen because
     * the stop came first, are missed ticks too: the achieved rate must say so. */
    int64_t delay = e->delay_ns;
    int64_t end = mono_ns();
    if (!e->paused && slot != 0 && delay > 0 && end - deadline >= delay)
        e->missed_ticks += (uint64_t)((end - deadline) / delay);
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) == 0) e->final_cpu = ts.tv_sec + ts.tv_nsec * 1e-9;
    e->thread_running = 0;
    pthread_mutex_unlock(&e->lock);
    return NULL;
}

/* ---- Python interface ---------------------------------------------------------- */

/* The refusals ss_read_probe met, as a line: "process_vm_readv: <error>", and
 * "; /proc/self/mem: <error>" where that was refused too (new reference). */
static PyObject *read_refusals(int vm_errno, int mem_errno) {
    if (mem_errno == 0) return PyUnicode_FromFormat("process_vm_readv: %s", strerror(vm_errno));
    return PyUnicode_FromFormat("process_vm_readv: %s; /proc/self/mem: %s", strerror(vm_errno), strerror(mem_errno));
}

static int init_sync(Engine *e) {
    pthread_condattr_t attr;
    if (pthread_mutex_init(&e->lock, NULL) != 0) return -1;
    if (pthread_mutex_init(&e->pending_lock, NULL) != 0) return -1;
    if (pthread_condattr_init(&attr) != 0) return -1;
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int rc = pthread_cond_init(&e->wake, &attr);
    if (rc == 0) rc = pthread_cond_init(&e->feeder_cond, &attr);
    pthread_condattr_destroy(&attr);
    if (rc == 0) rc = pthread_mutex_init(&e->feeder_lock, NULL);
    e->feeder_kicked = 0;
    return rc == 0 ? 0 : -1;
}

static void free_buffers(Engine *e) {
    PyMem_RawFree(e->active.data);
    PyMem_RawFree(e->spare.data);
    PyMem_RawFree(e->frames);
    PyMem_RawFree(e->addrs);
    PyMem_RawFree(e->framesizes);
    PyMem_RawFree(e->frames_kept);
    PyMem_RawFree(e->marks_copy);
    PyMem_RawFree(e->marks_out);
    PyMem_RawFree(e->chunk_copy);
    PyMem_RawFree(e->older_copy);
    PyMem_RawFree(e->codes);
    PyMem_RawFree(e->copied);
    PyMem_RawFree(e->code_generations);
    PyMem_RawFree(e->name_copy);
    PyMem_RawFree(e->file_copy);
    PyMem_RawFree(e->table_copy);
    PyMem_RawFree(e->shadow_copy);
    e->shadow_copy = NULL;
    for (Py_ssize_t j = 0; e->targets && j < e->n_targets; j++) close_target(&e->targets[j]);
    PyMem_RawFree(e->targets);
    e->n_targets = 0;
    e->active.data = e->spare.data = NULL;
    e->frames = NULL;
    e->addrs = NULL;
    e->framesizes = NULL;
    e->frames_kept = NULL;
    e->marks_copy = NULL;
    e->marks_out = NULL;
    e->chunk_copy = NULL;
    e->older_copy = NULL;
    e->codes = NULL;
    e->copied = NULL;
    e->code_generations = NULL;
    e->name_copy = e->file_copy = e->table_copy = NULL;
    e->targets = NULL;
}

static int Engine_init(Engine *e, PyObject *args, PyObject *kw) {
    static char *names[] = {"delay", "buffer_bytes", "marks", NULL};
    double delay;
    Py_ssize_t buffer_bytes = SS_DEFAULT_BUFFER;
    int marks = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "d|np", names, &delay, &buffer_bytes, &marks)) return -1;
    if (!(delay >= 0 && delay <= 86400.0)) {
        PyErr_SetString(PyExc_ValueError, "delay must be between 0 and 86400 seconds");
        return -1;
    }
    if (buffer_bytes < 65536) buffer_bytes = 65536;
    if (e->active.data != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "an Engine is initialised once");
        return -1;
    }
    int vm_errno, mem_errno;
    int way = ss_read_probe(&vm_errno, &mem_errno);
    if (way == SS_READ_NONE) {  /* (sampler.engines says so before a sampler is made) */
        PyObject *why = read_refusals(vm_errno, mem_errno);
        if (why != NULL) {
            PyErr_Format(PyExc_OSError, "this process cannot read its own memory: %U", why);
            Py_DECREF(why);
        }
        return -1;
    }
    e->delay_ns = (int64_t)(delay * 1e9);
    e->want_marks = marks;
    e->feeder_due_ns = INT64_MAX;
    e->active.cap = e->spare.cap = (size_t)buffer_bytes;
    e->active.data = PyMem_RawMalloc((size_t)buffer_bytes);
    e->spare.data = PyMem_RawMalloc((size_t)buffer_bytes);
    e->frames = PyMem_RawMalloc(sizeof(ss_entry) * SS_MAX_DEPTH);
    e->addrs = PyMem_RawMalloc(sizeof(uintptr_t) * SS_MAX_DEPTH);
    e->framesizes = PyMem_RawMalloc(sizeof(int32_t) * SS_MAX_DEPTH);
    e->frames_kept = PyMem_RawMalloc(sizeof(ss_entry) * SS_MAX_DEPTH);
    e->marks_copy = PyMem_RawMalloc(sizeof(ss_mark) * SS_MAX_MARKS);
    e->marks_out = PyMem_RawMalloc(sizeof(uint32_t) * SS_MAX_MARKS);
    e->chunk_copy = PyMem_RawMalloc(SS_CHUNK_COPY_MAX);
    e->older_copy = PyMem_RawMalloc(SS_CHUNK_COPY_MAX);
    e->codes = PyMem_RawCalloc(SS_CODE_CACHE, sizeof(ss_code_slot));
    e->copied = PyMem_RawCalloc(SS_COPIED, sizeof(ss_copied_slot));
    e->code_generations = PyMem_RawCalloc(SS_CODE_GENERATIONS, sizeof(uint32_t));
    e->name_copy = PyMem_RawMalloc(SS_NAME_MAX * 4);
    e->file_copy = PyMem_RawMalloc(SS_NAME_MAX * 4);
    e->table_copy = PyMem_RawMalloc(SS_TABLE_MAX);
    if (!e->active.data || !e->spare.data || !e->frames || !e->addrs || !e->framesizes || !e->frames_kept ||
        !e->marks_copy || !e->marks_out || !e->chunk_copy || !e->older_copy || !e->codes || !e->copied || !e->code_generations || !e->name_copy ||
        !e->file_copy || !e->table_copy) {
        free_buffers(e);
        PyErr_NoMemory();
        return -1;
    }
    e->epoch = 1;
    e->code_epoch = 1;
    e->interp = PyInterpreterState_Get();
    ss_reader_init(&e->reader);
    ss_reader_use(&e->reader, way);
    if (init_sync(e) != 0) {
        free_buffers(e);
        PyErr_SetString(PyExc_OSError, "cannot create the engine's lock");
        return -1;
    }
    e->walk_dead_from = UINT64_MAX;
    e->watching_codes = ss_code_watch_start(&e->dead_seen);
    e->code_fresh_ns = e->watching_codes ? SS_CODE_FRESH_WATCHED_NS : SS_CODE_FRESH_NS;
    return 0;
}

static PyObject *Engine_start(Engine *e, PyObject *unused) {
    if (e->active.data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Engine not initialised");
        return NULL;
    }
    if (e->thread_started) {
        PyErr_SetString(PyExc_RuntimeError, "the engine's thread was already started");
        return NULL;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    /* Block every signal in the collector: the program's handlers must run in its
     * own threads, and no system call here should be interrupted. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    e->thread_running = 1;
    int rc = pthread_create(&e->thread, &attr, collector_main, e);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        e->thread_running = 0;
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    e->thread_started = 1;
    e->has_thread_clock = pthread_getcpuclockid(e->thread, &e->thread_clock) == 0;
    Py_RETURN_NONE;
}

/* Lock the engine from Python. The collector holds the lock for a tick and never
 * needs the GIL, so waiting cannot deadlock; but a tick over a deep stack takes a
 * while, and the program should not wait for it with the GIL held: when the lock is
 * taken, wait with the GIL released. Nor may the lock be held while this thread
 * waits to take the GIL back: with busy threads that wait lasts a switch interval or
 * more, and the collector, blocked on the lock meanwhile, misses its deadlines (seen:
 * 8 busy threads, 1 ms, one more thread reading the engine's stats in a loop: 3-24%
 * of the ticks taken, the rest missed). So wait for the lock to be free, let it go,
 * take the GIL back, and try again; after a few tries keep it (a collector that ticks
 * back to back, delay 0, leaves it free only between ticks: the wait must end). */
static void lock_from_python(Engine *e) {
    for (int tries = 1; pthread_mutex_trylock(&e->lock) != 0; tries++) {
        int keep = tries >= 4;
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&e->lock);
        if (!keep) pthread_mutex_unlock(&e->lock);
        Py_END_ALLOW_THREADS
        if (keep) return;
    }
}
#define LOCK(e) lock_from_python(e)
#define UNLOCK(e) pthread_mutex_unlock(&(e)->lock)

static PyObject *Engine_stop(Engine *e, PyObject *unused) {
    int join = 0;
    LOCK(e);
    e->stopped = 1;
    join = e->thread_started;
    e->thread_started = 0;
    pthread_cond_signal(&e->wake);
    UNLOCK(e);
    if (join) {
        Py_BEGIN_ALLOW_THREADS
        pthread_join(e->thread, NULL);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

/* feeder_wait(seconds) -> woken: the feeder's wait between its turns, with the GIL
 * released; it ends after `seconds`, or earlier when the collector or Python wakes
 * it (wake_feeder; then True). The turn with the GIL begins as the wait ends (the
 * feeder asks for the GIL then), and feeder_turn_over() says when it is over: a
 * thread that held the GIL during it is PARKED while found without it, awake (see
 * sample_target). */
static PyObject *Engine_feeder_wait(Engine *e, PyObject *arg) {
    double seconds = PyFloat_AsDouble(arg);
    if (seconds == -1.0 && PyErr_Occurred()) return NULL;
    if (!(seconds >= 0 && seconds < 1e6)) {
        PyErr_SetString(PyExc_ValueError, "feeder_wait: seconds must be in [0, 1e6)");
        return NULL;
    }
    int64_t until = mono_ns() + (int64_t)(seconds * 1e9);
    int woken;
    __atomic_store_n(&e->feeder_due_ns, until, __ATOMIC_RELAXED);
    Py_BEGIN_ALLOW_THREADS
    struct timespec ts = {(time_t)(until / 1000000000), (long)(until % 1000000000)};
    pthread_mutex_lock(&e->feeder_lock);
    /* (a spurious return waits again until the deadline; the deadline, or any error,
     * ends the wait: never a loop that spins) */
    while (!e->feeder_kicked && pthread_cond_timedwait(&e->feeder_cond, &e->feeder_lock, &ts) == 0)
        ;
    woken = e->feeder_kicked;
    e->feeder_kicked = 0;
    pthread_mutex_unlock(&e->feeder_lock);
    if (woken) __atomic_store_n(&e->feeder_due_ns, mono_ns(), __ATOMIC_RELAXED);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(woken);
}

/* wake_feeder(): end the feeder's current or next wait at once. */
static PyObject *Engine_wake_feeder(Engine *e, PyObject *Py_UNUSED(ignored)) {
    wake_feeder(e);
    Py_RETURN_NONE;
}

/* watch_threads(on): wake the feeder whenever a thread state is made (threadwatch.h). */
static PyObject *Engine_watch_threads(Engine *e, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    __atomic_store_n(&e->watch_threads, on, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

static PyObject *Engine_feeder_turn_over(Engine *e, PyObject *Py_UNUSED(ignored)) {
    __atomic_store_n(&e->feeder_due_ns, INT64_MAX, __ATOMIC_RELAXED);
    Py_RETURN_NONE;
}

/* set_shadow(on): sample the shadow stacks (use_errortrace) instead of the frames. */
static PyObject *Engine_set_shadow(Engine *e, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    if (e->active.data == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Engine not initialised");
        return NULL;
    }
    if (on && e->shadow_copy == NULL) {
        e->shadow_copy = PyMem_RawMalloc(sizeof(uintptr_t) * SS_SHADOW_MAX);
        if (e->shadow_copy == NULL) return PyErr_NoMemory();
    }
    LOCK(e);
    e->shadow = on;
    UNLOCK(e);
    Py_RETURN_NONE;
}

static PyObject *Engine_set_state(Engine *e, PyObject *args) {
    double delay;
    int paused;
    if (!PyArg_ParseTuple(args, "dp", &delay, &paused)) return NULL;
    if (!(delay >= 0 && delay <= 86400.0)) {
        PyErr_SetString(PyExc_ValueError, "delay must be between 0 and 86400 seconds");
        return NULL;
    }
    LOCK(e);
    e->delay_ns = (int64_t)(delay * 1e9);
    if (paused && !e->paused) {
        for (Py_ssize_t i = 0; i < e->n_targets; i++) e->targets[i].has_last = 0;
    }
    e->paused = paused;
    pthread_cond_signal(&e->wake);
    UNLOCK(e);
    Py_RETURN_NONE;
}

/* One (ctx, tstate, ident, clock or None[, tid]) tuple into *t. */
static int parse_target(PyObject *item, ss_target *t) {
    PyObject *clock = NULL;
    unsigned long long tstate;
    unsigned long ident;
    unsigned int ctx;
    long tid = 0;
    memset(t, 0, sizeof *t);
    t->stat_fd = t->status_fd = -1;
    t->voluntary = -1;
    if (!PyArg_ParseTuple(item, "IKkO|l", &ctx, &tstate, &ident, &clock, &tid)) return -1;
    t->ctx = ctx;
    t->tid = tid;
    t->tstate = (uintptr_t)tstate;
    t->ident = ident;
    if (clock != Py_None) {
        long c = PyLong_AsLong(clock);
        if (c == -1 && PyErr_Occurred()) return -1;
        t->clock = (clockid_t)c;
        t->has_clock = 1;
    }
    return 0;
}

/* add_target((ctx, tstate, ident, clock or None, tid)): a thread announced as it
 * starts, read from the next tick on. It never waits for a tick to end (the tick may
 * be long with thousands of threads): it goes to a small queue the tick takes from. */
static PyObject *Engine_add_target(Engine *e, PyObject *arg) {
    ss_target t;
    if (parse_target(arg, &t) != 0) return NULL;
    int added = 0;
    pthread_mutex_lock(&e->pending_lock);
    if (e->n_pending < (int)(sizeof e->pending / sizeof e->pending[0])) {
        e->pending[e->n_pending++] = t;
        added = 1;
    }
    pthread_mutex_unlock(&e->pending_lock);
    return PyBool_FromLong(added);  /* False: the queue is full; the next refresh adds it */
}

/* Whether the targets hold `t` already (the same context and thread state). */
static int has_target(const Engine *e, const ss_target *t) {
    for (Py_ssize_t i = 0; i < e->n_targets; i++)
        if (e->targets[i].ctx == t->ctx && e->targets[i].tstate == t->tstate) return 1;
    return 0;
}

/* Move announced threads into the targets (collector side, engine lock held). One
 * the feeder's list has named since it announced itself is there already: taken
 * again, it was read twice at every tick until the next list (a thread started
 * just after the sampler: every tick of its first 250 ms, 63 walks more than the
 * 401 ticks of a 1.6 s run). */
static void take_pending(Engine *e) {
    if (__atomic_load_n(&e->n_pending, __ATOMIC_RELAXED) == 0) return;
    pthread_mutex_lock(&e->pending_lock);
    int n = e->n_pending;
    ss_target *grown = n ? PyMem_RawRealloc(e->targets, sizeof(ss_target) * (size_t)(e->n_targets + n)) : NULL;
    if (grown != NULL) {
        e->targets = grown;
        for (int j = 0; j < n; j++) {
            if (has_target(e, &e->pending[j])) close_target(&e->pending[j]);
            else e->targets[e->n_targets++] = e->pending[j];
        }
        e->n_pending = 0;
    }
    pthread_mutex_unlock(&e->pending_lock);
}

/* set_targets([(ctx, tstate, ident, clock or None, tid), ...]) */
static PyObject *Engine_set_targets(Engine *e, PyObject *arg) {
    PyObject *seq = PySequence_Fast(arg, "set_targets takes a sequence of tuples");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    ss_target *fresh = PyMem_RawCalloc(n ? (size_t)n : 1, sizeof(ss_target));
    if (fresh == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parse_target(PySequence_Fast_GET_ITEM(seq, i), &fresh[i]) != 0) {
            PyMem_RawFree(fresh);
            Py_DECREF(seq);
            return NULL;
        }
    }
    Py_DECREF(seq);
    LOCK(e);
    flush_held_all(e);
    /* keep what is known of targets that stay (same context, same thread state) */
    for (Py_ssize_t i = 0; i < n; i++) {
        for (Py_ssize_t j = 0; j < e->n_targets; j++) {
            ss_target *old = &e->targets[j];
            if (old->ctx == fresh[i].ctx && old->tstate == fresh[i].tstate && old->ident == fresh[i].ident) {
                fresh[i].has_last = old->has_last;
                fresh[i].last_cpu = old->last_cpu;
                fresh[i].held_gil = old->held_gil;
                fresh[i].handed_over = old->handed_over;
                fresh[i].cframe = old->cframe;
                fresh[i].chunk_hint = old->chunk_hint;
                fresh[i].chunk_hint_bytes = old->chunk_hint_bytes;
                fresh[i].outside_hint = old->outside_hint;
                fresh[i].since_asleep = old->since_asleep;
                fresh[i].last_off = old->last_off;  /* (its last sample, if still in the buffer) */
                fresh[i].last_epoch = old->last_epoch;
                fresh[i].gone = old->gone && old->clock == fresh[i].clock;
                if (old->tid == fresh[i].tid) {  /* the same thread: keep its open stat file */
                    fresh[i].stat_fd = old->stat_fd;
                    fresh[i].status_fd = old->status_fd;
                    fresh[i].voluntary = old->voluntary;
                    old->stat_fd = old->status_fd = -1;
                }
                break;
            }
        }
    }
    ss_target *old = e->targets;
    Py_ssize_t n_old = e->n_targets;
    e->targets = fresh;
    e->n_targets = n;
    pthread_mutex_lock(&e->pending_lock);
    for (int j = 0; j < e->n_pending; j++) {  /* announced but not in the new list: keep */
        int known = 0;
        for (Py_ssize_t i = 0; i < n && !known; i++) known = fresh[i].ctx == e->pending[j].ctx;
        if (known) e->pending[j--] = e->pending[--e->n_pending];
    }
    pthread_mutex_unlock(&e->pending_lock);
    UNLOCK(e);
    for (Py_ssize_t j = 0; j < n_old; j++) close_target(&old[j]);
    PyMem_RawFree(old);
    Py_RETURN_NONE;
}

static PyObject *unpack_sample(const char *p, const ss_record *rec) {
    size_t frames_bytes = (size_t)rec->nframes * sizeof(ss_entry);
    PyObject *frames;
    if (rec->flags & SS_REPEAT) {
        frames = Py_None;
        Py_INCREF(frames);
    } else {
        frames = PyBytes_FromStringAndSize(p, (Py_ssize_t)frames_bytes);
        if (frames == NULL) return NULL;
    }
    PyObject *marks = PyTuple_New(rec->nmarks);
    if (marks == NULL) {
        Py_DECREF(frames);
        return NULL;
    }
    const uint32_t *m = (const uint32_t *)(p + frames_bytes);
    for (uint32_t i = 0; i < rec->nmarks; i++) {
        PyObject *v = PyLong_FromUnsignedLong(m[i]);
        if (v == NULL) {
            Py_DECREF(frames);
            Py_DECREF(marks);
            return NULL;
        }
        PyTuple_SET_ITEM(marks, i, v);
    }
    return Py_BuildValue("(IILLLKNN)", rec->ctx, rec->flags, (long long)rec->read_ns, (long long)rec->wall_ns,
                         (long long)rec->cpu_ns,
                         (unsigned long long)rec->base, frames, marks);
}

static PyObject *unpack_code(const char *p, const ss_code_record *rec) {
    return Py_BuildValue("(KIiIby#by#y#)", (unsigned long long)rec->code, rec->fingerprint, rec->firstlineno,
                         rec->code_bytes, (char)rec->name_kind, p, (Py_ssize_t)rec->name_bytes,
                         (char)rec->file_kind, p + rec->name_bytes, (Py_ssize_t)rec->file_bytes,
                         p + rec->name_bytes + rec->file_bytes, (Py_ssize_t)rec->table_bytes);
}

/* drain() -> (samples, codes): samples as (ctx, flags, read_ns, wall_ns, cpu_ns, base, frames
 * bytes or None, marks tuple); codes as (address, fingerprint, firstlineno,
 * code_bytes, name_kind, name, file_kind, file, line_table). */
static PyObject *Engine_drain(Engine *e, PyObject *unused) {
    ss_buffer full;
    LOCK(e);
    flush_held_all(e);
    full = e->active;
    e->active = e->spare;
    e->active.used = 0;
    e->half_full_told = 0;
    e->epoch++;
    if (e->epoch == 0) e->epoch = 1;
    UNLOCK(e);
    PyObject *samples = PyList_New(0), *codes = PyList_New(0), *out = NULL;
    size_t pos = 0;
    while (samples && codes && pos + sizeof(uint32_t) <= full.used) {
        uint32_t tag;
        memcpy(&tag, full.data + pos, sizeof tag);
        PyObject *item;
        PyObject *list;
        if (tag == SS_TAG_SAMPLE) {
            ss_record rec;
            memcpy(&rec, full.data + pos, sizeof rec);
            pos += sizeof rec;
            item = unpack_sample(full.data + pos, &rec);
            pos += (size_t)rec.nframes * sizeof(ss_entry) + (((size_t)rec.nmarks * sizeof(uint32_t) + 7) & ~(size_t)7);
            list = samples;
        } else {
            ss_code_record rec;
            memcpy(&rec, full.data + pos, sizeof rec);
            pos += sizeof rec;
            item = unpack_code(full.data + pos, &rec);
            pos += ((size_t)rec.name_bytes + rec.file_bytes + rec.table_bytes + 7) & ~(size_t)7;
            list = codes;
        }
        if (item == NULL || PyList_Append(list, item) != 0) {
            Py_XDECREF(item);
            Py_CLEAR(samples);
            break;
        }
        Py_DECREF(item);
    }
    if (samples && codes) out = PyTuple_Pack(2, samples, codes);
    Py_XDECREF(samples);
    Py_XDECREF(codes);
    LOCK(e);
    full.used = 0;
    e->spare = full;
    UNLOCK(e);
    return out;
}

/* Python forgot the names it had: send each code object's again when next met. */
static PyObject *Engine_forget_codes(Engine *e, PyObject *unused) {
    LOCK(e);
    memset(e->copied, 0, sizeof(ss_copied_slot) * SS_COPIED);
    UNLOCK(e);
    Py_RETURN_NONE;
}

static PyObject *Engine_stats(Engine *e, PyObject *unused) {
    /* copied under the lock, turned into Python values after it: nothing that may
     * allocate (and so run a collection, and Python code) while the collector waits */
    LOCK(e);
    unsigned long long n[21] = {e->ticks, e->late_ticks, e->missed_ticks, e->torn, e->lost,
                                e->samples, e->walks, e->reads_failed, e->shadow_reads, e->shadow_misses,
                                e->reader.calls, e->sleep_asks, e->walks_running, e->found_asleep,
                                e->torn_reads, e->codes_forgotten, e->slow_walks_torn, e->walks_lost_code,
                                e->slow_walks, e->tops_left_out, e->tops_read_again};
    int running = e->thread_running, short_slice = e->short_slice, code_watch = e->watching_codes;
    long long code_refresh_ns = (long long)e->code_fresh_ns;
    const char *read_via = e->reader.use_pread ? "/proc/self/mem" : "process_vm_readv";
    Py_ssize_t buffer_bytes = (Py_ssize_t)e->active.cap;
    double cpu = e->final_cpu;
    if (running && e->has_thread_clock) {
        struct timespec ts;
        if (clock_gettime(e->thread_clock, &ts) == 0) cpu = ts.tv_sec + ts.tv_nsec * 1e-9;
    }
    UNLOCK(e);
    PyObject *d = Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsisisisLsnss}", "ticks", n[0], "late_ticks", n[1], "missed_ticks", n[2],
        "torn_samples", n[3], "lost_samples", n[4], "samples", n[5], "walks", n[6], "failed_reads", n[7],
        "shadow_reads", n[8], "shadow_misses", n[9], "read_calls", n[10], "sleep_asks", n[11],
        "walks_running", n[12], "found_asleep", n[13], "torn_reads", n[14], "codes_forgotten", n[15],
        "slow_walks_torn", n[16], "walks_lost_code", n[17], "slow_walks", n[18],
        "tops_left_out", n[19], "tops_read_again", n[20],
        "running", running, "short_slice", short_slice, "code_watch", code_watch,
        "code_refresh_ns", code_refresh_ns, "buffer_bytes", buffer_bytes, "read_via", read_via);
    if (d == NULL) return NULL;
    PyObject *v = PyFloat_FromDouble(cpu);
    if (v == NULL || PyDict_SetItemString(d, "collector_cpu", v) != 0) {
        Py_XDECREF(v);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(v);
    return d;
}

/* In a forked child the collector thread does not exist and the lock may be held
 * by it forever: make the engine inert (stopped, fresh lock, own pid). */
static PyObject *Engine_forget_after_fork(Engine *e, PyObject *unused) {
    init_sync(e);
    e->thread_started = 0;
    e->thread_running = 0;
    e->stopped = 1;
    e->final_cpu = 0.0;
    ss_reader_close(&e->reader);
    ss_reader_init(&e->reader);
    Py_RETURN_NONE;
}

static void Engine_dealloc(Engine *e) {
    if (e->thread_started) {
        pthread_mutex_lock(&e->lock);
        e->stopped = 1;
        pthread_cond_signal(&e->wake);
        UNLOCK(e);
        pthread_join(e->thread, NULL);
        e->thread_started = 0;
    }
    if (e->active.data != NULL) {
        pthread_mutex_destroy(&e->lock);
        pthread_mutex_destroy(&e->pending_lock);
        pthread_cond_destroy(&e->wake);
        pthread_mutex_destroy(&e->feeder_lock);
        pthread_cond_destroy(&e->feeder_cond);
    }
    ss_reader_close(&e->reader);
    free_buffers(e);
    if (e->watching_codes) ss_code_watch_stop();
    e->watching_codes = 0;
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyMethodDef Engine_methods[] = {
    {"start", (PyCFunction)Engine_start, METH_NOARGS, "Start the collector thread."},
    {"stop", (PyCFunction)Engine_stop, METH_NOARGS, "Stop the collector thread and wait for it."},
    {"set_state", (PyCFunction)Engine_set_state, METH_VARARGS, "set_state(delay, paused)"},
    {"set_shadow", (PyCFunction)Engine_set_shadow, METH_O, "set_shadow(on): sample the shadow stacks"},
    {"feeder_wait", (PyCFunction)Engine_feeder_wait, METH_O,
     "feeder_wait(seconds) -> woken: wait, without the GIL, until the feeder's turn (threads "
     "found neither running nor asleep from then on are PARKED); True if woken early"},
    {"wake_feeder", (PyCFunction)Engine_wake_feeder, METH_NOARGS,
     "wake_feeder(): end the feeder's current or next wait at once"},
    {"watch_threads", (PyCFunction)Engine_watch_threads, METH_O,
     "watch_threads(on): wake the feeder whenever a thread state is made"},
    {"feeder_turn_over", (PyCFunction)Engine_feeder_turn_over, METH_NOARGS,
     "feeder_turn_over(): the feeder has let the GIL go"},
    {"set_targets", (PyCFunction)Engine_set_targets, METH_O,
     "set_targets([(ctx, tstate, ident, clock or None), ...]): the threads to sample."},
    {"add_target", (PyCFunction)Engine_add_target, METH_O,
     "add_target((ctx, tstate, ident, clock or None, tid)): a thread that has just started."},
    {"drain", (PyCFunction)Engine_drain, METH_NOARGS,
     "drain() -> (samples, codes): what the collector took since the last drain."},
    {"stats", (PyCFunction)Engine_stats, METH_NOARGS, "Counters and the collector's own CPU seconds."},
    {"forget_codes", (PyCFunction)Engine_forget_codes, METH_NOARGS,
     "Send every code object's names again when next met (after Python forgot them)."},
    {"forget_after_fork", (PyCFunction)Engine_forget_after_fork, METH_NOARGS,
     "In a forked child: make the engine inert."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sampler._native.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Engine(delay, buffer_bytes=8 MiB, marks=False): a native collector thread.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Engine_init,
    .tp_dealloc = (destructor)Engine_dealloc,
    .tp_methods = Engine_methods,
};

/* ---- module functions (under the GIL) -------------------------------------------- */

/* read_probe() -> (way or None, why): how the collector can read this process's
 * memory ("process_vm_readv", "/proc/self/mem"), or None; why: the refusals met
 * (saferead.h). */
static PyObject *read_probe(PyObject *m, PyObject *unused) {
    int vm_errno, mem_errno;
    int way = ss_read_probe(&vm_errno, &mem_errno);
    if (way == SS_READ_VM) return Py_BuildValue("(ss)", "process_vm_readv", "");
    return Py_BuildValue("(zN)", way == SS_READ_MEM ? "/proc/self/mem" : NULL, read_refusals(vm_errno, mem_errno));
}

/* thread_states() -> {ident: (tstate address, native id or 0)} for this interpreter */
static PyObject *thread_states(PyObject *m, PyObject *unused) {
    PyObject *d = PyDict_New();
    if (d == NULL) return NULL;
    PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts; ts = PyThreadState_Next(ts)) {
#if PY_VERSION_HEX >= 0x030B0000
        unsigned long native = ts->native_thread_id;
#else
        unsigned long native = 0;
#endif
        PyObject *k = PyLong_FromUnsignedLong(ts->thread_id);
        PyObject *v = Py_BuildValue("(Kk)", (unsigned long long)(uintptr_t)ts, native);
        if (k == NULL || v == NULL || PyDict_SetItem(d, k, v) != 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    return d;
}

static PyObject *current_thread_state(PyObject *m, PyObject *unused) {
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)PyThreadState_Get());
}

static PyObject *frame_address(PyObject *m, PyObject *frame) {
    if (!PyFrame_Check(frame)) {
        PyErr_SetString(PyExc_TypeError, "frame_address takes a frame");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)ss_frame_object_addr((PyFrameObject *)frame));
}

static PyObject *mark_push(PyObject *m, PyObject *args) {
    PyObject *frame;
    unsigned int entry;
    if (!PyArg_ParseTuple(args, "OI", &frame, &entry)) return NULL;
    if (!PyFrame_Check(frame)) {
        PyErr_SetString(PyExc_TypeError, "mark_push takes a frame");
        return NULL;
    }
    ss_markstack *s = ss_markstack_of((uintptr_t)PyThreadState_Get());
    if (s == NULL) return PyErr_NoMemory();
    ss_mark_push(s, ss_frame_object_addr((PyFrameObject *)frame), entry);
    Py_RETURN_NONE;
}

static PyObject *mark_remove(PyObject *m, PyObject *arg) {
    unsigned long entry = PyLong_AsUnsignedLong(arg);
    if (entry == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    ss_markstack *s = ss_markstack_of((uintptr_t)PyThreadState_Get());
    if (s == NULL) return PyErr_NoMemory();
    return PyBool_FromLong(ss_mark_remove(s, (uint32_t)entry) == 0);
}

/* gil_held_by(tstate, seconds): whether the collector, which runs without the GIL,
 * sees thread state `tstate` hold it within `seconds` (the caller lets it go). */
static PyObject *gil_held_by(PyObject *m, PyObject *args) {
    unsigned long long tstate;
    double seconds;
    if (!PyArg_ParseTuple(args, "Kd", &tstate, &seconds)) return NULL;
    if (!(seconds >= 0 && seconds < 1e6)) {
        PyErr_SetString(PyExc_ValueError, "gil_held_by: seconds must be in [0, 1e6)");
        return NULL;
    }
    int seen = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t end = mono_ns() + (int64_t)(seconds * 1e9);
    while (!(seen = ss_gil_held_by((uintptr_t)tstate) == 1) && mono_ns() < end) {
        struct timespec pause = {0, 100000};
        nanosleep(&pause, NULL);
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(seen);
}

static PyObject *after_fork(PyObject *m, PyObject *unused) {
    pthread_mutex_init(&ss_markstacks.lock, NULL);
    pthread_mutex_init(&ss_shadows.lock, NULL);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"thread_states", thread_states, METH_NOARGS,
     "thread_states() -> {ident: (thread state address, native id or 0)}"},
    {"current_thread_state", current_thread_state, METH_NOARGS, "The calling thread's thread state address."},
    {"frame_address", frame_address, METH_O, "The address the engine reports for this frame's frame."},
    {"mark_push", mark_push, METH_VARARGS, "mark_push(frame, entry): a mark entered in frame."},
    {"mark_remove", mark_remove, METH_O, "mark_remove(entry) -> whether it was on this thread's stack."},
    {"gil_held_by", gil_held_by, METH_VARARGS,
     "gil_held_by(tstate, seconds): whether that thread state is seen holding the GIL (read as the collector does)"},
    {"after_fork", after_fork, METH_NOARGS, "In a forked child: reset the module's own state."},
    {"read_probe", read_probe, METH_NOARGS,
     "read_probe() -> (way or None, why): how the collector can read this process's memory"},
    SS_SHADOW_METHODS
    SS_SWITCHING_METHODS
    SS_TURNMERGE_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "sampler._native",
    "stackshot's native sampling engine: reads frames without the GIL.", -1, module_methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&EngineType) < 0) return NULL;
    ss_gil_find();
#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
    ss_shim_code = (uintptr_t)PyInterpreterState_Get()->interpreter_trampoline;
#endif
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) {
        Py_DECREF(&EngineType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "MAX_DEPTH", SS_MAX_DEPTH);
    PyModule_AddIntConstant(m, "MAX_MARKS", SS_MAX_MARKS);
    PyModule_AddIntConstant(m, "REPEAT", SS_REPEAT);
    PyModule_AddIntConstant(m, "SAME", SS_SAME);
    PyModule_AddIntConstant(m, "TRUNCATED", SS_TRUNCATED);
    PyModule_AddIntConstant(m, "ASLEEP", SS_ASLEEP);
    PyModule_AddIntConstant(m, "ONCPU", SS_ONCPU);
    PyModule_AddIntConstant(m, "PARKED", SS_PARKED);
    PyModule_AddIntConstant(m, "PREEMPTED", SS_PREEMPTED);
    PyModule_AddIntConstant(m, "SHADOW_MAX", SS_SHADOW_MAX);
    PyModule_AddIntConstant(m, "ENTRY_BYTES", sizeof(ss_entry));
    PyModule_AddStringConstant(m, "ENTRY_FORMAT", "=QiI");
    if (ss_gc_add_type(m) < 0 || ss_switchhook_add_type(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
