/* The index of records in the store's own batch encoding (engine/record_index.py's index_native_records,
 * its Python twin and spec; docs/formats/object.md gives the encoding). Every length is checked against
 * the bytes left in the batch before it is used; errors and messages are the twin's. */

#include "native.h"

#include <stdint.h>
#include <string.h>

/* engine/batch.py's RECORD_HEAD: record_bytes u32, timestamp i64, key_bytes i32, value_bytes i32,
 * header_count u16, little-endian; record_bytes counts what follows it. */
#define RECORD_HEAD_BYTES 22
#define RECORD_FIXED_BYTES (RECORD_HEAD_BYTES - 4)

static uint64_t little(const uint8_t *at, int width) {
    uint64_t value = 0;
    for (int i = width - 1; i >= 0; i--) {
        value = (value << 8) | at[i];
    }
    return value;
}

static void corrupt(PyObject *message) {
    if (message != NULL) {
        native_raise_from("stratalog.engine.batch", "CorruptBatchError", message);
        Py_DECREF(message);
    }
}

/* Fill `columns` with the index of `count` records at data[position:end]; 0, or -1 with an error set. */
static int index_records(const uint8_t *data, Py_ssize_t position, Py_ssize_t end, Py_ssize_t count,
                         long long *columns) {
    Py_ssize_t at = position;
    for (Py_ssize_t i = 0; i < count; i++) {
        if (RECORD_HEAD_BYTES > end - at) {
            corrupt(PyUnicode_FromFormat("record %zd runs past its batch", i));
            return -1;
        }
        const uint8_t *head = data + at;
        uint32_t record_bytes = (uint32_t)little(head, 4);
        int64_t timestamp = (int64_t)little(head + 4, 8);
        int32_t key_bytes = (int32_t)(uint32_t)little(head + 12, 4);
        int32_t value_bytes = (int32_t)(uint32_t)little(head + 16, 4);
        uint16_t header_count = (uint16_t)little(head + 20, 2);
        if ((uint64_t)record_bytes > (uint64_t)(end - at - 4)) {
            corrupt(PyUnicode_FromFormat("record %zd runs past its batch", i));
            return -1;
        }
        int64_t key_kept = key_bytes > 0 ? key_bytes : 0;
        if (key_bytes < -1 || value_bytes < 0 || RECORD_FIXED_BYTES + key_kept + value_bytes > (int64_t)record_bytes) {
            corrupt(PyUnicode_FromFormat("record %zd: a key of %d and a value of %d bytes do not fit its length of %u",
                                         i, (int)key_bytes, (int)value_bytes, (unsigned)record_bytes));
            return -1;
        }
        Py_ssize_t key_start = at + RECORD_HEAD_BYTES;
        Py_ssize_t value_start = key_start + (Py_ssize_t)key_kept;
        long long row[INDEX_COLUMNS] = {timestamp,   key_start, key_bytes, value_start,
                                        value_bytes, value_start + value_bytes, header_count};
        for (int c = 0; c < INDEX_COLUMNS; c++) {
            columns[(Py_ssize_t)c * count + i] = row[c];
        }
        at += 4 + (Py_ssize_t)record_bytes;
    }
    if (at != end) {
        corrupt(PyUnicode_FromFormat("%zd bytes after the last record", end - at));
        return -1;
    }
    return 0;
}

PyObject *native_index_native_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "index_native_records takes 4 arguments (data, position, end, count), not %zd",
                     nargs);
        return NULL;
    }
    Py_ssize_t position = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *index = NULL;
    long long *columns = NULL;
    if (!(0 <= position && position <= end && end <= view.len)) {
        PyErr_Format(PyExc_ValueError, "the range [%zd, %zd) is not within the data's %zd bytes", position, end,
                     view.len);
    } else if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "count must not be negative");
    } else if (count > (end - position) / RECORD_HEAD_BYTES) {
        corrupt(PyUnicode_FromFormat("%zd records cannot fit in %zd bytes", count, end - position));
    } else {
        index = native_new_index(count, &columns);
        if (index != NULL && index_records((const uint8_t *)view.buf, position, end, count, columns) < 0) {
            Py_CLEAR(index);
        }
    }
    PyBuffer_Release(&view);
    return index;
}
