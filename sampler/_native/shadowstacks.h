/* Shadow stacks (use_errortrace): a stack per thread kept by interpreter events, in
 * C, read by the collector thread without the GIL.
 *
 * Python 3.12+: sys.monitoring callbacks (C functions registered from Python by
 * sampler.native_engine.NativeShadowStacks): PY_START / PY_RESUME / PY_THROW push
 * the code object's address, PY_RETURN / PY_YIELD / PY_UNWIND pop it; CALL of
 * anything that is not a Python function pushes the callable's id, C_RETURN /
 * C_RAISE pop it. Before 3.12: a C profile function (call / return, c_call /
 * c_return / c_exception) installed in every thread state, and in threads started
 * later through threading.setprofile (a bootstrap that installs it at their first
 * event); with Python frames only, an eval-frame hook instead (see below: far
 * cheaper on 3.11).
 *
 * Entries are tagged words: a code object's address (even), or (id << 1) | 1 for a
 * C callable, whose name Python holds (ids are given under the GIL, keyed by what
 * does not move: the PyMethodDef of a builtin or method descriptor, else the type,
 * kept alive). A pop names what it pops: entries above it go with it, a pop of what
 * is not there is ignored. A thread's stack is seeded from its live frames at its
 * first event of a session (and after a greenlet switch: shadow_unseed).
 *
 * Like the mark stacks: one per thread state, never freed (threadrecords.h);
 * the owner writes under the GIL inside a sequence counter (odd while writing), the
 * collector copies without a lock and retries on a change. At most SS_SHADOW_MAX
 * entries are stored; deeper pushes only count (depth goes on, overflow counts).
 */
#ifndef STACKSHOT_SHADOWSTACKS_H
#define STACKSHOT_SHADOWSTACKS_H

#include <Python.h>
#include <frameobject.h>
#include "pyframes.h"
#include "threadrecords.h"
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define SS_SHADOW_MAX 1024
#define SS_C_IDS 8192  /* slots of the C callable table (ids given at most 3/4 of it) */

typedef struct ss_shadow {
    ss_thread_record record;  /* first: the owner's thread state, the list */
    uint32_t seq;       /* odd while the owner writes */
    uint32_t depth;     /* entries pushed (may exceed SS_SHADOW_MAX) */
    uint32_t epoch;     /* the session it was seeded in; another: not seeded */
    uint32_t pad;
    uintptr_t entries[SS_SHADOW_MAX];  /* outermost first */
    uintptr_t frames[SS_SHADOW_MAX];   /* owner only: each entry's frame (0: unknown), for the eval hook and seeds */
    uintptr_t stack_guard;             /* owner only: the eval hook leaves when its C stack goes below */
} ss_shadow;

static ss_thread_records ss_shadows = SS_THREAD_RECORDS_INIT;
static uint32_t ss_shadow_epoch = 1;    /* sessions; bumped at start and stop */
static int ss_shadow_on = 0;            /* a session runs (under the GIL) */
static int ss_shadow_c = 0;             /* C callables get entries */
static uint64_t ss_shadow_overflow = 0; /* pushes that did not fit */
static __thread ss_shadow *ss_my_shadow = NULL;

/* C callables: key -> id (under the GIL) */
static uintptr_t ss_c_keys[SS_C_IDS];
static uint32_t ss_c_ids[SS_C_IDS];
static uint32_t ss_c_count = 0;
static PyObject *ss_c_frames = NULL;  /* list: id -> frame (made by ss_c_namer) */
static PyObject *ss_c_kept = NULL;    /* list: types used as keys, kept alive */
static PyObject *ss_c_namer = NULL;   /* sampler.shadow.c_frame */

/* The lowest address of the calling thread's C stack the eval hook may run at: a
 * quarter of the stack (at least 256 KiB, at most half) is left to the program. */
static uintptr_t ss_stack_guard(void) {
    pthread_attr_t attr;
    void *lo;
    size_t size;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return UINTPTR_MAX;  /* unknown: never */
    int bad = pthread_attr_getstack(&attr, &lo, &size);
    pthread_attr_destroy(&attr);
    if (bad) return UINTPTR_MAX;
    size_t keep = size / 4 < (256 << 10) ? (256 << 10) : size / 4;
    if (keep > size / 2) keep = size / 2;
    return (uintptr_t)lo + keep;
}

static ss_shadow *ss_shadow_find(uintptr_t tstate) {
    return (ss_shadow *)ss_records_find(&ss_shadows, tstate);
}

/* The calling thread's stack (it holds the GIL), made on first use; NULL: no memory.
 * Remembered per OS thread (an OS thread runs one thread state here); looked up by
 * thread state only when the thread has none yet. */
static ss_shadow *ss_shadow_mine(void) {
    ss_shadow *s = ss_my_shadow;
    if (s != NULL) return s;
    s = (ss_shadow *)ss_records_get(&ss_shadows, (uintptr_t)PyThreadState_Get(), sizeof(ss_shadow));
    if (s == NULL) return NULL;
    s->stack_guard = ss_stack_guard();  /* this OS thread's (a thread state's record outlives its thread) */
    ss_my_shadow = s;
    return s;
}

/* One writer per stack (its thread, under the GIL): no read-modify-write needed,
 * only the order of the stores (odd count, entries, even count). */
static inline void ss_shadow_begin(ss_shadow *s) {
    __atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}
static inline void ss_shadow_end(ss_shadow *s) { __atomic_store_n(&s->seq, s->seq + 1, __ATOMIC_RELEASE); }

static inline void ss_shadow_set_depth(ss_shadow *s, uint32_t depth) {
    __atomic_store_n(&s->depth, depth, __ATOMIC_RELAXED);
}

/* Cut the stack to `depth` entries, as one change the collector sees whole. */
static inline void ss_shadow_cut(ss_shadow *s, uint32_t depth) {
    ss_shadow_begin(s);
    ss_shadow_set_depth(s, depth);
    ss_shadow_end(s);
}

static void ss_shadow_push_frame(ss_shadow *s, uintptr_t entry, uintptr_t frame) {
    ss_shadow_begin(s);
    if (s->depth < SS_SHADOW_MAX) {
        __atomic_store_n(&s->entries[s->depth], entry, __ATOMIC_RELAXED);
        s->frames[s->depth] = frame;
    } else {
        ss_shadow_overflow++;
    }
    ss_shadow_set_depth(s, s->depth + 1);
    ss_shadow_end(s);
}

static inline void ss_shadow_push(ss_shadow *s, uintptr_t entry) { ss_shadow_push_frame(s, entry, 0); }

/* Whether `frame` starting (running `entry`) is the top entry already: seeded while
 * its start event was on its way. A greenlet collected by the GC is killed in the
 * middle of whatever allocated (a frame being entered, the frame object made for its
 * event), and code run then (a weakref callback) seeds the stack with that frame in
 * it. A seeded entry keeps its frame until popped; pushes record none (0). */
static inline int ss_shadow_starts_seeded(ss_shadow *s, uintptr_t entry, uintptr_t frame) {
    uint32_t d = s->depth;
    return frame != 0 && d > 0 && d <= SS_SHADOW_MAX && s->entries[d - 1] == entry && s->frames[d - 1] == frame;
}

/* Push the entry of a Python frame starting, unless its seed holds it already. */
static inline void ss_shadow_push_start(ss_shadow *s, uintptr_t entry, uintptr_t frame) {
    if (!ss_shadow_starts_seeded(s, entry, frame)) ss_shadow_push(s, entry);
}

/* Pop the innermost entry whose value in `column` (s->entries: its code; s->frames:
 * its frame) is `value`, and whatever is above it; ignored when absent. */
static void ss_shadow_pop_where(ss_shadow *s, const uintptr_t *column, uintptr_t value) {
    if (s->depth > SS_SHADOW_MAX) {  /* the innermost were never stored */
        ss_shadow_cut(s, s->depth - 1);
        return;
    }
    for (uint32_t i = s->depth; i-- > 0;) {
        if (column[i] == value) {
            ss_shadow_cut(s, i);
            return;
        }
    }
}

/* Pop `entry` and whatever is above it (found from the top); ignored when absent. */
static inline void ss_shadow_pop(ss_shadow *s, uintptr_t entry) { ss_shadow_pop_where(s, s->entries, entry); }

/* Pop a C callable's entry only when it is on top (its call is the innermost). */
static void ss_shadow_pop_top(ss_shadow *s, uintptr_t entry) {
    if (s->depth > SS_SHADOW_MAX || (s->depth > 0 && s->entries[s->depth - 1] == entry))
        ss_shadow_cut(s, s->depth - 1);
}

/* Fill the stack from the live frames, outermost first, starting at `frame`
 * (borrowed; NULL: the thread's current frame). */
static void ss_shadow_seed(ss_shadow *s, PyFrameObject *frame) {
    uintptr_t codes[SS_SHADOW_MAX], frames[SS_SHADOW_MAX];
    uint32_t n = 0, total = 0;
    PyFrameObject *f = frame != NULL ? frame : PyEval_GetFrame();
    Py_XINCREF(f);
    while (f != NULL) {
        PyCodeObject *code = PyFrame_GetCode(f);
        if (n < SS_SHADOW_MAX) {  /* innermost first, for now */
            frames[n] = ss_frame_object_addr(f);
            codes[n++] = (uintptr_t)code;
        }
        total++;
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    ss_shadow_begin(s);
    /* keep the outermost SS_SHADOW_MAX: a deeper stack's innermost only count */
    for (uint32_t i = 0; i < n; i++) {
        __atomic_store_n(&s->entries[i], codes[n - 1 - i], __ATOMIC_RELAXED);
        s->frames[i] = frames[n - 1 - i];
    }
    ss_shadow_set_depth(s, total > n ? total : n);
    s->epoch = ss_shadow_epoch;
    ss_shadow_end(s);
}

/* The calling thread's stack, seeded when this session has not seen it yet.
 * *fresh is set when it was seeded now (from the live frames: the event's own frame
 * is in it already when it starts, still in it when it ends). */
static ss_shadow *ss_shadow_here(PyFrameObject *frame, int *fresh) {
    ss_shadow *s = ss_shadow_mine();
    *fresh = 0;
    if (s == NULL) return NULL;
    if (s->epoch != ss_shadow_epoch) {
        ss_shadow_seed(s, frame);
        *fresh = 1;
    }
    return s;
}

static inline uintptr_t ss_code_entry(PyObject *code) { return (uintptr_t)code; }

#if PY_VERSION_HEX >= 0x030C0000
/* (sys.monitoring's CALL event comes for every callable) */
static int ss_is_python_callable(PyObject *c) {
    if (PyFunction_Check(c)) return 1;
    return PyMethod_Check(c) && PyFunction_Check(PyMethod_GET_FUNCTION(c));
}
#endif

/* The key a C callable is known by: its PyMethodDef when it has one (static, shared
 * by every bound copy), else its type (kept alive, so its address is never reused). */
static uintptr_t ss_c_key(PyObject *c, int *keep_type) {
    *keep_type = 0;
    if (PyCFunction_Check(c)) return (uintptr_t)((PyCFunctionObject *)c)->m_ml;
    if (Py_IS_TYPE(c, &PyMethodDescr_Type)) return (uintptr_t)((PyMethodDescrObject *)c)->d_method;
    if (PyType_Check(c)) {
        *keep_type = 1;
        return (uintptr_t)c;
    }
    *keep_type = 1;
    return (uintptr_t)Py_TYPE(c) | 2;  /* an instance called: named after its type */
}

/* The tagged entry of C callable c (0 on failure, with no exception left set). */
static uintptr_t ss_c_entry(PyObject *c) {
    int keep_type;
    uintptr_t key = ss_c_key(c, &keep_type);
    size_t h = (size_t)((key >> 3) * 11400714819323198485ULL) & (SS_C_IDS - 1);
    for (int probe = 0; probe < SS_C_IDS; probe++) {
        size_t i = (h + probe) & (SS_C_IDS - 1);
        if (ss_c_keys[i] == key) return ((uintptr_t)ss_c_ids[i] << 1) | 1;
        if (ss_c_keys[i] == 0) {
            if (ss_c_count >= SS_C_IDS / 4 * 3 || ss_c_frames == NULL || ss_c_namer == NULL) return 1;  /* id 0 */
            PyObject *frame = PyObject_CallOneArg(ss_c_namer, c);
            if (frame == NULL) {
                PyErr_Clear();
                return 1;
            }
            uint32_t id = (uint32_t)PyList_GET_SIZE(ss_c_frames);
            int bad = PyList_Append(ss_c_frames, frame) != 0;
            Py_DECREF(frame);
            if (!bad && keep_type) bad = PyList_Append(ss_c_kept, keep_type && PyType_Check(c) ? c : (PyObject *)Py_TYPE(c)) != 0;
            if (bad) {
                PyErr_Clear();
                return 1;
            }
            ss_c_keys[i] = key;
            ss_c_ids[i] = id;
            ss_c_count++;
            return ((uintptr_t)id << 1) | 1;
        }
    }
    return 1;
}

/* Copy thread `tstate`'s stack into out[] innermost first (collector side, no GIL).
 * Returns the entries copied, -1 when it has none for this session or it kept
 * changing; *truncated when the thread's stack was deeper than what is stored. */
static int ss_shadow_copy(uintptr_t tstate, uintptr_t *out, int max, int *truncated) {
    ss_shadow *s = ss_shadow_find(tstate);
    *truncated = 0;
    if (s == NULL) return -1;
    for (int attempt = 0; attempt < 8; attempt++) {
        uint32_t before = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
        if (before & 1) continue;
        if (__atomic_load_n(&s->epoch, __ATOMIC_RELAXED) != __atomic_load_n(&ss_shadow_epoch, __ATOMIC_RELAXED))
            return -1;
        uint32_t depth = __atomic_load_n(&s->depth, __ATOMIC_RELAXED);
        uint32_t n = depth < SS_SHADOW_MAX ? depth : SS_SHADOW_MAX;
        if ((int)n > max) n = (uint32_t)max;
        for (uint32_t i = 0; i < n; i++) out[i] = __atomic_load_n(&s->entries[n - 1 - i], __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(&s->seq, __ATOMIC_RELAXED) == before) {
            *truncated = depth > n;
            return (int)n;
        }
    }
    return -1;
}

/* ---- the callbacks ------------------------------------------------------------ */

#if PY_VERSION_HEX >= 0x030C0000
/* sys.monitoring callbacks: (code, offset, ...) */
static PyObject *ss_cb_push(PyObject *m, PyObject *const *args, Py_ssize_t n) {
    int fresh;
    if (!ss_shadow_on || n < 1) Py_RETURN_NONE;
    ss_shadow *s = ss_shadow_here(NULL, &fresh);
    if (s != NULL && !fresh) ss_shadow_push_start(s, ss_code_entry(args[0]), ss_current_frame_addr(PyThreadState_Get()));
    Py_RETURN_NONE;
}

static PyObject *ss_cb_pop(PyObject *m, PyObject *const *args, Py_ssize_t n) {
    int fresh;
    if (!ss_shadow_on || n < 1) Py_RETURN_NONE;
    ss_shadow *s = ss_shadow_here(NULL, &fresh);
    if (s != NULL) ss_shadow_pop(s, ss_code_entry(args[0]));
    Py_RETURN_NONE;
}

static PyObject *ss_cb_call(PyObject *m, PyObject *const *args, Py_ssize_t n) {
    int fresh;
    if (!ss_shadow_on || !ss_shadow_c || n < 3 || ss_is_python_callable(args[2])) Py_RETURN_NONE;
    ss_shadow *s = ss_shadow_here(NULL, &fresh);
    if (s != NULL) ss_shadow_push(s, ss_c_entry(args[2]));
    Py_RETURN_NONE;
}

static PyObject *ss_cb_c_return(PyObject *m, PyObject *const *args, Py_ssize_t n) {
    int fresh;
    if (!ss_shadow_on || !ss_shadow_c || n < 3) Py_RETURN_NONE;
    ss_shadow *s = ss_shadow_here(NULL, &fresh);
    if (s != NULL && !fresh) ss_shadow_pop_top(s, ss_c_entry(args[2]));
    Py_RETURN_NONE;
}
#else
/* The profile function (before 3.12). */
static int ss_profile(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg) {
    int fresh;
    if (!ss_shadow_on) return 0;
    if (!ss_shadow_c && (what == PyTrace_C_CALL || what == PyTrace_C_RETURN || what == PyTrace_C_EXCEPTION))
        return 0;
    ss_shadow *s = ss_shadow_here(frame, &fresh);
    if (s == NULL) return 0;
    if (what == PyTrace_CALL) {
        if (!fresh) {
            PyCodeObject *code = PyFrame_GetCode(frame);
            ss_shadow_push_start(s, ss_code_entry((PyObject *)code), ss_frame_object_addr(frame));
            Py_DECREF(code);
        }
    } else if (what == PyTrace_RETURN) {
        PyCodeObject *code = PyFrame_GetCode(frame);
        ss_shadow_pop(s, ss_code_entry((PyObject *)code));
        Py_DECREF(code);
    } else if (what == PyTrace_C_CALL) {
        ss_shadow_push(s, ss_c_entry(arg));
    } else if (what == PyTrace_C_RETURN || what == PyTrace_C_EXCEPTION) {
        if (!fresh) ss_shadow_pop_top(s, ss_c_entry(arg));
    }
    return 0;
}

/* threading.setprofile's function in threads started later: put the C profile
 * function in its place at the thread's first event (that event is seen by the
 * seeding at the next one). */
static PyObject *ss_profile_bootstrap(PyObject *m, PyObject *args) {
    if (ss_shadow_on) PyEval_SetProfile(ss_profile, NULL);
    else PyEval_SetProfile(NULL, NULL);
    Py_RETURN_NONE;
}
#endif

/* ---- the eval-frame hook ('python' mode, 3.10-3.11) ----------------------------
 *
 * A PEP 523 frame-evaluation function sees every Python frame begin and end (a call,
 * a generator resumed, a throw into it) around the interpreter's own evaluation, at
 * far less cost than a profile function, which makes 3.11 run unspecialized
 * instructions (callgrind, the benchmark's call-heavy loop on 3.11: 1.07x the
 * instructions with a bare hook, 2.1x with a bare C profile function). The interpreter
 * then makes Python-to-Python calls through C, as 3.10 always did, so near the end of
 * a thread's C stack the hook takes itself out (ss_hook_leave_for_good). Not used on
 * 3.12, where such calls count against the C recursion limit (a recursion 750 deep
 * raised RecursionError), nor on 3.13, whose specialized __init__ calls skip the hook
 * (3.13.0), nor for C functions (no event), nor when another frame evaluator is
 * installed (a debugger's, a JIT's): there sys.monitoring or the profile function keep
 * the stacks. sampler.shadow checks, once per process, that the hook sees every kind
 * of call before relying on it.
 *
 * Frames entered before the hook was installed end unseen: each entry remembers its
 * frame, and a push first drops the entries above its caller's frame (found from the
 * top; a caller not on the stack makes it seed again), so such a frame leaves the
 * stack at the next call. A pop drops the entry of its own frame and those above it. */
#if PY_VERSION_HEX < 0x030C0000
#  define SS_EVAL_HOOK 1
#  if PY_VERSION_HEX >= 0x030B0000
typedef struct _PyInterpreterFrame ss_eval_frame;
#  else
typedef PyFrameObject ss_eval_frame;
#  endif
static int ss_hook_on = 0;  /* the hook is installed (under the GIL) */

/* Keep the entries up to the caller's frame (the thread's innermost). */
static void ss_hook_cut(ss_shadow *s, uintptr_t caller) {
    uint32_t depth = s->depth;
    if (depth > SS_SHADOW_MAX) return;  /* the innermost are not stored: cannot tell */
    if (depth > 0 && s->frames[depth - 1] == caller) return;  /* the usual case */
    uint32_t keep = 0;
    if (caller != 0) {
        for (keep = depth; keep > 0 && s->frames[keep - 1] != caller; keep--) {
        }
        if (keep == 0) {  /* the caller is not on the stack: read the frames again */
            ss_shadow_seed(s, NULL);
            return;
        }
    }
    ss_shadow_cut(s, keep);
}

static int ss_hook_lost = 0;  /* the hook left mid-session (C stack too deep) */
static PyObject *ss_eval_hook(PyThreadState *ts, ss_eval_frame *frame, int throwflag);

/* Calls made through the hook recurse in C (the interpreter no longer inlines them):
 * near the end of the thread's C stack the hook takes itself out for good, and every
 * stack is left unseeded, so the collector walks the live frames instead (the same
 * Python frames, read without the shadow stack) rather than let a deep recursion,
 * which runs without the hook, overflow the C stack. */
static void ss_hook_leave_for_good(PyThreadState *ts) {
    PyInterpreterState *interp = PyThreadState_GetInterpreter(ts);
    if (_PyInterpreterState_GetEvalFrameFunc(interp) == ss_eval_hook)
        _PyInterpreterState_SetEvalFrameFunc(interp, _PyEval_EvalFrameDefault);
    ss_hook_lost = 1;
    __atomic_add_fetch(&ss_shadow_epoch, 1, __ATOMIC_RELEASE);
}

static PyObject *ss_eval_hook(PyThreadState *ts, ss_eval_frame *frame, int throwflag) {
    ss_shadow *s = NULL;
    if (ss_shadow_on && !ss_hook_lost && (s = ss_shadow_mine()) != NULL) {
        if ((uintptr_t)__builtin_frame_address(0) < s->stack_guard) {
            ss_hook_leave_for_good(ts);
            return _PyEval_EvalFrameDefault(ts, frame, throwflag);
        }
        if (s->epoch != ss_shadow_epoch) ss_shadow_seed(s, NULL);  /* the caller's frames */
        else ss_hook_cut(s, ss_current_frame_addr(ts));
        ss_shadow_push_frame(s, (uintptr_t)frame->f_code, (uintptr_t)frame);
    }
    PyObject *result = _PyEval_EvalFrameDefault(ts, frame, throwflag);
    if (s != NULL && ss_shadow_on && !ss_hook_lost && s->epoch == ss_shadow_epoch) ss_shadow_pop_where(s, s->frames, (uintptr_t)frame);
    return result;
}

/* shadow_hook(on) -> whether the hook is installed now (on: only when the interpreter
 * evaluates frames itself, no other evaluator installed). */
static PyObject *ss_shadow_hook(PyObject *m, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    PyInterpreterState *interp = PyInterpreterState_Get();
    _PyFrameEvalFunction current = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (on && !ss_hook_on) {
        if (current != _PyEval_EvalFrameDefault) Py_RETURN_FALSE;
        _PyInterpreterState_SetEvalFrameFunc(interp, ss_eval_hook);
        ss_hook_on = 1;
        ss_hook_lost = 0;
    } else if (!on && ss_hook_on) {
        if (current == ss_eval_hook) _PyInterpreterState_SetEvalFrameFunc(interp, _PyEval_EvalFrameDefault);
        ss_hook_on = 0;  /* replaced by another evaluator since: ours is not in use */
    }
    return PyBool_FromLong(ss_hook_on);
}

/* shadow_top() -> the calling thread's innermost entry (a code object's address), or
 * None: how sampler.shadow checks the hook. */
static PyObject *ss_shadow_top(PyObject *m, PyObject *unused) {
    ss_shadow *s = ss_my_shadow;
    if (s == NULL || s->epoch != ss_shadow_epoch || s->depth == 0 || s->depth > SS_SHADOW_MAX) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong((unsigned long long)s->entries[s->depth - 1]);
}
#  define SS_HOOK_METHODS \
    {"shadow_hook", ss_shadow_hook, METH_O, "shadow_hook(on) -> whether the eval-frame hook is installed"}, \
    {"shadow_top", ss_shadow_top, METH_NOARGS, "The calling thread's innermost entry, or None"},
#else
#  define SS_HOOK_METHODS
#endif

/* ---- module functions (under the GIL) ----------------------------------------- */

/* shadow_start(c_functions, namer, profile=True): a new session (every stack seeded
 * again); before 3.12, profile: the C profile function goes into every thread state
 * (False: the eval-frame hook keeps the stacks). */
static PyObject *ss_shadow_start(PyObject *m, PyObject *args) {
    int c_functions, profile = 1;
    PyObject *namer;
    if (!PyArg_ParseTuple(args, "pO|p", &c_functions, &namer, &profile)) return NULL;
    if (ss_c_frames == NULL) {
        ss_c_frames = PyList_New(0);
        ss_c_kept = PyList_New(0);
        if (ss_c_frames == NULL || ss_c_kept == NULL) return NULL;
    }
    if (PyList_GET_SIZE(ss_c_frames) == 0) {  /* id 0: a C function not told apart */
        PyObject *unknown = PyObject_CallOneArg(namer, Py_None);
        if (unknown == NULL || PyList_Append(ss_c_frames, unknown) != 0) {
            Py_XDECREF(unknown);
            return NULL;
        }
        Py_DECREF(unknown);
    }
    Py_INCREF(namer);
    Py_XSETREF(ss_c_namer, namer);
#if PY_VERSION_HEX < 0x030C0000
    PyThreadState *me = PyThreadState_Get();
    PyInterpreterState *interp = PyThreadState_GetInterpreter(me);
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); profile && ts; ts = PyThreadState_Next(ts)) {
        if (ts->c_profilefunc != NULL && ts->c_profilefunc != ss_profile) {
            PyErr_SetString(PyExc_RuntimeError,
                            "use_errortrace before Python 3.12 needs every thread's profile function, and "
                            "another profiler holds one: stop it first, or use Python 3.12+");
            return NULL;
        }
    }
#endif
    __atomic_add_fetch(&ss_shadow_epoch, 1, __ATOMIC_RELEASE);
    ss_shadow_overflow = 0;  /* counted per session */
    ss_shadow_c = c_functions;
    ss_shadow_on = 1;
#if PY_VERSION_HEX < 0x030C0000
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); profile && ts; ts = PyThreadState_Next(ts)) {
        if (_PyEval_SetProfile(ts, ss_profile, NULL) != 0) {
            PyErr_Clear();
        }
    }
#endif
    Py_RETURN_NONE;
}

/* shadow_stop(): end the session; every stack is unseeded (the profile function is
 * taken out of every thread state before 3.12). */
static PyObject *ss_shadow_stop(PyObject *m, PyObject *unused) {
    ss_shadow_on = 0;
    __atomic_add_fetch(&ss_shadow_epoch, 1, __ATOMIC_RELEASE);
#if PY_VERSION_HEX < 0x030C0000
    PyInterpreterState *interp = PyThreadState_GetInterpreter(PyThreadState_Get());
    for (PyThreadState *ts = PyInterpreterState_ThreadHead(interp); ts; ts = PyThreadState_Next(ts)) {
        if (ts->c_profilefunc == ss_profile && _PyEval_SetProfile(ts, NULL, NULL) != 0) PyErr_Clear();
    }
#endif
    Py_RETURN_NONE;
}

/* shadow_unseed(): the calling thread's stack is seeded again at its next event. */
static PyObject *ss_shadow_unseed(PyObject *m, PyObject *unused) {
    ss_shadow *s = ss_shadow_find((uintptr_t)PyThreadState_Get());
    if (s != NULL) {
        ss_shadow_begin(s);
        s->epoch = 0;
        ss_shadow_end(s);
    }
    Py_RETURN_NONE;
}

/* shadow_stack(tstate) -> None or [entry, ...] outermost first: a code object's
 * address (int) or a C callable's frame (never dereferences an address). */
static PyObject *ss_shadow_stack(PyObject *m, PyObject *arg) {
    unsigned long long tstate = PyLong_AsUnsignedLongLong(arg);
    if (tstate == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uintptr_t *copy = PyMem_RawMalloc(sizeof(uintptr_t) * SS_SHADOW_MAX);
    if (copy == NULL) return PyErr_NoMemory();
    int truncated;
    int n = ss_shadow_copy((uintptr_t)tstate, copy, SS_SHADOW_MAX, &truncated);
    if (n < 0) {
        PyMem_RawFree(copy);
        Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(n);
    for (int i = 0; out != NULL && i < n; i++) {
        uintptr_t e = copy[n - 1 - i];
        PyObject *item;
        if (e & 1) {
            uint32_t id = (uint32_t)(e >> 1);
            item = ss_c_frames != NULL && id < (uint32_t)PyList_GET_SIZE(ss_c_frames)
                ? Py_NewRef(PyList_GET_ITEM(ss_c_frames, id)) : Py_NewRef(Py_None);
        } else {
            item = PyLong_FromUnsignedLongLong((unsigned long long)e);
        }
        if (item == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, item);
    }
    PyMem_RawFree(copy);
    return out;
}

/* shadow_c_frames() -> the frames of C callables by id (a copy). */
static PyObject *ss_shadow_c_frames(PyObject *m, PyObject *unused) {
    if (ss_c_frames == NULL) return PyList_New(0);
    return PyList_GetSlice(ss_c_frames, 0, PyList_GET_SIZE(ss_c_frames));
}

static PyObject *ss_shadow_stats(PyObject *m, PyObject *unused) {
    int hooked = 0, lost = 0;  /* the interpreter evaluates frames through ss_eval_hook now */
#ifdef SS_EVAL_HOOK
    hooked = _PyInterpreterState_GetEvalFrameFunc(PyInterpreterState_Get()) == ss_eval_hook;
    lost = ss_hook_lost;
#endif
    return Py_BuildValue("{sKsIsisi}", "overflow", (unsigned long long)ss_shadow_overflow,
                         "c_functions", (unsigned int)ss_c_count, "eval_hook", hooked, "eval_hook_lost", lost);
}

#if PY_VERSION_HEX >= 0x030C0000
#  define SS_SHADOW_CALLBACKS \
    {"shadow_push", (PyCFunction)(void (*)(void))ss_cb_push, METH_FASTCALL, "monitoring: PY_START, PY_RESUME, PY_THROW"}, \
    {"shadow_pop", (PyCFunction)(void (*)(void))ss_cb_pop, METH_FASTCALL, "monitoring: PY_RETURN, PY_YIELD, PY_UNWIND"}, \
    {"shadow_call", (PyCFunction)(void (*)(void))ss_cb_call, METH_FASTCALL, "monitoring: CALL"}, \
    {"shadow_c_return", (PyCFunction)(void (*)(void))ss_cb_c_return, METH_FASTCALL, "monitoring: C_RETURN, C_RAISE"},
#else
#  define SS_SHADOW_CALLBACKS \
    {"shadow_profile_bootstrap", ss_profile_bootstrap, METH_VARARGS, "threading.setprofile: installs the C profile function"},
#endif

#define SS_SHADOW_METHODS \
    SS_SHADOW_CALLBACKS \
    SS_HOOK_METHODS \
    {"shadow_start", ss_shadow_start, METH_VARARGS, "shadow_start(c_functions, namer, profile=True): a new session"}, \
    {"shadow_stop", ss_shadow_stop, METH_NOARGS, "End the session"}, \
    {"shadow_unseed", ss_shadow_unseed, METH_NOARGS, "Seed the calling thread's stack again at its next event"}, \
    {"shadow_stack", ss_shadow_stack, METH_O, "shadow_stack(tstate) -> entries outermost first, or None"}, \
    {"shadow_c_frames", ss_shadow_c_frames, METH_NOARGS, "The frames of C callables, by id"}, \
    {"shadow_stats", ss_shadow_stats, METH_NOARGS, "Counters of the shadow stacks"},

#endif
