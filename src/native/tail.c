/* A get's read of the log cache through its TailIndex (stratalog.queues.index): one stream's runs in the
 * records not yet uploaded, the messages from `pos` to `stop` cut out of the records' bytes. The twin and
 * spec is stratalog.queues.index.TailIndex.read_python (its runs, then stratalog.queues.index.read_runs).
 * The records are the writer's own (their runs checked when sorted); each offset is still checked
 * against the bytes it points into, so a broken index raises instead of reading out of bounds. */

#include "native.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    Py_buffer starts, record, first, base, end; /* int64 CSR over streams; int32, int32, u32, u32 per run */
    long long runs;
} TailColumns;

static long long i64_of(const Py_buffer *b, long long i) {
    int64_t v;
    memcpy(&v, (const uint8_t *)b->buf + 8 * i, 8);
    return v;
}

static long long i32_of(const Py_buffer *b, long long i) {
    int32_t v;
    memcpy(&v, (const uint8_t *)b->buf + 4 * i, 4);
    return v;
}

static long long u32_of(const Py_buffer *b, long long i) {
    uint32_t v;
    memcpy(&v, (const uint8_t *)b->buf + 4 * i, 4);
    return v;
}

static int broken(const char *message) {
    PyObject *text = PyUnicode_FromString(message);
    if (text != NULL) {
        native_raise_from("stratalog.invariant", "InvariantError", text);
        Py_DECREF(text);
    }
    return -1;
}

static int as_long_long(PyObject *arg, const char *name, long long *out) {
    *out = PyLong_AsLongLong(arg);
    if (*out == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s must be an int", name);
        return -1;
    }
    return 0;
}

/* Messages first .. first + n - 1 of a record (its bytes `data`, its int32 message offsets `message_at`,
 * one more than its messages) appended to `out`. 0, or -1 with an error set. */
static int cut(PyObject *data, PyObject *message_at, long long first, long long n, PyObject *out) {
    Py_buffer bytes, at;
    if (PyObject_GetBuffer(data, &bytes, PyBUF_SIMPLE) < 0) {
        return -1;
    }
    if (PyObject_GetBuffer(message_at, &at, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&bytes);
        return -1;
    }
    int result = 0;
    long long offsets = at.len / 4;
    if (at.len % 4 != 0 || first < 0 || n < 0 || first + n >= offsets) {
        result = broken("a log-cache run's messages lie past its record's message offsets");
        goto done;
    }
    const uint8_t *raw = bytes.buf;
    long long lo = i32_of(&at, first);
    for (long long m = first + 1; m <= first + n; m++) {
        long long hi = i32_of(&at, m);
        if (!(0 <= lo && lo <= hi && hi <= bytes.len)) {
            result = broken("a log-cache message lies outside its record's bytes");
            goto done;
        }
        PyObject *message = PyBytes_FromStringAndSize((const char *)raw + lo, (Py_ssize_t)(hi - lo));
        if (message == NULL) {
            result = -1;
            goto done;
        }
        int failed = PyList_Append(out, message);
        Py_DECREF(message);
        if (failed < 0) {
            result = -1;
            goto done;
        }
        lo = hi;
    }
done:
    PyBuffer_Release(&at);
    PyBuffer_Release(&bytes);
    return result;
}

/* The runs a .. b - 1 of one stream (ends ascending), as TailIndex.runs narrows them to offset..stop,
 * then read in order as read_runs does. *pos moves. 0, or -1 with an error set. */
static int read_stream(const TailColumns *c, long long a, long long b, long long *pos, long long stop,
                       long long record_min, PyObject *datas, PyObject *message_ats, PyObject *out) {
    /* The first run that reaches stop is the last one (bisect_left of stop, plus one). */
    long long lo = a, hi = b;
    while (lo < hi) {
        long long mid = lo + (hi - lo) / 2;
        if (u32_of(&c->end, mid) < stop) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if (lo + 1 < b) {
        b = lo + 1;
    }
    /* Runs ending at or before pos are skipped (bisect_right of pos). */
    lo = a, hi = b;
    while (lo < hi) {
        long long mid = lo + (hi - lo) / 2;
        if (*pos < u32_of(&c->end, mid)) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Py_ssize_t records = PyTuple_GET_SIZE(datas);
    for (long long i = lo; i < b; i++) {
        long long r = i32_of(&c->record, i);
        if (r < 0 || r >= records) {
            return broken("a log-cache run names a record the tail index does not hold");
        }
        PyObject *data = PyTuple_GET_ITEM(datas, r);
        if (r < record_min || data == Py_None) {
            continue; /* in the objects this get read, or taken by an upload */
        }
        long long end = u32_of(&c->end, i), base = u32_of(&c->base, i);
        if (end <= *pos) {
            continue;
        }
        if (base > *pos) {
            return broken("the log cache's runs of a stream follow on from where its reader is");
        }
        long long upto = stop < end ? stop : end;
        if (cut(data, PyTuple_GET_ITEM(message_ats, r), i32_of(&c->first, i) + *pos - base, upto - *pos, out) < 0) {
            return -1;
        }
        *pos = upto;
        if (*pos >= stop) {
            break;
        }
    }
    return 0;
}

static void release(TailColumns *c, int held) {
    Py_buffer *all[] = {&c->starts, &c->record, &c->first, &c->base, &c->end};
    for (int i = 0; i < held; i++) {
        PyBuffer_Release(all[i]);
    }
}

/* read_tail(out, stream_id, pos, stop, record_min, starts, run_record, run_first, run_base, run_end, datas,
 *           message_ats) -> int: the offset reached. */
PyObject *native_read_tail(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "read_tail takes 12 arguments, not %zd", nargs);
        return NULL;
    }
    PyObject *out = args[0], *datas = args[10], *message_ats = args[11];
    if (!PyList_Check(out) || !PyTuple_Check(datas) || !PyTuple_Check(message_ats) ||
        PyTuple_GET_SIZE(datas) != PyTuple_GET_SIZE(message_ats)) {
        PyErr_SetString(PyExc_TypeError, "read_tail: out is a list; datas and message_ats are tuples of one length");
        return NULL;
    }
    long long stream_id, pos, stop, record_min;
    if (as_long_long(args[1], "stream_id", &stream_id) < 0 || as_long_long(args[2], "pos", &pos) < 0 ||
        as_long_long(args[3], "stop", &stop) < 0 || as_long_long(args[4], "record_min", &record_min) < 0) {
        return NULL;
    }
    if (stream_id < 0 || pos < 0 || stop < pos) {
        PyErr_Format(PyExc_ValueError, "read_tail: stream %lld, offsets %lld .. %lld", stream_id, pos, stop);
        return NULL;
    }
    TailColumns c;
    Py_buffer *all[] = {&c.starts, &c.record, &c.first, &c.base, &c.end};
    for (int i = 0; i < 5; i++) {
        if (PyObject_GetBuffer(args[5 + i], all[i], PyBUF_SIMPLE) < 0) {
            release(&c, i);
            return NULL;
        }
    }
    long long runs = c.record.len / 4, streams = c.starts.len / 8 - 1;
    PyObject *result = NULL;
    if (c.starts.len % 8 != 0 || streams < 0 || c.record.len % 4 != 0 || c.first.len != c.record.len ||
        c.base.len != c.record.len || c.end.len != c.record.len) {
        PyErr_SetString(PyExc_ValueError, "read_tail: starts are int64, one more than the streams; the run "
                                          "columns are 32-bit, one row per run");
        goto done;
    }
    if (stream_id < streams) {
        long long a = i64_of(&c.starts, stream_id), b = i64_of(&c.starts, stream_id + 1);
        if (!(0 <= a && a <= b && b <= runs)) {
            broken("a stream's runs lie past the tail index's runs");
            goto done;
        }
        if (read_stream(&c, a, b, &pos, stop, record_min, datas, message_ats, out) < 0) {
            goto done;
        }
    }
    result = PyLong_FromLongLong(pos);
done:
    release(&c, 5);
    return result;
}
