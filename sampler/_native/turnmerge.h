/* The turns of a stretch of a greenlet switch log, merged per greenlet and drawn, in C.
 *
 * The native engine files the CPU each greenlet used between two samples from its
 * thread's switch log (sampler/greenlets.py: entries (perf_counter_ns, record,
 * thread CPU ns)). Beyond a few turns between two samples, the CPU of those in
 * between is filed in a few runs, of greenlets drawn in proportion to what each
 * used (sampler/native_engine.py, MERGED_TURNS): a chatty gevent server logs some
 * 80 switches between two samples 1 ms apart, and merging them entry by entry in
 * Python was the largest part of its filing. This is that loop and the draw, with
 * its Python twin in sampler/greenlets.py (draw_turns_py); the tests hold them to
 * the same answers.
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

/* Entry k's record (borrowed) and CPU clock; NULL with an error set on a bad entry. */
static PyObject *ss_log_entry(PyObject *log, Py_ssize_t k, long long *cpu_ns) {
    PyObject *entry = PyList_GET_ITEM(log, k);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 3) {
        PyErr_Format(PyExc_TypeError, "draw_turns: log entry %zd is not a (wall, record, cpu) tuple", k);
        return NULL;
    }
    PyObject *cpu = PyTuple_GET_ITEM(entry, 2);
    if (!PyLong_Check(cpu)) {
        PyErr_Format(PyExc_TypeError, "draw_turns: log entry %zd's CPU clock is not an integer", k);
        return NULL;
    }
    *cpu_ns = PyLong_AsLongLong(cpu);
    if (*cpu_ns == -1 && PyErr_Occurred()) return NULL;
    return PyTuple_GET_ITEM(entry, 1);
}

#define SS_MAX_DRAWS 65536

typedef struct {
    PyObject *rec;  /* borrowed from the log (NULL: a free slot) */
    long long used_ns;
    Py_ssize_t last, turns, draws;
} ss_merged_turn;

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
    if (keep < 0 || runs < 1 || runs > SS_MAX_DRAWS || !(point >= 0 && point < 1)) {
        PyErr_Format(PyExc_ValueError,
                     "draw_turns: need keep >= 0, 1 <= runs <= 65536 and 0 <= point < 1, got %zd, %zd and %R",
                     keep, runs, PyTuple_GET_ITEM(args, 5));
        return NULL;
    }
    if (j - i < 2) return PyList_New(0);  /* (no turn between: entry i is not read) */
    /* A table keyed by the records' addresses (the log holds them alive), at most
     * half full: one slot per turn at most, so it never fills. */
    size_t size = 16;
    while (size < 2 * (size_t)(j - i)) size *= 2;
    ss_merged_turn *table = PyMem_Calloc(size, sizeof *table);
    ss_merged_turn **order = PyMem_Calloc(size / 2, sizeof *order);  /* in the order first seen */
    PyObject *out = NULL;
    Py_ssize_t n = 0;
    if (table == NULL || order == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    long long began_ns;
    PyObject *rec = ss_log_entry(log, i, &began_ns);
    if (rec == NULL) goto done;
    for (Py_ssize_t k = i + 1; k < j; k++) {
        long long ended_ns;
        PyObject *next = ss_log_entry(log, k, &ended_ns);  /* (the greenlet of turn k + 1) */
        if (next == NULL) goto done;
        size_t h = ((uintptr_t)rec >> 4) * 0x9E3779B97F4A7C15ull;
        ss_merged_turn *slot;
        for (h &= size - 1;; h = (h + 1) & (size - 1)) {
            slot = &table[h];
            if (slot->rec == rec || slot->rec == NULL) break;
        }
        if (slot->rec == NULL) {
            slot->rec = rec;
            order[n++] = slot;
        }
        slot->used_ns += ended_ns - began_ns;
        slot->last = k;
        slot->turns++;
        rec = next;
        began_ns = ended_ns;
    }
    /* The draw: the greenlets' CPU end to end, the points at (point + d) / runs. */
    long long total = 0;
    for (Py_ssize_t t = 0; t < n; t++) total += order[t]->used_ns;
    Py_ssize_t drawn = 0;
    double step = (double)total / (double)runs;
    if (n <= keep) {  /* (each all it used) */
        for (Py_ssize_t t = 0; t < n; t++) {
            order[t]->draws = order[t]->used_ns > 0;
            drawn += order[t]->draws;
        }
    } else if (total > 0) {
        long long reached = 0;
        Py_ssize_t t = 0, d = 0;
        for (; t < n && d < runs; t++) {
            reached += order[t]->used_ns;
            while (d < runs && (double)reached > (point + (double)d) * step) {
                if (order[t]->draws++ == 0) drawn++;
                d++;
            }
        }
        if (d < runs && n > 0) {  /* (rounding left the last point past the end: the last one's) */
            if (order[n - 1]->draws == 0) drawn++;
            order[n - 1]->draws += runs - d;
        }
    }
    out = PyList_New(drawn);
    if (out == NULL) goto done;
    for (Py_ssize_t t = 0, o = 0; t < n; t++) {
        ss_merged_turn *turn = order[t];
        if (turn->draws == 0) continue;
        long long drawn_ns = n <= keep ? turn->used_ns : (long long)((double)turn->draws * step);
        PyObject *item = Py_BuildValue("[OLLnn]", turn->rec, drawn_ns, turn->used_ns, turn->last, turn->turns);
        if (item == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, o++, item);
    }
done:
    PyMem_Free(table);
    PyMem_Free(order);
    return out;
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
    PyObject *place = PyList_GET_ITEM(places, k);
    if (!PyTuple_Check(place) || PyTuple_GET_SIZE(place) < 5) {
        PyErr_Format(PyExc_TypeError, "draw_place: place %zd is not a tuple of 5 or more items", k);
        return -1;
    }
    *log_turn = PyFloat_AsDouble(PyTuple_GET_ITEM(place, 4));
    if (*log_turn == -1.0 && PyErr_Occurred()) return -1;
    return 0;
}

static PyObject *ss_draw_place(PyObject *m, PyObject *args) {
    PyObject *places;
    long long used;
    double like, point;
    if (!PyArg_ParseTuple(args, "O!Ldd:draw_place", &PyList_Type, &places, &used, &like, &point)) return NULL;
    Py_ssize_t n = PyList_GET_SIZE(places);
    if (n == 0 || !(point >= 0 && point < 1) || !(like >= 0)) {
        PyErr_Format(PyExc_ValueError, "draw_place: need places, like >= 0 and 0 <= point < 1, got %zd places, %R and %R",
                     n, PyTuple_GET_ITEM(args, 2), PyTuple_GET_ITEM(args, 3));
        return NULL;
    }
    Py_ssize_t pick = (Py_ssize_t)(point * (double)n);
    if (used > 0 && n > 1) {
        /* (two passes over a handful: the closest ratio, then the pick-th within reach) */
        double log_used = log((double)used), nearest = HUGE_VAL, turn;
        for (Py_ssize_t k = 0; k < n; k++) {
            if (ss_place_turn(places, k, &turn) < 0) return NULL;
            if (fabs(turn - log_used) < nearest) nearest = fabs(turn - log_used);
        }
        double reach = nearest + like;
        Py_ssize_t alike = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            ss_place_turn(places, k, &turn);
            alike += fabs(turn - log_used) <= reach;
        }
        pick = (Py_ssize_t)(point * (double)alike);
        Py_ssize_t last = 0;
        for (Py_ssize_t k = 0; k < n; k++) {
            ss_place_turn(places, k, &turn);
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
    {"draw_place", ss_draw_place, METH_VARARGS, \
     "draw_place(places, used, like, point) -> place: one of a greenlet's places, drawn uniformly among " \
     "those seen in turns within `like` (log ratio) of the one most like a turn of `used` us"}, \
    {"draw_turns", ss_draw_turns, METH_VARARGS, \
     "draw_turns(log, i, j, keep, runs, point) -> [[record, drawn_ns, used_ns, last, turns]]: a switch " \
     "log's turns i+1..j-1 merged per greenlet, their CPU drawn in `runs` parts beyond `keep` greenlets"},

#endif
