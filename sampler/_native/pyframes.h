/* Everything stackshot knows about CPython's frame layouts, one version per section.
 *
 * The native collector reads other threads' stacks without the GIL, so it cannot use
 * the frame API: it copies the interpreter's own structures with fault-safe reads
 * and decodes them here. Offsets come from CPython's installed headers (the internal
 * ones for 3.11+), so they are right by construction for the interpreter being
 * built against.
 *
 *   3.10  tstate->frame: PyFrameObject (f_back, f_code, f_lasti in code units).
 *   3.11  tstate->cframe->current_frame: _PyInterpreterFrame (previous, f_code,
 *         prev_instr), frames in data-stack chunks or inside generators.
 *   3.12  as 3.11, plus shim frames owned by the C stack (owner
 *         FRAME_OWNED_BY_CSTACK): not Python code, skipped.
 *   3.13  tstate->current_frame; f_executable (a code object, or something else for
 *         frames that run no bytecode), instr_ptr (the instruction executing).
 *
 * Instruction positions are reported as byte offsets into the code, like
 * frame.f_lasti, so that code.co_lines() resolves them to lines.
 */
#ifndef STACKSHOT_PYFRAMES_H
#define STACKSHOT_PYFRAMES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <frameobject.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX >= 0x030B0000
#  ifndef Py_BUILD_CORE
#    define Py_BUILD_CORE 1
#    define STACKSHOT_DEFINED_BUILD_CORE
#  endif
#  include <internal/pycore_frame.h>
#  ifdef STACKSHOT_DEFINED_BUILD_CORE
#    undef Py_BUILD_CORE
#  endif
#endif

#include "saferead.h"

#if PY_VERSION_HEX < 0x030A0000 || PY_VERSION_HEX >= 0x030E0000
#  error "stackshot's native engine knows the frame layouts of CPython 3.10 to 3.13 only"
#endif

#define SS_LASTI_TORN INT32_MIN  /* ss_frame.lasti of bytes that are no one moment of a frame */

/* One frame as the walker needs it. */
typedef struct {
    uintptr_t addr;      /* the frame's own address: identifies it (greenlets, marks) */
    uintptr_t previous;  /* the caller's frame, 0 at the bottom */
    uintptr_t code;      /* the code object's address (0: not a code frame) */
    int32_t lasti;       /* byte offset of the instruction, -1 when not started */
    int skip;            /* 1: not a Python frame (a 3.12+ C-stack shim) */
    int generator;       /* 1: a generator's or coroutine's frame (it has a caller
                          * only while it runs: suspended, its link is cleared) */
    int state;           /* 3.10: the frame object's f_state (FRAME_EXECUTING for
                          * every caller; a returned frame in a free list or kept
                          * for reuse keeps its last); 0 (executing) on 3.11+ */
} ss_frame;

/* What the walker needs from one thread state. */
typedef struct {
    uint64_t id;              /* the interpreter's number for the state (in creation order) */
    unsigned long thread_id;  /* the pthread id, as threading.get_ident() */
    unsigned long native_id;  /* the kernel tid (3.11+), 0 when unknown */
    uintptr_t top;            /* the innermost frame, 0 when none */
    uintptr_t chunk;          /* 3.11+: the current data-stack chunk (0 on 3.10) */
    uintptr_t chunk_top;      /* 3.11+: first free byte of that chunk */
    uintptr_t cframe;         /* 3.11-3.12: the C frame the top hangs off (0 elsewhere) */
} ss_tstate_view;

/* A field of a structure copied (partly) into bytes: memcpy, so that a copy of just
 * the fields needed is never read as a whole structure. */
#define SS_FIELD(bytes, type, field) \
    ({ __typeof__(((type *)0)->field) _v; \
       memcpy(&_v, (const char *)(bytes) + offsetof(type, field), sizeof _v); _v; })

/* ---- thread state ------------------------------------------------------------ */

/* Decode a copy of a thread state. On 3.11-3.12 the innermost frame hangs off the C
 * frame the state names, on the C stack: when that is `known_cframe` (not 0) its
 * frame `known_top` (read through it) is taken as the top, else the C frame is read
 * now. Returns -1 when that read fails. */
static inline int ss_decode_tstate(ss_reader *r, const PyThreadState *ts, uintptr_t known_cframe,
                                   uintptr_t known_top, ss_tstate_view *out) {
    out->id = ts->id;
    out->thread_id = ts->thread_id;
#if PY_VERSION_HEX >= 0x030B0000
    out->native_id = ts->native_thread_id;
    out->chunk = (uintptr_t)ts->datastack_chunk;
    out->chunk_top = (uintptr_t)ts->datastack_top;
#else
    out->native_id = 0;
    out->chunk = 0;
    out->chunk_top = 0;
#endif
    out->cframe = 0;
#if PY_VERSION_HEX >= 0x030D0000
    (void)r, (void)known_cframe, (void)known_top;
    out->top = (uintptr_t)ts->current_frame;
#elif PY_VERSION_HEX >= 0x030B0000
    {   /* the current frame hangs off the C frame, which lives on the C stack */
        _PyCFrame cf;
        out->cframe = (uintptr_t)ts->cframe;
        if (ts->cframe == NULL) {
            out->top = 0;
        } else if (known_cframe != 0 && out->cframe == known_cframe) {
            out->top = known_top;
        } else {
            if (ss_read(r, &cf, (uintptr_t)ts->cframe, sizeof cf) != 0) return -1;
            out->top = (uintptr_t)cf.current_frame;
        }
    }
#else
    (void)r, (void)known_cframe, (void)known_top;
    out->top = (uintptr_t)ts->frame;
#endif
    return 0;
}

static inline int ss_read_tstate(ss_reader *r, uintptr_t tstate, ss_tstate_view *out) {
    PyThreadState ts;
    if (ss_read(r, &ts, tstate, sizeof ts) != 0) return -1;
    return ss_decode_tstate(r, &ts, 0, 0, out);
}

/* Where the innermost frame of a running thread is named: read alone, before
 * anything else of its thread state, it is the sample's moment. Read after the
 * thread state, the moment leaned to callers: the copy of the state pulls the cache
 * lines the thread writes at every call and return (its data-stack top) away from its
 * core, and the thread, stalled on its next write there, is found in the frame making
 * it (3.12: a 1 us function called from a loop got 50-58% of the samples where
 * py-spy, stopping the process, gives it 66-67%, and so did this engine with the
 * program on the collector's core, stopped while read). 3.11-3.12 read it through
 * the C frame the state named last time (`cframe`; 0: not known yet, then 0 is
 * returned and the state is read first); the caller checks that the state still
 * names that C frame. */
static inline uintptr_t ss_top_field(uintptr_t tstate, uintptr_t cframe) {
#if PY_VERSION_HEX >= 0x030D0000
    (void)cframe;
    return tstate + offsetof(PyThreadState, current_frame);
#elif PY_VERSION_HEX >= 0x030B0000
    (void)tstate;
    return cframe == 0 ? 0 : cframe + offsetof(_PyCFrame, current_frame);
#else
    (void)cframe;
    return tstate + offsetof(PyThreadState, frame);
#endif
}

/* The innermost frame of the calling thread (it holds the GIL): for marks. */
static inline uintptr_t ss_current_frame_addr(PyThreadState *ts) {
#if PY_VERSION_HEX >= 0x030D0000
    _PyInterpreterFrame *f = ts->current_frame;
    while (f != NULL && f->owner == FRAME_OWNED_BY_CSTACK) f = f->previous;
    return (uintptr_t)f;
#elif PY_VERSION_HEX >= 0x030C0000
    _PyInterpreterFrame *f = ts->cframe ? ts->cframe->current_frame : NULL;
    while (f != NULL && f->owner == FRAME_OWNED_BY_CSTACK) f = f->previous;
    return (uintptr_t)f;
#elif PY_VERSION_HEX >= 0x030B0000
    return (uintptr_t)(ts->cframe ? ts->cframe->current_frame : NULL);
#else
    return (uintptr_t)ts->frame;
#endif
}

/* The address the walker reports for a frame object's frame (under the GIL). */
static inline uintptr_t ss_frame_object_addr(PyFrameObject *f) {
#if PY_VERSION_HEX >= 0x030B0000
    return (uintptr_t)f->f_frame;
#else
    return (uintptr_t)f;
#endif
}

/* ---- frames ---------------------------------------------------------------------- */

#if PY_VERSION_HEX >= 0x030B0000
typedef _PyInterpreterFrame ss_raw_frame_t;
#  define SS_FRAME_SIZE offsetof(_PyInterpreterFrame, localsplus)
#else
typedef PyFrameObject ss_raw_frame_t;
#  define SS_FRAME_SIZE (offsetof(PyFrameObject, f_state) + sizeof(PyFrameState))
#endif

#if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
/* 3.12: the code object every C-stack shim runs (the interpreter's
 * interpreter_trampoline), set when the engine's module loads (0 in memprof, which
 * reads its own thread under the GIL: whole frames). A frame running it that is not
 * owned by the C stack is a shim being written: 3.12 points the thread state at a new
 * C frame before it writes that C frame's current_frame and the shim's fields, so a
 * read in between follows the C frame's stale current_frame to the shim an earlier
 * call left at the same C-stack address, part rewritten, part overwritten since (its
 * caller link too). Filed as it was, it made a sample whose top is no Python code:
 * ['run_generators', '_gen_join', '<interpreter trampoline>'], 1 in 1,696 samples of
 * a CI run of the generators_run_from_c stress scenario. */
static uintptr_t ss_shim_code;
#endif

/* Decode SS_FRAME_SIZE bytes copied from address addr. */
static inline void ss_decode_frame(const void *bytes, uintptr_t addr, ss_frame *out) {
    out->addr = addr;
    out->skip = 0;
    out->state = 0;
#if PY_VERSION_HEX >= 0x030B0000
    out->generator = SS_FIELD(bytes, ss_raw_frame_t, owner) == FRAME_OWNED_BY_GENERATOR;
#else
    out->generator = SS_FIELD(bytes, ss_raw_frame_t, f_gen) != NULL;
#endif
#if PY_VERSION_HEX >= 0x030D0000
    uintptr_t instr = (uintptr_t)SS_FIELD(bytes, ss_raw_frame_t, instr_ptr);
    out->previous = (uintptr_t)SS_FIELD(bytes, ss_raw_frame_t, previous);
    out->code = (uintptr_t)SS_FIELD(bytes, ss_raw_frame_t, f_executable);
    out->skip = SS_FIELD(bytes, ss_raw_frame_t, owner) == FRAME_OWNED_BY_CSTACK;
#elif PY_VERSION_HEX >= 0x030B0000
    uintptr_t instr = (uintptr_t)SS_FIELD(bytes, ss_raw_frame_t, prev_instr);
    out->previous = (uintptr_t)SS_FIELD(bytes, ss_raw_frame_t, previous);
    out->code = (uintptr_t)SS_FIELD(bytes, ss_raw_frame_t, f_code);
#  if PY_VERSION_HEX >= 0x030C0000
    out->skip = SS_FIELD(bytes, ss_raw_frame_t, owner) == FRAME_OWNED_BY_CSTACK;
    int shim_being_written = !out->skip && out->code != 0 && out->code == ss_shim_code;
#  endif
#else
    int lasti = SS_FIELD(bytes, ss_raw_frame_t, f_lasti);
    out->previous = (uintptr_t)SS_FIELD(bytes, ss_raw_frame_t, f_back);
    out->code = (uintptr_t)SS_FIELD(bytes, ss_raw_frame_t, f_code);
    out->lasti = lasti < 0 ? -1 : lasti * 2;
    out->state = SS_FIELD(bytes, ss_raw_frame_t, f_state);
#endif
#if PY_VERSION_HEX >= 0x030B0000
    out->lasti = -1;
    if (out->code && instr) {
        /* An instruction pointer before its code (further than the one step back
         * 3.11-3.12 take before the first instruction) is not this code's: the bytes
         * of a frame read while it was being pushed (its caller link written, its
         * code not yet). Its end is checked by the walk, which knows the code's size. */
        intptr_t off = (intptr_t)instr - (intptr_t)(out->code + offsetof(PyCodeObject, co_code_adaptive));
        out->lasti = off < -2 || off > INT32_MAX ? SS_LASTI_TORN : (int32_t)off;
    }
#  if PY_VERSION_HEX >= 0x030C0000 && PY_VERSION_HEX < 0x030D0000
    if (shim_being_written) out->lasti = SS_LASTI_TORN;
#  endif
#endif
    if (out->lasti < -1 && out->lasti != SS_LASTI_TORN) out->lasti = -1;  /* a frame about to start */
}

/* ---- code objects -------------------------------------------------------------- */

/* The leading part of a code object that holds its fingerprint fields. */
#define SS_CODE_WINDOW_END \
    (offsetof(PyCodeObject, co_name) > offsetof(PyCodeObject, co_filename) \
         ? offsetof(PyCodeObject, co_name) + sizeof(PyObject *) \
         : offsetof(PyCodeObject, co_filename) + sizeof(PyObject *))
#define SS_MAX2(a, b) ((a) > (b) ? (a) : (b))
#if PY_VERSION_HEX >= 0x030B0000
#  define SS_QUALNAME_END (offsetof(PyCodeObject, co_qualname) + sizeof(PyObject *))
#  define SS_CO_CODE_OFFSET 0
#else
#  define SS_QUALNAME_END 0
#  define SS_CO_CODE_OFFSET offsetof(PyCodeObject, co_code)
#endif
#define SS_CODE_WINDOW SS_MAX2(SS_CODE_WINDOW_END, SS_MAX2(offsetof(PyCodeObject, co_firstlineno) + sizeof(int), \
                                                       offsetof(PyCodeObject, co_argcount) + sizeof(int)))

/* A 32-bit fingerprint of a code object from bytes copied at its address (all of
 * SS_CODE_FULL_WINDOW), or 0 when the bytes are not a live code object. It ties a
 * sampled address to the object that was there: a code object freed and another
 * allocated at the same address gets another fingerprint unless it has the same name,
 * file, first line and arguments, and its line table is at the same address too (an
 * edited function reloaded: same name, file and first line; the table tells its lines
 * apart, unless it took the old table's memory as well: the collector hears of the old
 * one's end, codewatch.h). */
static inline uint32_t ss_code_fingerprint(const void *bytes) {
    if (SS_FIELD(bytes, PyObject, ob_type) != &PyCode_Type) return 0;
    Py_ssize_t rc = SS_FIELD(bytes, PyObject, ob_refcnt);
    if (rc <= 0 || ((uint64_t)rc > ((uint64_t)1 << 40) && (uint64_t)rc != 0xFFFFFFFFu)) return 0;
    uint64_t h = 1469598103934665603ULL;
    uint64_t parts[5] = {(uint64_t)(uintptr_t)SS_FIELD(bytes, PyCodeObject, co_name),
                         (uint64_t)(uintptr_t)SS_FIELD(bytes, PyCodeObject, co_filename),
                         (uint64_t)SS_FIELD(bytes, PyCodeObject, co_firstlineno),
                         (uint64_t)SS_FIELD(bytes, PyCodeObject, co_argcount),
                         (uint64_t)(uintptr_t)SS_FIELD(bytes, PyCodeObject, co_linetable)};
    for (int i = 0; i < 5; i++) {
        h ^= parts[i];
        h *= 1099511628211ULL;
        h ^= h >> 29;
    }
    uint32_t fp = (uint32_t)(h ^ (h >> 32));
    return fp ? fp : 1;
}

/* ---- what a profile needs of a code object, copied ------------------------------ */

#define SS_NAME_MAX 512      /* characters of a name or file name kept */
#define SS_TABLE_MAX 32768   /* bytes of a line table kept (longer: lines unknown) */

/* A string object copied at addr: its characters (1, 2 or 4 bytes each, per *kind)
 * into out (room for SS_NAME_MAX characters of 4 bytes). Returns the bytes copied,
 * or 0 when addr holds no readable compact string. */
static inline uint32_t ss_copy_string(ss_reader *r, uintptr_t addr, char *out, uint8_t *kind) {
    char head[sizeof(PyCompactUnicodeObject)];
    *kind = 0;
    if (addr == 0 || ss_read(r, head, addr, sizeof head) != 0) return 0;
    if (SS_FIELD(head, PyObject, ob_type) != &PyUnicode_Type) return 0;
    PyASCIIObject a;
    memcpy(&a, head, sizeof a);
    if (!a.state.compact) return 0;
    Py_ssize_t length = a.length;
    if (length < 0) return 0;
    if (length > SS_NAME_MAX) length = SS_NAME_MAX;
    uintptr_t data = addr + (a.state.ascii ? sizeof(PyASCIIObject) : sizeof(PyCompactUnicodeObject));
    unsigned k = a.state.kind;
    if (k != 1 && k != 2 && k != 4) return 0;
    if (ss_read(r, out, data, (size_t)length * k) != 0) return 0;
    *kind = (uint8_t)(a.state.ascii ? 1 : k);
    return (uint32_t)length * k;
}

/* A bytes object copied at addr into out (up to max bytes). Returns the bytes
 * copied (0 when unreadable, or longer than max). */
static inline uint32_t ss_copy_bytes(ss_reader *r, uintptr_t addr, char *out, size_t max) {
    char head[offsetof(PyBytesObject, ob_sval)];
    if (addr == 0 || ss_read(r, head, addr, sizeof head) != 0) return 0;
    if (SS_FIELD(head, PyObject, ob_type) != &PyBytes_Type) return 0;
    Py_ssize_t n = SS_FIELD(head, PyVarObject, ob_size);
    if (n <= 0 || (size_t)n > max) return 0;
    if (ss_read(r, out, addr + offsetof(PyBytesObject, ob_sval), (size_t)n) != 0) return 0;
    return (uint32_t)n;
}

/* Where a code object's name, file and line table are (from its copied bytes). */
typedef struct {
    int32_t firstlineno;
    uint32_t code_bytes;     /* length of the bytecode, for line lookups */
    uintptr_t qualname, filename, linetable;
} ss_code_fields;

/* The words a frame of the code object takes on the data stack (3.11+): the
 * interpreter moves datastack_top by this much when it pushes one. */
#if PY_VERSION_HEX >= 0x030C0000
#  define SS_FRAMESIZE_END (offsetof(PyCodeObject, co_framesize) + sizeof(int))
static inline int32_t ss_code_framesize(const void *bytes) {
    return SS_FIELD(bytes, PyCodeObject, co_framesize);
}
#elif PY_VERSION_HEX >= 0x030B0000
#  define SS_FRAMESIZE_END (SS_MAX2(offsetof(PyCodeObject, co_nlocalsplus), \
                                    offsetof(PyCodeObject, co_stacksize)) + sizeof(int))
static inline int32_t ss_code_framesize(const void *bytes) {  /* as 3.11's _PyFrame_Push */
    return SS_FIELD(bytes, PyCodeObject, co_nlocalsplus) + SS_FIELD(bytes, PyCodeObject, co_stacksize) +
           (int32_t)FRAME_SPECIALS_SIZE;
}
#else
#  define SS_FRAMESIZE_END 0
static inline int32_t ss_code_framesize(const void *bytes) {
    (void)bytes;
    return 0;
}
#endif

/* The length of a code object's bytecode in bytes (from its copied bytes; 3.11+,
 * where a frame's instruction pointer is checked against it; 0 before). */
static inline uint32_t ss_code_nbytes(const void *bytes) {
#if PY_VERSION_HEX >= 0x030B0000
    Py_ssize_t units = SS_FIELD(bytes, PyVarObject, ob_size);
    return units > 0 && units < ((Py_ssize_t)1 << 28) ? (uint32_t)(units * (Py_ssize_t)sizeof(_Py_CODEUNIT)) : 0;
#else
    (void)bytes;
    return 0;
#endif
}

#define SS_CODE_FULL_WINDOW SS_MAX2(SS_MAX2(SS_CODE_WINDOW, SS_FRAMESIZE_END), SS_MAX2(SS_QUALNAME_END, \
    SS_MAX2(offsetof(PyCodeObject, co_linetable), SS_CO_CODE_OFFSET) + sizeof(PyObject *)))

static inline int ss_code_fields_of(ss_reader *r, const void *bytes, ss_code_fields *out) {
    out->firstlineno = SS_FIELD(bytes, PyCodeObject, co_firstlineno);
    out->filename = (uintptr_t)SS_FIELD(bytes, PyCodeObject, co_filename);
    out->linetable = (uintptr_t)SS_FIELD(bytes, PyCodeObject, co_linetable);
#if PY_VERSION_HEX >= 0x030B0000
    out->qualname = (uintptr_t)SS_FIELD(bytes, PyCodeObject, co_qualname);
    out->code_bytes = (uint32_t)(SS_FIELD(bytes, PyVarObject, ob_size) * sizeof(_Py_CODEUNIT));
#else
    out->qualname = (uintptr_t)SS_FIELD(bytes, PyCodeObject, co_name);
    char head[offsetof(PyBytesObject, ob_sval)];
    uintptr_t co_code = (uintptr_t)SS_FIELD(bytes, PyCodeObject, co_code);
    if (ss_read(r, head, co_code, sizeof head) != 0) return -1;
    out->code_bytes = (uint32_t)SS_FIELD(head, PyVarObject, ob_size);
#endif
    return 0;
}

#endif
