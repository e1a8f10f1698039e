/* lay_out_runs: a slice of a run object's runs, laid out in one C call. Its twin and spec is the slice loop
 * of stratalog.queues.format._laid_parts (docs/formats/queues.md, "Run objects"):
 *
 *     lay_out_runs(chunks, order, run_first, a, b, out) -> None
 *
 * The messages are the chunks' (Arrow binary arrays given as (int32 offsets, data), one after the other);
 * run r holds messages order[run_first[r]] .. order[run_first[r + 1] - 1]. Into `out` (writable, exactly
 * the slice's bytes: the caller allocates it from Arrow's pool, which reuses memory, where a new bytes
 * object of a slice's size is fresh pages every time): runs a .. b - 1, each as its messages' ends (u32,
 * from the start of its data) and then their bytes.
 *
 * Everything is checked before it is used (run bounds, indices into the messages, each message within its
 * chunk's bytes), in a first pass that also sizes the slice; the second pass copies. Both run without the
 * GIL: the chunks are the log cache's records (held for the call by buffer exports, never written), and an
 * upload lays its slices out in a thread of its own beside the producers. */

#include "native.h"

#include <stdint.h>
#include <string.h>

#define U32_MAX 0xFFFFFFFFLL

typedef struct {
    Py_buffer order, run_first, out;
    int held;
    NativeChunks chunks;
} Layout;

typedef enum { LAID, BAD_RUNS, BAD_INDEX, BAD_MESSAGE, TOO_BIG } Check;

static const char *check_message(Check check) {
    switch (check) {
    case BAD_RUNS:
        return "lay_out_runs: the runs a .. b do not lie within run_first and order";
    case BAD_INDEX:
        return "lay_out_runs: a message index past the chunks";
    case BAD_MESSAGE:
        return "lay_out_runs: a message lies outside its chunk's bytes";
    case TOO_BIG:
        return "lay_out_runs: a run's data exceeds 4 GiB";
    case LAID:
        break;
    }
    return "";
}

static void release_layout(Layout *l) {
    Py_buffer *all[] = {&l->order, &l->run_first, &l->out};
    for (int i = 0; i < l->held; i++) {
        PyBuffer_Release(all[i]);
    }
    native_release_chunks(&l->chunks);
}

/* The first pass: every bound and message checked, the slice's bytes counted. */
static Check size_slice(const Layout *l, Py_ssize_t a, Py_ssize_t b, Py_ssize_t *size) {
    const long long *order = l->order.buf, *run_first = l->run_first.buf;
    Py_ssize_t order_count = l->order.len / (Py_ssize_t)sizeof(long long);
    Py_ssize_t runs = l->run_first.len / (Py_ssize_t)sizeof(long long) - 1;
    Py_ssize_t total_messages = l->chunks.starts[l->chunks.count];
    if (a < 0 || a > b || b > runs) {
        return BAD_RUNS;
    }
    Py_ssize_t bytes = 0;
    for (Py_ssize_t r = a; r < b; r++) {
        if (run_first[r] < 0 || run_first[r] > run_first[r + 1] || run_first[r + 1] > order_count) {
            return BAD_RUNS;
        }
        long long run_bytes = 0;
        for (long long i = run_first[r]; i < run_first[r + 1]; i++) {
            int32_t message_bytes = 0;
            if (order[i] < 0 || order[i] >= total_messages) {
                return BAD_INDEX;
            }
            if (native_chunk_message(&l->chunks, order[i], &message_bytes) == NULL) {
                return BAD_MESSAGE;
            }
            run_bytes += message_bytes;
        }
        if (run_bytes > U32_MAX) {
            return TOO_BIG;
        }
        bytes += (Py_ssize_t)(4 * (run_first[r + 1] - run_first[r]) + run_bytes);
    }
    *size = bytes;
    return LAID;
}

/* The second pass, over what the first checked: each run's ends, then its messages. */
static void fill_slice(const Layout *l, Py_ssize_t a, Py_ssize_t b, uint8_t *out) {
    const long long *order = l->order.buf, *run_first = l->run_first.buf;
    for (Py_ssize_t r = a; r < b; r++) {
        long long count = run_first[r + 1] - run_first[r];
        uint8_t *ends = out, *data = out + 4 * count;
        uint32_t end = 0;
        for (long long i = 0; i < count; i++) {
            int32_t size = 0;
            const uint8_t *message = native_chunk_message(&l->chunks, order[run_first[r] + i], &size);
            memcpy(data + end, message, (size_t)size);
            end += (uint32_t)size;
            memcpy(ends + 4 * i, &end, 4); /* little-endian, as the format and the host are */
        }
        out = data + end;
    }
}

PyObject *native_lay_out_runs(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "lay_out_runs takes 6 arguments (chunks, order, run_first, a, b, out), "
                                      "not %zd", nargs);
        return NULL;
    }
    Py_ssize_t a = PyLong_AsSsize_t(args[3]), b = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Layout l = {.held = 0};
    PyObject *result = NULL;
    if (PyObject_GetBuffer(args[1], &l.order, PyBUF_SIMPLE) < 0) {
        goto done;
    }
    l.held = 1;
    if (PyObject_GetBuffer(args[2], &l.run_first, PyBUF_SIMPLE) < 0) {
        goto done;
    }
    l.held = 2;
    if (PyObject_GetBuffer(args[5], &l.out, PyBUF_WRITABLE) < 0) {
        goto done;
    }
    l.held = 3;
    if (l.order.len % 8 || (uintptr_t)l.order.buf % 8 || l.run_first.len % 8 || l.run_first.len < 8 ||
        (uintptr_t)l.run_first.buf % 8) {
        PyErr_SetString(PyExc_ValueError, "lay_out_runs: order and run_first are aligned int64 arrays, "
                                          "run_first one more than the runs");
        goto done;
    }
    if (native_hold_chunks(args[0], "lay_out_runs", &l.chunks) < 0) {
        goto done;
    }
    Py_ssize_t size = 0;
    Check check;
    Py_BEGIN_ALLOW_THREADS
    check = size_slice(&l, a, b, &size);
    Py_END_ALLOW_THREADS
    if (check != LAID) {
        PyErr_SetString(PyExc_ValueError, check_message(check));
        goto done;
    }
    if (size != l.out.len) {
        PyErr_Format(PyExc_ValueError, "lay_out_runs: the runs take %zd bytes, out holds %zd", size, l.out.len);
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    fill_slice(&l, a, b, l.out.buf);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    release_layout(&l);
    return result;
}
