/* A random get's read of a queue's run (docs/formats/queues.md): the pages it lies in, if the page cache
 * holds them, each checked against its CRC, and the messages asked for cut out of the run. The twin and
 * spec is stratalog.queues.objects.read_messages_cached; the reading keeps the GIL as the twin's does
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

/* Messages first .. stop - 1 of the run in raw[0:length], `count` messages framed by their ends. */
static PyObject *cut_messages(const uint8_t *raw, long long length, long long count, long long first,
                              long long stop, PyObject *key, long long stream_id) {
    long long at = 4 * count;
    if (length < at) {
        return corrupt(PyUnicode_FromFormat("run of stream %lld in object %U: shorter than its message ends; "
                                            "the object is damaged", stream_id, key));
    }
    if (count && (long long)u32_at(raw + at - 4) != length - at) {
        return corrupt(PyUnicode_FromFormat("run of stream %lld in object %U: message ends do not match its "
                                            "length", stream_id, key));
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

/* read_messages_cached(fd, runs_bytes, pages, key, start, end, count, stream_id, first, stop)
 *     -> (list[bytes], bytes read) | None */
PyObject *native_read_messages_cached(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 10) {
        PyErr_Format(PyExc_TypeError, "read_messages_cached takes 10 arguments, not %zd", nargs);
        return NULL;
    }
    if (native_crc32c == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no CRC32C library is loaded (stratalog.native)");
        return NULL;
    }
    long long fd, runs_bytes, start, end, count, stream_id, first, stop;
    if (as_long_long(args[0], "fd", &fd) < 0 || as_long_long(args[1], "runs_bytes", &runs_bytes) < 0 ||
        as_long_long(args[4], "start", &start) < 0 || as_long_long(args[5], "end", &end) < 0 ||
        as_long_long(args[6], "count", &count) < 0 || as_long_long(args[7], "stream_id", &stream_id) < 0 ||
        as_long_long(args[8], "first", &first) < 0 || as_long_long(args[9], "stop", &stop) < 0) {
        return NULL;
    }
    PyObject *key = args[3];
    if (!PyUnicode_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "key must be a str");
        return NULL;
    }
    if (!(0 <= start && start <= end && end <= runs_bytes && 0 <= first && first <= stop && stop <= count &&
          count <= UINT32_MAX && fd >= 0 && fd <= INT32_MAX)) {
        PyErr_Format(PyExc_ValueError, "a run at bytes %lld .. %lld of %lld, messages %lld .. %lld of %lld: "
                     "out of bounds", start, end, runs_bytes, first, stop, count);
        return NULL;
    }
    long long lo = start - start % PAGE_BYTES;
    long long hi = end + (PAGE_BYTES - end % PAGE_BYTES) % PAGE_BYTES;
    if (hi > runs_bytes) {
        hi = runs_bytes;
    }
    if (!(0 < hi - lo && hi - lo <= CACHED_READ_BYTES_MAX)) {
        Py_RETURN_NONE;
    }
    Py_buffer pages;
    if (PyObject_GetBuffer(args[2], &pages, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *data = PyMem_Malloc((size_t)(hi - lo));
    if (data == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    struct iovec vector = {.iov_base = data, .iov_len = (size_t)(hi - lo)};
    if (preadv2((int)fd, &vector, 1, (off_t)lo, RWF_NOWAIT) != hi - lo) {
        result = Py_NewRef(Py_None); /* not all in the page cache (or not readable): the caller waits */
        goto done;
    }
    long long first_page = lo / PAGE_BYTES;
    long long page_count = (hi - lo + PAGE_BYTES - 1) / PAGE_BYTES;
    if (first_page + page_count > pages.len / 4) {
        corrupt(PyUnicode_FromFormat("object %U: a read of bytes %lld .. %lld is not within its pages", key, lo, hi));
        goto done;
    }
    for (long long i = 0; i < page_count; i++) {
        long long at = i * PAGE_BYTES;
        long long size = hi - lo - at < PAGE_BYTES ? hi - lo - at : PAGE_BYTES;
        uint32_t want;
        memcpy(&want, (const uint8_t *)pages.buf + 4 * (first_page + i), 4); /* native order, as the array */
        if (native_crc32c(0, data + at, (size_t)size) != want) {
            long long page = first_page + i;
            corrupt(PyUnicode_FromFormat("object %U: page %lld (bytes %lld ..) failed its CRC: the object is "
                                         "damaged", key, page, page * PAGE_BYTES));
            goto done;
        }
    }
    PyObject *messages = cut_messages(data + (start - lo), end - start, count, first, stop, key, stream_id);
    if (messages != NULL) {
        result = Py_BuildValue("(NL)", messages, hi - lo);
    }
done:
    PyMem_Free(data);
    PyBuffer_Release(&pages);
    return result;
}
