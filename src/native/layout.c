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
    Py_buffer *chunk_buffers; /* two per chunk: offsets, data */
    Py_ssize_t chunk_count, held_chunk_buffers;
    int held;
    Py_ssize_t *chunk_starts; /* the index of each chunk's first message; then the total */
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
    if (l->held > 0) {
        PyBuffer_Release(&l->order);
    }
    if (l->held > 1) {
        PyBuffer_Release(&l->run_first);
    }
    if (l->held > 2) {
        PyBuffer_Release(&l->out);
    }
    for (Py_ssize_t i = 0; i < l->held_chunk_buffers; i++) {
        PyBuffer_Release(&l->chunk_buffers[i]);
    }
    PyMem_Free(l->chunk_buffers);
    PyMem_Free(l->chunk_starts);
}

static int hold_chunks(Layout *l, PyObject *chunks) {
    l->chunk_count = PyTuple_GET_SIZE(chunks);
    l->chunk_buffers = PyMem_Calloc((size_t)(2 * l->chunk_count) + 1, sizeof(Py_buffer));
    l->chunk_starts = PyMem_Calloc((size_t)l->chunk_count + 1, sizeof(Py_ssize_t));
    if (l->chunk_buffers == NULL || l->chunk_starts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t c = 0; c < l->chunk_count; c++) {
        PyObject *chunk = PyTuple_GET_ITEM(chunks, c);
        if (!PyTuple_Check(chunk) || PyTuple_GET_SIZE(chunk) != 2) {
            PyErr_SetString(PyExc_TypeError, "lay_out_runs: each chunk is (offsets, data)");
            return -1;
        }
        for (int k = 0; k < 2; k++) {
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(chunk, k), &l->chunk_buffers[2 * c + k], PyBUF_SIMPLE) < 0) {
                return -1;
            }
            l->held_chunk_buffers++;
        }
        const Py_buffer *offsets = &l->chunk_buffers[2 * c];
        if (offsets->len % (Py_ssize_t)sizeof(int32_t) || offsets->len < (Py_ssize_t)sizeof(int32_t) ||
            (uintptr_t)offsets->buf % sizeof(int32_t)) {
            PyErr_SetString(PyExc_ValueError, "lay_out_runs: a chunk's offsets are aligned int32, one more than "
                                              "its messages");
            return -1;
        }
        l->chunk_starts[c + 1] = l->chunk_starts[c] + offsets->len / (Py_ssize_t)sizeof(int32_t) - 1;
    }
    return 0;
}

/* Where message `index` lies (NULL: outside its chunk's bytes); its size in *size. */
static const uint8_t *message_at(const Layout *l, long long index, int32_t *size) {
    Py_ssize_t lo = 0, hi = l->chunk_count; /* the chunk c with starts[c] <= index < starts[c + 1] */
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (l->chunk_starts[mid] <= index) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    const int32_t *offsets = l->chunk_buffers[2 * lo].buf;
    Py_ssize_t m = (Py_ssize_t)index - l->chunk_starts[lo];
    if (offsets[m] < 0 || offsets[m] > offsets[m + 1] || offsets[m + 1] > l->chunk_buffers[2 * lo + 1].len) {
        return NULL;
    }
    *size = offsets[m + 1] - offsets[m];
    return (const uint8_t *)l->chunk_buffers[2 * lo + 1].buf + offsets[m];
}

/* The first pass: every bound and message checked, the slice's bytes counted. */
static Check size_slice(const Layout *l, Py_ssize_t a, Py_ssize_t b, Py_ssize_t *size) {
    const long long *order = l->order.buf, *run_first = l->run_first.buf;
    Py_ssize_t order_count = l->order.len / (Py_ssize_t)sizeof(long long);
    Py_ssize_t runs = l->run_first.len / (Py_ssize_t)sizeof(long long) - 1;
    Py_ssize_t total_messages = l->chunk_starts[l->chunk_count];
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
            if (message_at(l, order[i], &message_bytes) == NULL) {
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
            const uint8_t *message = message_at(l, order[run_first[r] + i], &size);
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
    if (!PyTuple_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "lay_out_runs: chunks is a tuple of (offsets, data)");
        return NULL;
    }
    Py_ssize_t a = PyLong_AsSsize_t(args[3]), b = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Layout l = {.held = 0, .chunk_buffers = NULL, .chunk_starts = NULL, .held_chunk_buffers = 0};
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
    if (hold_chunks(&l, args[0]) < 0) {
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
