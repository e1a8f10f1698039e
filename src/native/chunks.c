/* Chunks of messages, as the queue store's compiled functions take them: a tuple of (offsets, data), each an
 * Arrow binary array's int32 offsets (one more than its messages) and the bytes they point into, the
 * messages numbered across the chunks one after the other (stratalog.queues.format.chunks_of makes them).
 * Held for a call by buffer exports; a message's offsets are checked against its chunk's bytes when it
 * is looked up, so a call reads only the messages it uses. */

#include "native.h"

#include <string.h>

void native_release_chunks(NativeChunks *chunks) {
    for (Py_ssize_t i = 0; i < chunks->held; i++) {
        PyBuffer_Release(&chunks->buffers[i]);
    }
    PyMem_Free(chunks->buffers);
    PyMem_Free(chunks->starts);
    memset(chunks, 0, sizeof *chunks);
}

int native_hold_chunks(PyObject *tuple, const char *who, NativeChunks *chunks) {
    memset(chunks, 0, sizeof *chunks);
    if (!PyTuple_Check(tuple)) {
        PyErr_Format(PyExc_TypeError, "%s: chunks is a tuple of (offsets, data)", who);
        return -1;
    }
    chunks->count = PyTuple_GET_SIZE(tuple);
    chunks->buffers = PyMem_Calloc((size_t)(2 * chunks->count) + 1, sizeof(Py_buffer));
    chunks->starts = PyMem_Calloc((size_t)chunks->count + 1, sizeof(Py_ssize_t));
    if (chunks->buffers == NULL || chunks->starts == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t c = 0; c < chunks->count; c++) {
        PyObject *chunk = PyTuple_GET_ITEM(tuple, c);
        if (!PyTuple_Check(chunk) || PyTuple_GET_SIZE(chunk) != 2) {
            PyErr_Format(PyExc_TypeError, "%s: each chunk is (offsets, data)", who);
            return -1;
        }
        for (int k = 0; k < 2; k++) {
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(chunk, k), &chunks->buffers[2 * c + k], PyBUF_SIMPLE) < 0) {
                return -1;
            }
            chunks->held++;
        }
        const Py_buffer *offsets = &chunks->buffers[2 * c];
        if (offsets->len % (Py_ssize_t)sizeof(int32_t) || offsets->len < (Py_ssize_t)sizeof(int32_t) ||
            (uintptr_t)offsets->buf % sizeof(int32_t)) {
            PyErr_Format(PyExc_ValueError, "%s: a chunk's offsets are aligned int32, one more than its messages",
                         who);
            return -1;
        }
        chunks->starts[c + 1] = chunks->starts[c] + offsets->len / (Py_ssize_t)sizeof(int32_t) - 1;
    }
    return 0;
}

const uint8_t *native_chunk_message(const NativeChunks *chunks, long long index, int32_t *size) {
    Py_ssize_t lo = 0, hi = chunks->count; /* the chunk c with starts[c] <= index < starts[c + 1] */
    while (hi - lo > 1) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (chunks->starts[mid] <= index) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    const int32_t *offsets = chunks->buffers[2 * lo].buf;
    Py_ssize_t m = (Py_ssize_t)index - chunks->starts[lo];
    if (offsets[m] < 0 || offsets[m] > offsets[m + 1] || offsets[m + 1] > chunks->buffers[2 * lo + 1].len) {
        return NULL;
    }
    *size = offsets[m + 1] - offsets[m];
    return (const uint8_t *)chunks->buffers[2 * lo + 1].buf + offsets[m];
}
