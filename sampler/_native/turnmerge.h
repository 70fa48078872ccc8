/* The turns of greenlets between two samples, read from a switch log, merged per
 * greenlet and drawn, and the places they are filed at, in C.
 *
 * The native engine files the CPU each greenlet used between two samples from its
 * thread's switch log (sampler/greenlets.py: entries (perf_counter_ns, record,
 * thread CPU ns)). Beyond a few turns between two samples, the CPU of those in
 * between is filed in a few runs, of greenlets drawn in proportion to what each
 * used (sampler/native_engine.py, MERGED_TURNS): a chatty gevent server logs some
 * 80 switches between two samples 1 ms apart, and merging them entry by entry in
 * Python was the largest part of its filing. This is that loop and the draw, with
 * its Python twin in sampler/greenlets.py (draw_turns_py); the tests hold them to
 * the same answers. So are the reading of the turns between two samples around it
 * (log_turns, turn_length) and the draw of the place a turn no sample saw is filed
 * at (draw_place), below, with their twins beside draw_turns_py: in Python they
 * took about a third of a chatty gevent server's filing at 1 ms (py-spy at 3 kHz
 * on the feeder); with them here (and the collections' copy of the log cut short:
 * recorder.py, record_gc) it takes a quarter to a third less CPU.
 *
 * draw_turns(log, i, j, keep, runs, point) -> [[record, CPU drawn ns, CPU used ns,
 * index of its last turn's end, turns]]: turn k, for k from i + 1 to j - 1, runs
 * from entry k - 1 (its greenlet's) to entry k. If at most `keep` greenlets ran
 * them, each is drawn all it used; else their CPU is cut in `runs` equal parts, and
 * each part goes to the greenlet whose CPU, laid end to end in the order the
 * greenlets first ran, holds the point (point + n) / runs of the whole (systematic
 * sampling: `point` in [0, 1) drawn by the caller). One list per greenlet drawn,
 * in the order each first ran. Called with the GIL (it only looks at a list the
 * caller owns); records are told apart by identity, as the switch hook makes one
 * per greenlet.
 */
#ifndef STACKSHOT_TURNMERGE_H
#define STACKSHOT_TURNMERGE_H

#include <Python.h>
#include <math.h>
#include <stdint.h>

/* Entry k's record (borrowed) and CPU clock; NULL with an error set on a bad entry
 * (the error names `fn`, the function asked). The functions here read a list the
 * caller owns, but what they allocate can run a collection, and a finalizer can run
 * Python: every read is checked against the list's length as it is then, and the
 * records kept across an allocation are strong references. */
static PyObject *ss_log_entry(const char *fn, PyObject *log, Py_ssize_t k, long long *cpu_ns) {
    if (k >= PyList_GET_SIZE(log)) {
        PyErr_Format(PyExc_RuntimeError, "%s: the log changed while it was read", fn);
        return NULL;
    }
    PyObject *entry = PyList_GET_ITEM(log, k);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 3) {
        PyErr_Format(PyExc_TypeError, "%s: log entry %zd is not a (wall, record, cpu) tuple", fn, k);
        return NULL;
    }
    PyObject *cpu = PyTuple_GET_ITEM(entry, 2);
    if (!PyLong_Check(cpu)) {
        PyErr_Format(PyExc_TypeError, "%s: log entry %zd's CPU clock is not an integer", fn, k);
        return NULL;
    }
    *cpu_ns = PyLong_AsLongLong(cpu);
    if (*cpu_ns == -1 && PyErr_Occurred()) return NULL;
    return PyTuple_GET_ITEM(entry, 1);
}

#define SS_MAX_DRAWS 65536

typedef struct {
    PyObject *rec;  /* a strong reference (NULL: a free slot) */
    long long used_ns;
    Py_ssize_t last, turns, draws;
} ss_merged_turn;

/* Turns i + 1 to j - 1 of a log merged per greenlet and drawn (see draw_turns below):
 * `order[0..n)` the greenlets in the order first seen, each with its draws, and
 * `step` the CPU of a draw (ns; `all`: each is drawn all it used). */
typedef struct {
    ss_merged_turn *table;
    ss_merged_turn **order;
    Py_ssize_t n, drawn;
    double step;
    int all;
} ss_merge;

static void ss_merge_free(ss_merge *m) {
    for (Py_ssize_t t = 0; t < m->n; t++) Py_DECREF(m->order[t]->rec);
    PyMem_Free(m->table);
    PyMem_Free(m->order);
}

/* Fill `m` (zeroed by the caller, freed with ss_merge_free whatever the outcome) for
 * turns i + 1 to j - 1 of `log` (1 <= i, i + 2 <= j <= len(log), checked by the
 * caller); -1 with an error set. */
static int ss_merge_turns(const char *fn, PyObject *log, Py_ssize_t i, Py_ssize_t j, Py_ssize_t keep,
                          Py_ssize_t runs, double point, ss_merge *m) {
    /* A table keyed by the records' addresses (the log holds them alive), at most
     * half full: one slot per turn at most, so it never fills. */
    size_t size = 16;
    while (size < 2 * (size_t)(j - i)) size *= 2;
    m->table = PyMem_Calloc(size, sizeof *m->table);
    m->order = PyMem_Calloc(size / 2, sizeof *m->order);  /* in the order first seen */
    if (m->table == NULL || m->order == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    long long began_ns;
    PyObject *rec = ss_log_entry(fn, log, i, &began_ns);
    if (rec == NULL) return -1;
    for (Py_ssize_t k = i + 1; k < j; k++) {
        long long ended_ns;
        PyObject *next = ss_log_entry(fn, log, k, &ended_ns);  /* (the greenlet of turn k + 1) */
        if (next == NULL) return -1;
        size_t h = ((uintptr_t)rec >> 4) * 0x9E3779B97F4A7C15ull;
        ss_merged_turn *slot;
        for (h &= size - 1;; h = (h + 1) & (size - 1)) {
            slot = &m->table[h];
            if (slot->rec == rec || slot->rec == NULL) break;
        }
        if (slot->rec == NULL) {
            slot->rec = Py_NewRef(rec);
            m->order[m->n++] = slot;
        }
        slot->used_ns += ended_ns - began_ns;
        slot->last = k;
        slot->turns++;
        rec = next;
        began_ns = ended_ns;
    }
    /* The draw: the greenlets' CPU end to end, the points at (point + d) / runs. */
    ss_merged_turn **order = m->order;
    Py_ssize_t n = m->n;
    long long total = 0;
    for (Py_ssize_t t = 0; t < n; t++) total += order[t]->used_ns;
    m->step = (double)total / (double)runs;
    m->all = n <= keep;
    if (m->all) {  /* (each all it used) */
        for (Py_ssize_t t = 0; t < n; t++) {
            order[t]->draws = order[t]->used_ns > 0;
            m->drawn += order[t]->draws;
        }
    } else if (total > 0) {
        long long reached = 0;
        Py_ssize_t t = 0, d = 0;
        for (; t < n && d < runs; t++) {
            reached += order[t]->used_ns;
            while (d < runs && (double)reached > (point + (double)d) * m->step) {
                if (order[t]->draws++ == 0) m->drawn++;
                d++;
            }
        }
        if (d < runs && n > 0) {  /* (rounding left the last point past the end: the last one's) */
            if (order[n - 1]->draws == 0) m->drawn++;
            order[n - 1]->draws += runs - d;
        }
    }
    return 0;
}

/* The CPU drawn to a greenlet merged (ns). */
static inline long long ss_drawn_ns(const ss_merge *m, const ss_merged_turn *turn) {
    return m->all ? turn->used_ns : (long long)((double)turn->draws * m->step);
}

/* The draw's own arguments, checked alike by every function that draws; -1 with
 * an error set (`point_obj`: the point as given, for the message). */
static int ss_check_runs(const char *fn, Py_ssize_t keep, Py_ssize_t runs, double point, PyObject *point_obj) {
    if (keep < 0 || runs < 1 || runs > SS_MAX_DRAWS || !(point >= 0 && point < 1)) {
        PyErr_Format(PyExc_ValueError,
                     "%s: need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got %zd, %zd and %R",
                     fn, keep, runs, point_obj);
        return -1;
    }
    return 0;
}

static PyObject *ss_draw_turns(PyObject *m, PyObject *args) {
    PyObject *log;
    Py_ssize_t i, j, keep, runs;
    double point;
    if (!PyArg_ParseTuple(args, "O!nnnnd:draw_turns", &PyList_Type, &log, &i, &j, &keep, &runs, &point))
        return NULL;
    if (i < 1 || j < i || j > PyList_GET_SIZE(log)) {
        PyErr_Format(PyExc_ValueError, "draw_turns: need 1 <= i <= j <= len(log) (%zd), got i=%zd, j=%zd",
                     PyList_GET_SIZE(log), i, j);
        return NULL;
    }
    if (ss_check_runs("draw_turns", keep, runs, point, PyTuple_GET_ITEM(args, 5)) < 0) return NULL;
    if (j - i < 2) return PyList_New(0);  /* (no turn between: entry i is not read) */
    ss_merge merge = {0};
    PyObject *out = NULL;
    if (ss_merge_turns("draw_turns", log, i, j, keep, runs, point, &merge) < 0) goto done;
    out = PyList_New(merge.drawn);
    if (out == NULL) goto done;
    for (Py_ssize_t t = 0, o = 0; t < merge.n; t++) {
        ss_merged_turn *turn = merge.order[t];
        if (turn->draws == 0) continue;
        PyObject *item = Py_BuildValue("[OLLnn]", turn->rec, ss_drawn_ns(&merge, turn), turn->used_ns,
                                       turn->last, turn->turns);
        if (item == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, o++, item);
    }
done:
    ss_merge_free(&merge);
    return out;
}

/* ---- the turns between two samples ------------------------------------------------
 *
 * log_turns(log, since_ns, until_ns, origin_us, keep, runs, point) -> [(record, CPU
 * used us, wall clock where it ended us, CPU to find turns like it by us)]: the turns
 * of greenlets in a thread whose switch log is `log`, from its CPU clock `since_ns`
 * (the last sample's) to `until_ns` (this one's), in order (sampler/native_engine.py,
 * NativeCollector._turns, says what they are for). Its Python twin is log_turns_py
 * in sampler/greenlets.py, the tests hold them to the same answers; in Python it was a
 * fifth of a chatty gevent server's filing at 1 ms. Wall clocks are converted as
 * Python converts them, `int(wall_ns / 1000 - origin_us)`, for clocks below 2**53 ns
 * (104 days): beyond, the conversion to a double rounds first, and an end can come out
 * 1 us apart from the twin's.
 *
 * turn_length(log, cpu_ns) -> us: the CPU of the turn running at CPU clock `cpu_ns` by
 * the log (so far, if it had not ended when the log was copied; 0 before the log).
 */

/* The first index in [lo, len(log)) whose entry's CPU clock is above `x`, the log
 * sorted by it (bisect_right); -1 with an error set. */
static Py_ssize_t ss_cpu_bisect(const char *fn, PyObject *log, long long x, Py_ssize_t lo) {
    Py_ssize_t hi = PyList_GET_SIZE(log);
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        long long cpu;
        if (ss_log_entry(fn, log, mid, &cpu) == NULL) return -1;
        if (x < cpu) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

/* a // b, rounded down as Python's is (b > 0). */
static inline long long ss_floordiv(long long a, long long b) {
    long long q = a / b;
    return (a % b != 0 && a < 0) ? q - 1 : q;
}

/* int(log[k][0] / 1000 - origin_us) into *out; -1 with an error set. */
static int ss_ended_us(const char *fn, PyObject *log, Py_ssize_t k, double origin_us, long long *out) {
    long long cpu;
    if (ss_log_entry(fn, log, k, &cpu) == NULL) return -1;
    PyObject *wall = PyTuple_GET_ITEM(PyList_GET_ITEM(log, k), 0);
    double w = PyLong_Check(wall) ? PyLong_AsDouble(wall) : -1.0;
    if (!PyLong_Check(wall) || (w == -1.0 && PyErr_Occurred())) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_TypeError, "%s: log entry %zd's wall clock is not an integer", fn, k);
        return -1;
    }
    double us = w / 1000.0 - origin_us;
    if (!(us > -9e18 && us < 9e18)) {
        PyErr_Format(PyExc_OverflowError, "%s: log entry %zd's wall clock is out of range", fn, k);
        return -1;
    }
    *out = (long long)us;
    return 0;
}

/* Append (rec, used, ended, like) to `out`; -1 with an error set. */
static int ss_add_turn(PyObject *out, PyObject *rec, long long used, long long ended, long long like) {
    PyObject *turn = Py_BuildValue("(OLLL)", rec, used, ended, like);
    if (turn == NULL) return -1;
    int failed = PyList_Append(out, turn);
    Py_DECREF(turn);
    return failed;
}

static PyObject *ss_log_turns(PyObject *mod, PyObject *args) {
    static const char *fn = "log_turns";
    PyObject *log;
    long long since_ns, until_ns;
    double origin_us, point;
    Py_ssize_t keep, runs;
    if (!PyArg_ParseTuple(args, "O!LLdnnd:log_turns", &PyList_Type, &log, &since_ns, &until_ns, &origin_us,
                          &keep, &runs, &point))
        return NULL;
    if (ss_check_runs(fn, keep, runs, point, PyTuple_GET_ITEM(args, 6)) < 0) return NULL;
    Py_ssize_t size = PyList_GET_SIZE(log);
    if (size == 0) return PyList_New(0);
    PyObject *head = PyList_GET_ITEM(log, 0);
    if (!PyTuple_Check(head) || PyTuple_GET_SIZE(head) < 3) return PyList_New(0);  /* (no CPU clocks logged) */
    Py_ssize_t i = ss_cpu_bisect(fn, log, since_ns, 0);
    if (i < 0) return NULL;
    long long cpu_i, cpu_last, cpu_k;
    if (i == 0 || i == size) return PyList_New(0);
    if (ss_log_entry(fn, log, i, &cpu_i) == NULL) return NULL;
    if (cpu_i > until_ns) return PyList_New(0);
    Py_ssize_t j = ss_cpu_bisect(fn, log, until_ns, i);  /* log[i:j]: the switches between */
    if (j < 0) return NULL;
    PyObject *first_rec, *final_rec;
    long long first_ended;
    if ((first_rec = ss_log_entry(fn, log, i - 1, &cpu_k)) == NULL) return NULL;
    if ((final_rec = ss_log_entry(fn, log, j - 1, &cpu_last)) == NULL) return NULL;
    if (ss_ended_us(fn, log, i, origin_us, &first_ended) < 0) return NULL;
    long long first_used = ss_floordiv(cpu_i - since_ns, 1000), final_used = ss_floordiv(until_ns - cpu_last, 1000);
    ss_merge merge = {0};
    ss_merged_turn **drawn_turns = NULL;
    Py_INCREF(first_rec);
    Py_INCREF(final_rec);
    PyObject *out = PyList_New(0);
    if (out == NULL) goto fail;
    /* (turns of no CPU left out, but for the last: the one the sample found) */
    if (first_used > 0 && ss_add_turn(out, first_rec, first_used, first_ended, first_used) < 0) goto fail;
    if (j - i + 1 <= keep) {  /* (each turn k of the middle: from entry k - 1 to entry k) */
        long long began_ns = cpu_i;
        for (Py_ssize_t k = i + 1; k < j; k++) {
            long long began_again, ended_ns, ended_us;
            PyObject *rec = ss_log_entry(fn, log, k - 1, &began_again);  /* (the turn's greenlet) */
            if (rec == NULL || ss_log_entry(fn, log, k, &ended_ns) == NULL
                || ss_ended_us(fn, log, k, origin_us, &ended_us) < 0)
                goto fail;
            long long used = ss_floordiv(ended_ns - began_ns, 1000);
            if (used > 0) {
                Py_INCREF(rec);  /* (held across the allocation) */
                int failed = ss_add_turn(out, rec, used, ended_us, used);
                Py_DECREF(rec);
                if (failed < 0) goto fail;
            }
            began_ns = ended_ns;
        }
    } else if (j - i >= 2) {  /* the turns in between, one per greenlet drawn, in the order they ended */
        if (ss_merge_turns(fn, log, i, j, keep, runs, point, &merge) < 0) goto fail;
        /* (the drawn, apart: `order` is what ss_merge_free lets go of) */
        drawn_turns = PyMem_Malloc((size_t)(merge.drawn > 0 ? merge.drawn : 1) * sizeof *drawn_turns);
        if (drawn_turns == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        Py_ssize_t drawn = 0;
        for (Py_ssize_t t = 0; t < merge.n && drawn < merge.drawn; t++)
            if (merge.order[t]->draws) drawn_turns[drawn++] = merge.order[t];
        for (Py_ssize_t t = 1; t < drawn; t++) {  /* (by the end of their last turn: few) */
            ss_merged_turn *turn = drawn_turns[t];
            Py_ssize_t u = t;
            for (; u > 0 && drawn_turns[u - 1]->last > turn->last; u--) drawn_turns[u] = drawn_turns[u - 1];
            drawn_turns[u] = turn;
        }
        for (Py_ssize_t t = 0; t < drawn; t++) {
            ss_merged_turn *turn = drawn_turns[t];
            long long used = ss_floordiv(ss_drawn_ns(&merge, turn), 1000), ended_us;
            if (ss_ended_us(fn, log, turn->last, origin_us, &ended_us) < 0) goto fail;
            long long like = turn->turns > 1 ? 0 : ss_floordiv(turn->used_ns, 1000);
            if (used > 0 && ss_add_turn(out, turn->rec, used, ended_us, like) < 0) goto fail;
        }
    }
    if (ss_add_turn(out, final_rec, final_used, 0, final_used) < 0) goto fail;
    PyMem_Free(drawn_turns);
    ss_merge_free(&merge);
    Py_DECREF(first_rec);
    Py_DECREF(final_rec);
    return out;
fail:
    PyMem_Free(drawn_turns);
    ss_merge_free(&merge);
    Py_DECREF(first_rec);
    Py_DECREF(final_rec);
    Py_XDECREF(out);
    return NULL;
}

static PyObject *ss_turn_length(PyObject *mod, PyObject *args) {
    static const char *fn = "turn_length";
    PyObject *log;
    long long cpu_ns;
    if (!PyArg_ParseTuple(args, "O!L:turn_length", &PyList_Type, &log, &cpu_ns)) return NULL;
    Py_ssize_t size = PyList_GET_SIZE(log);
    if (size == 0) return PyLong_FromLong(0);
    PyObject *head = PyList_GET_ITEM(log, 0);
    if (!PyTuple_Check(head) || PyTuple_GET_SIZE(head) < 3) return PyLong_FromLong(0);
    Py_ssize_t i = ss_cpu_bisect(fn, log, cpu_ns, 0);
    if (i < 0) return NULL;
    long long began_ns = 0, ended_ns = cpu_ns;
    if (i > 0 && ss_log_entry(fn, log, i - 1, &began_ns) == NULL) return NULL;
    if (i < size && ss_log_entry(fn, log, i, &ended_ns) == NULL) return NULL;
    return PyLong_FromLongLong(ss_floordiv(ended_ns > began_ns ? ended_ns - began_ns : 0, 1000));
}

/* draw_place(places, used, like, point) -> place: one of a greenlet's places seen
 * running (sampler/native_engine.py, _Slot.places: tuples whose item 4 is the log of
 * the CPU, in us, of the turn each was seen in), for a turn no sample saw that used
 * `used` us: drawn uniformly (`point` in [0, 1), drawn by the caller) among those
 * seen in turns most like it, within `like` of the closest log ratio of turn
 * lengths (`used` 0: among all). Its Python twin is draw_place_py there; filtering
 * and drawing in Python took an eighth of a chatty gevent server's filing. Called
 * with the GIL; the list is the caller's. */
static int ss_place_turn(PyObject *places, Py_ssize_t k, double *log_turn) {
    if (k >= PyList_GET_SIZE(places)) {  /* (cannot be: nothing here runs Python) */
        PyErr_SetString(PyExc_RuntimeError, "draw_place: the places changed while they were read");
        return -1;
    }
    PyObject *place = PyList_GET_ITEM(places, k);
    if (!PyTuple_Check(place) || PyTuple_GET_SIZE(place) < 5) {
        PyErr_Format(PyExc_TypeError, "draw_place: place %zd is not a tuple of 5 or more items", k);
        return -1;
    }
    PyObject *turn = PyTuple_GET_ITEM(place, 4);
    if (PyFloat_Check(turn)) {  /* (read without calling Python: no __float__) */
        *log_turn = PyFloat_AS_DOUBLE(turn);
    } else if (PyLong_Check(turn)) {
        *log_turn = PyLong_AsDouble(turn);
        if (*log_turn == -1.0 && PyErr_Occurred()) return -1;
    } else {
        PyErr_Format(PyExc_TypeError, "draw_place: place %zd's turn length is not a number", k);
        return -1;
    }
    return 0;
}

static PyObject *ss_draw_place(PyObject *m, PyObject *args) {
    PyObject *places;
    long long used;
    double like, point;
    if (!PyArg_ParseTuple(args, "O!Ldd:draw_place", &PyList_Type, &places, &used, &like, &point)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(places);
    if (n == 0 || !(point >= 0 && point < 1) || !(like >= 0)) {
        PyErr_Format(PyExc_ValueError,
                     "draw_place: need places, like >= 0 and 0 <= point < 1, got %zd places, %R and %R", n,
                     PyTuple_GET_ITEM(args, 2), PyTuple_GET_ITEM(args, 3));
        return NULL;
    }
    Py_ssize_t pick = (Py_ssize_t)(point * (double)n);
    if (used > 0 && n > 1) {
        /* (passes over a handful: the closest ratio, how many are within reach of it, the pick-th) */
        double log_used = log((double)used), nearest = HUGE_VAL, turn;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (ss_place_turn(places, k, &turn) < 0) return NULL;
            if (fabs(turn - log_used) < nearest) nearest = fabs(turn - log_used);
        }
        double reach = nearest + like;
        Py_ssize_t alike = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (ss_place_turn(places, k, &turn) < 0) return NULL;
            alike += fabs(turn - log_used) <= reach;
        }
        pick = (Py_ssize_t)(point * (double)alike);
        Py_ssize_t last = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (ss_place_turn(places, k, &turn) < 0) return NULL;
            if (fabs(turn - log_used) > reach) continue;
            if (pick-- == 0) return Py_NewRef(PyList_GET_ITEM(places, k));
            last = k;
        }
        return Py_NewRef(PyList_GET_ITEM(places, last));  /* (a point rounded up to 1) */
    }
    if (pick >= n) pick = n - 1;  /* (likewise) */
    return Py_NewRef(PyList_GET_ITEM(places, pick));
}

#define SS_TURNMERGE_METHODS \
    {"log_turns", ss_log_turns, METH_VARARGS, \
     "log_turns(log, since_ns, until_ns, origin_us, keep, runs, point) -> [(record, used_us, ended_us, " \
     "like_us)]: the greenlet turns of a switch log between two CPU clocks"}, \
    {"turn_length", ss_turn_length, METH_VARARGS, \
     "turn_length(log, cpu_ns) -> us: the CPU of the turn running at CPU clock cpu_ns, by a switch log"}, \
    {"draw_place", ss_draw_place, METH_VARARGS, \
     "draw_place(places, used, like, point) -> place: one of a greenlet's places, drawn uniformly among " \
     "those seen in turns within `like` (log ratio) of the one most like a turn of `used` us"}, \
    {"draw_turns", ss_draw_turns, METH_VARARGS, \
     "draw_turns(log, i, j, keep, runs, point) -> [[record, drawn_ns, used_ns, last, turns]]: a switch " \
     "log's turns i+1..j-1 merged per greenlet, their CPU drawn in `runs` parts beyond `keep` greenlets"},

#endif
