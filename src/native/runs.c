/* A random get's read of a queue's run (docs/formats/queues.md): the pages it lies in, if the page cache
 * holds them, each checked against its CRC, and the messages asked for cut out of the run. The twin and
 * spec is stratalog.queues.objects.read_messages_cached; and a sequential get's read of a whole run to
 * keep, twin stratalog.queues.objects.read_run_cached. The reading keeps the GIL as the twins' does
 * (preadv2 with RWF_NOWAIT answers from the page cache or not at all). */

#include "native.h"

#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

#define PAGE_BYTES 4096
/* stratalog.io.libc.CACHED_READ_BYTES_MAX: the most one cached read takes. */
#define CACHED_READ_BYTES_MAX (64 << 10)

static uint32_t u32_at(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static PyObject *corrupt(PyObject *message) {
    if (message != NULL) {
        native_raise_from("stratalog.queues.format", "CorruptBulkError", message);
        Py_DECREF(message);
    }
    return NULL;
}

/* Python's raw[a:b] for 0 <= a, b: clamped to the data, empty where b <= a. */
static PyObject *slice_of(const uint8_t *raw, long long length, long long a, long long b) {
    long long lo = a < length ? a : length;
    long long hi = b < length ? b : length;
    return PyBytes_FromStringAndSize((const char *)raw + lo, (Py_ssize_t)(hi > lo ? hi - lo : 0));
}

/* The run in raw[0:length] is framed by its `count` message ends (as queues.format.frame_run): 0, else
 * -1 with CorruptBulkError set. */
static int check_frame(const uint8_t *raw, long long length, long long count, PyObject *key, long long stream_id) {
    long long at = 4 * count;
    if (length < at) {
        corrupt(PyUnicode_FromFormat("run of stream %lld in object %U: shorter than its message ends; the object "
                                     "is damaged", stream_id, key));
        return -1;
    }
    if (count && (long long)u32_at(raw + at - 4) != length - at) {
        corrupt(PyUnicode_FromFormat("run of stream %lld in object %U: message ends do not match its length",
                                     stream_id, key));
        return -1;
    }
    return 0;
}

/* Messages first .. stop - 1 of the run in raw[0:length], `count` messages framed by their ends. */
static PyObject *cut_messages(const uint8_t *raw, long long length, long long count, long long first,
                              long long stop, PyObject *key, long long stream_id) {
    long long at = 4 * count;
    if (check_frame(raw, length, count, key, stream_id) < 0) {
        return NULL;
    }
    PyObject *out = PyList_New((Py_ssize_t)(stop - first));
    if (out == NULL) {
        return NULL;
    }
    long long lo = first ? at + u32_at(raw + 4 * (first - 1)) : at;
    for (long long i = first; i < stop; i++) {
        long long end = at + u32_at(raw + 4 * i);
        PyObject *message = slice_of(raw, length, lo, end);
        if (message == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)(i - first), message);
        lo = end;
    }
    return out;
}

static int as_long_long(PyObject *arg, const char *name, long long *out) {
    *out = PyLong_AsLongLong(arg);
    if (*out == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Format(PyExc_TypeError, "%s must be an int", name);
        }
        return -1;
    }
    return 0;
}

/* Bytes lo .. hi of the runs of object `key` read from the page cache into *data (PyMem_Malloc'd; the
 * caller frees it), each page checked against its CRC in `pages`: 1; 0 where the page cache does not hold
 * them all (nothing to free); -1 with CorruptBulkError set (the caller frees *data). */
static int read_checked_pages(int fd, long long lo, long long hi, const Py_buffer *pages, PyObject *key,
                              uint8_t **data) {
    *data = PyMem_Malloc((size_t)(hi - lo));
    if (*data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    struct iovec vector = {.iov_base = *data, .iov_len = (size_t)(hi - lo)};
    if (preadv2(fd, &vector, 1, (off_t)lo, RWF_NOWAIT) != hi - lo) {
        PyMem_Free(*data); /* not all in the page cache (or not readable): the caller waits */
        *data = NULL;
        return 0;
    }
    long long first_page = lo / PAGE_BYTES;
    long long page_count = (hi - lo + PAGE_BYTES - 1) / PAGE_BYTES;
    if (first_page + page_count > pages->len / 4) {
        corrupt(PyUnicode_FromFormat("object %U: a read of bytes %lld .. %lld is not within its pages", key, lo, hi));
        return -1;
    }
    for (long long i = 0; i < page_count; i++) {
        long long at = i * PAGE_BYTES;
        long long size = hi - lo - at < PAGE_BYTES ? hi - lo - at : PAGE_BYTES;
        uint32_t want;
        memcpy(&want, (const uint8_t *)pages->buf + 4 * (first_page + i), 4); /* native order, as the array */
        if (native_crc32c(0, *data + at, (size_t)size) != want) {
            long long page = first_page + i;
            corrupt(PyUnicode_FromFormat("object %U: page %lld (bytes %lld ..) failed its CRC: the object is "
                                         "damaged", key, page, page * PAGE_BYTES));
            return -1;
        }
    }
    return 1;
}

/* The arguments both reads share: fd, runs_bytes, pages, key, start, end, count, stream_id. */
typedef struct {
    long long fd, runs_bytes, start, end, count, stream_id;
    PyObject *pages;
    PyObject *key;
} RunArgs;

/* 0 where a CRC32C function is loaded, else -1 with RuntimeError set. */
static int crc_loaded(void) {
    if (native_crc32c == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no CRC32C library is loaded (stratalog.native)");
        return -1;
    }
    return 0;
}

/* An object's page CRCs and key (a str) into `run`: 0, or -1 with TypeError set. */
static int set_object(RunArgs *run, PyObject *pages, PyObject *key) {
    run->pages = pages;
    run->key = key;
    if (!PyUnicode_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "key must be a str");
        return -1;
    }
    return 0;
}

static int parse_run_args(PyObject *const *args, RunArgs *run) {
    if (crc_loaded() < 0 || as_long_long(args[0], "fd", &run->fd) < 0 ||
        as_long_long(args[1], "runs_bytes", &run->runs_bytes) < 0 || as_long_long(args[4], "start", &run->start) < 0 ||
        as_long_long(args[5], "end", &run->end) < 0 || as_long_long(args[6], "count", &run->count) < 0 ||
        as_long_long(args[7], "stream_id", &run->stream_id) < 0) {
        return -1;
    }
    return set_object(run, args[2], args[3]);
}

/* Read, check and hand to `take` the pages that hold the run: None where they are not all in the page
 * cache or the span is empty or above one cached read. */
static PyObject *read_run(const RunArgs *run, PyObject *(*take)(const RunArgs *, const uint8_t *, void *),
                          void *context) {
    long long lo = run->start - run->start % PAGE_BYTES;
    long long hi = run->end + (PAGE_BYTES - run->end % PAGE_BYTES) % PAGE_BYTES;
    if (hi > run->runs_bytes) {
        hi = run->runs_bytes;
    }
    if (!(0 < hi - lo && hi - lo <= CACHED_READ_BYTES_MAX)) {
        Py_RETURN_NONE;
    }
    Py_buffer pages;
    if (PyObject_GetBuffer(run->pages, &pages, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *data = NULL;
    int got = read_checked_pages((int)run->fd, lo, hi, &pages, run->key, &data);
    if (got == 0) {
        result = Py_NewRef(Py_None);
    } else if (got > 0) {
        PyObject *taken = take(run, data + (run->start - lo), context);
        if (taken != NULL) {
            result = Py_BuildValue("(NL)", taken, hi - lo);
        }
    }
    PyMem_Free(data);
    PyBuffer_Release(&pages);
    return result;
}

typedef struct {
    long long first, stop;
} Wanted;

static PyObject *take_messages(const RunArgs *run, const uint8_t *raw, void *context) {
    const Wanted *wanted = context;
    return cut_messages(raw, run->end - run->start, run->count, wanted->first, wanted->stop, run->key,
                        run->stream_id);
}

/* Messages wanted->first .. wanted->stop - 1 of the run `run` describes, from the page cache: as
 * read_messages_cached, its bounds checked first. */
static PyObject *read_messages(const RunArgs *run, Wanted *wanted) {
    if (!(0 <= run->start && run->start <= run->end && run->end <= run->runs_bytes && 0 <= wanted->first &&
          wanted->first <= wanted->stop && wanted->stop <= run->count && run->count <= UINT32_MAX && run->fd >= 0 &&
          run->fd <= INT32_MAX)) {
        PyErr_Format(PyExc_ValueError, "a run at bytes %lld .. %lld of %lld, messages %lld .. %lld of %lld: "
                     "out of bounds", run->start, run->end, run->runs_bytes, wanted->first, wanted->stop, run->count);
        return NULL;
    }
    return read_run(run, take_messages, wanted);
}

/* read_messages_cached(fd, runs_bytes, pages, key, start, end, count, stream_id, first, stop)
 *     -> (list[bytes], bytes read) | None */
PyObject *native_read_messages_cached(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "read_messages_cached takes 10 arguments, not %zd", nargs);
        return NULL;
    }
    RunArgs run;
    Wanted wanted;
    if (parse_run_args(args, &run) < 0 || as_long_long(args[8], "first", &wanted.first) < 0 ||
        as_long_long(args[9], "stop", &wanted.stop) < 0) {
        return NULL;
    }
    return read_messages(&run, &wanted);
}

static PyObject *take_run(const RunArgs *run, const uint8_t *raw, void *context) {
    (void)context;
    long long length = run->end - run->start;
    if (check_frame(raw, length, run->count, run->key, run->stream_id) < 0) {
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)raw, (Py_ssize_t)length);
}

/* read_run_cached(fd, runs_bytes, pages, key, start, end, count, stream_id) -> (bytes, bytes read) | None */
PyObject *native_read_run_cached(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "read_run_cached takes 8 arguments, not %zd", nargs);
        return NULL;
    }
    RunArgs run;
    if (parse_run_args(args, &run) < 0) {
        return NULL;
    }
    if (!(0 <= run.start && run.start <= run.end && run.end <= run.runs_bytes && 0 <= run.count &&
          run.count <= UINT32_MAX && run.fd >= 0 && run.fd <= INT32_MAX)) {
        PyErr_Format(PyExc_ValueError, "a run at bytes %lld .. %lld of %lld (%lld messages): out of bounds",
                     run.start, run.end, run.runs_bytes, run.count);
        return NULL;
    }
    return read_run(&run, take_run, NULL);
}

/* A u32 of a matrix (native order, as the index's arrays). */
static long long u32_of(const Py_buffer *matrix, long long i) {
    uint32_t value;
    memcpy(&value, (const uint8_t *)matrix->buf + 4 * i, 4);
    return value;
}

/* The run of object k (its read arguments `object`, a tuple (fd, runs_bytes, pages, key), fd already in
 * `run`) read for messages first .. stop - 1: as read_messages_cached; `run` has start, end, count and
 * stream_id set. */
static PyObject *read_object_run(PyObject *object, RunArgs *run, Wanted *wanted) {
    if (as_long_long(PyTuple_GET_ITEM(object, 1), "runs_bytes", &run->runs_bytes) < 0 ||
        set_object(run, PyTuple_GET_ITEM(object, 2), PyTuple_GET_ITEM(object, 3)) < 0) {
        return NULL;
    }
    return read_messages(run, wanted);
}

typedef struct {
    Py_buffer ends, positions;
    long long capacity, stream_id, pos, stop;
    PyObject *objects;
} RandomArgs;

/* The loop of read_random_cached over one stream's row, from `pos`: appends to `out`, counts into
 * reads/read_bytes, moves *pos. 0, or -1 with an error set. */
static int read_row(RandomArgs *a, PyObject *out, long long *reads, long long *read_bytes) {
    Py_ssize_t count = PyTuple_GET_SIZE(a->objects);
    long long at = a->stream_id * a->capacity;
    long long lo = 0, hi = count; /* bisect_right over the row's ends */
    while (lo < hi) {
        long long mid = lo + (hi - lo) / 2;
        if (a->pos < u32_of(&a->ends, at + mid)) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    long long k = lo;
    long long start = k ? u32_of(&a->ends, at + k - 1) : 0;
    while (a->pos < a->stop && k < count) {
        long long end = u32_of(&a->ends, at + k);
        if (end > start) {
            PyObject *object = PyTuple_GET_ITEM(a->objects, k);
            RunArgs run;
            if (!PyTuple_Check(object) || PyTuple_GET_SIZE(object) != 4) {
                PyErr_SetString(PyExc_TypeError, "an object's read arguments are (fd, runs_bytes, pages, key)");
                return -1;
            }
            if (as_long_long(PyTuple_GET_ITEM(object, 0), "fd", &run.fd) < 0) {
                return -1;
            }
            if (run.fd < 0) {
                break; /* no local file: its runs come through the object store */
            }
            long long upto = a->stop < end ? a->stop : end;
            run.start = u32_of(&a->positions, at + k);
            run.end = u32_of(&a->positions, at + a->capacity + k);
            run.count = end - start;
            run.stream_id = a->stream_id;
            Wanted wanted = {a->pos - start, upto - start};
            PyObject *got = read_object_run(object, &run, &wanted);
            if (got == NULL) {
                return -1;
            }
            if (got == Py_None) {
                Py_DECREF(got);
                break; /* not in the page cache: the caller waits for it */
            }
            PyObject *messages = PyTuple_GET_ITEM(got, 0);
            long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(got, 1));
            Py_ssize_t n = PyList_GET_SIZE(out);
            int failed = PyList_SetSlice(out, n, n, messages) < 0;
            Py_DECREF(got);
            if (failed) {
                return -1;
            }
            *reads += 1;
            *read_bytes += size;
            a->pos = upto;
        }
        start = end;
        k++;
    }
    return 0;
}

/* read_random_cached(ends, positions, capacity, objects, stream_id, pos, stop)
 *     -> (list[bytes], pos reached, reads, bytes read) */
PyObject *native_read_random_cached(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "read_random_cached takes 7 arguments, not %zd", nargs);
        return NULL;
    }
    if (crc_loaded() < 0) {
        return NULL;
    }
    RandomArgs a;
    if (!PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "objects must be a tuple");
        return NULL;
    }
    a.objects = args[3];
    if (as_long_long(args[2], "capacity", &a.capacity) < 0 || as_long_long(args[4], "stream_id", &a.stream_id) < 0 ||
        as_long_long(args[5], "pos", &a.pos) < 0 || as_long_long(args[6], "stop", &a.stop) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &a.ends, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &a.positions, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&a.ends);
        return NULL;
    }
    long long count = PyTuple_GET_SIZE(a.objects);
    long long ends_count = a.ends.len / 4, positions_count = a.positions.len / 4;
    PyObject *out = NULL, *result = NULL;
    long long reads = 0, read_bytes = 0;
    if (!(0 <= count && count <= a.capacity && 0 <= a.pos && a.pos <= a.stop && a.stream_id >= 0 &&
          a.ends.len % 4 == 0 && a.positions.len % 4 == 0 && ends_count % (a.capacity > 1 ? a.capacity : 1) == 0 &&
          positions_count == ends_count + a.capacity)) {
        PyErr_Format(PyExc_ValueError, "%lld objects, capacity %lld, matrices of %lld and %lld, stream %lld, offsets "
                     "%lld .. %lld: they do not fit together", count, a.capacity, ends_count, positions_count,
                     a.stream_id, a.pos, a.stop);
        goto done;
    }
    out = PyList_New(0);
    if (out == NULL) {
        goto done;
    }
    /* Rows beyond the matrices have no runs: nothing read. Within, every index read is below
     * (stream_id + 1) * capacity + count <= positions_count (checked above). */
    if (count > 0 && a.stream_id < ends_count / a.capacity && read_row(&a, out, &reads, &read_bytes) < 0) {
        goto done;
    }
    result = Py_BuildValue("(OLLL)", out, a.pos, reads, read_bytes);
done:
    Py_XDECREF(out);
    PyBuffer_Release(&a.ends);
    PyBuffer_Release(&a.positions);
    return result;
}
