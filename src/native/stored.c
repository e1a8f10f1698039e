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
        /* The store's batches are dense: a record's offset delta is its number. */
        long long row[INDEX_COLUMNS] = {timestamp,   key_start,  key_bytes, value_start, value_bytes,
                                        value_start + value_bytes, header_count, i};
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

/* An int64 column handed over by buffer: its values and its length. */
typedef struct {
    Py_buffer view;
    const long long *values;
    Py_ssize_t count;
} Column;

static int column_open(PyObject *object, Column *column, const char *name) {
    if (PyObject_GetBuffer(object, &column->view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        return -1;
    }
    const char *format = column->view.format;
    if (column->view.itemsize != 8 || format == NULL || (strcmp(format, "q") != 0 && strcmp(format, "l") != 0 &&
                                                          strcmp(format, "<q") != 0 && strcmp(format, "=q") != 0)) {
        PyErr_Format(PyExc_TypeError, "%s must hold int64 values", name);
        PyBuffer_Release(&column->view);
        return -1;
    }
    column->values = (const long long *)column->view.buf;
    column->count = column->view.len / 8;
    return 0;
}

static void put_little(uint8_t *at, uint64_t value, int width) {
    for (int i = 0; i < width; i++) {
        at[i] = (uint8_t)(value >> (8 * i));
    }
}

enum { DEST, KEY_START, KEY_BYTES, VALUE_START, VALUE_BYTES, TIMESTAMP, ENCODE_COLUMNS };
static const char *const ENCODE_COLUMN_NAMES[ENCODE_COLUMNS] = {"dest", "key_start", "key_bytes", "value_start",
                                                                "value_bytes", "timestamp_ms"};

/* Lay each record out; 0, or -1 with ValueError set (the twin's messages). */
static int encode_records(uint8_t *out, Py_ssize_t out_bytes, const uint8_t *keys, Py_ssize_t keys_bytes,
                          const uint8_t *values, Py_ssize_t values_bytes, const Column *c, Py_ssize_t rows) {
    for (Py_ssize_t i = 0; i < rows; i++) {
        long long dest = c[DEST].values[i], key_start = c[KEY_START].values[i], key_bytes = c[KEY_BYTES].values[i];
        long long value_start = c[VALUE_START].values[i], value_bytes = c[VALUE_BYTES].values[i];
        long long key_kept = key_bytes > 0 ? key_bytes : 0;
        if (key_bytes < -1 || key_bytes > INT32_MAX || value_bytes < 0 || value_bytes > INT32_MAX ||
            key_start < 0 || key_start > keys_bytes - key_kept || value_start < 0 ||
            value_start > values_bytes - value_bytes) {
            PyErr_Format(PyExc_ValueError, "row %zd: its key or value lies outside the data given", i);
            return -1;
        }
        long long record_bytes = RECORD_FIXED_BYTES + key_kept + value_bytes;
        if (record_bytes > UINT32_MAX || dest < 0 || dest > out_bytes - (4 + record_bytes)) {
            PyErr_Format(PyExc_ValueError, "row %zd: its record does not fit the output where it is placed", i);
            return -1;
        }
        uint8_t *at = out + dest;
        put_little(at, (uint64_t)record_bytes, 4);
        put_little(at + 4, (uint64_t)c[TIMESTAMP].values[i], 8);
        put_little(at + 12, (uint64_t)(uint32_t)(int32_t)key_bytes, 4);
        put_little(at + 16, (uint64_t)value_bytes, 4);
        put_little(at + 20, 0, 2); /* header count: rows with headers take the Python path */
        memcpy(at + RECORD_HEAD_BYTES, keys + key_start, (size_t)key_kept);
        memcpy(at + RECORD_HEAD_BYTES + key_kept, values + value_start, (size_t)value_bytes);
    }
    return 0;
}

PyObject *native_encode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 + ENCODE_COLUMNS) {
        PyErr_Format(PyExc_TypeError, "encode_records takes %d arguments (out, keys, values, dest, key_start, "
                     "key_bytes, value_start, value_bytes, timestamp_ms), not %zd", 3 + ENCODE_COLUMNS, nargs);
        return NULL;
    }
    Py_buffer out, keys, values;
    Column columns[ENCODE_COLUMNS];
    int opened = 0;
    int failed = 1;
    if (PyObject_GetBuffer(args[0], &out, PyBUF_WRITABLE) < 0) {
        return NULL;
    }
    if (PyObject_GetBuffer(args[1], &keys, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&out);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &values, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&keys);
        PyBuffer_Release(&out);
        return NULL;
    }
    while (opened < ENCODE_COLUMNS && column_open(args[3 + opened], &columns[opened], ENCODE_COLUMN_NAMES[opened]) == 0) {
        opened++;
    }
    if (opened == ENCODE_COLUMNS) {
        Py_ssize_t rows = columns[0].count;
        int same = 1;
        for (int c = 1; c < ENCODE_COLUMNS; c++) {
            same &= columns[c].count == rows;
        }
        if (!same) {
            PyErr_SetString(PyExc_ValueError, "the columns must have one value per row each");
        } else {
            failed = encode_records((uint8_t *)out.buf, out.len, (const uint8_t *)keys.buf, keys.len,
                                    (const uint8_t *)values.buf, values.len, columns, rows);
        }
    }
    for (int c = 0; c < opened; c++) {
        PyBuffer_Release(&columns[c].view);
    }
    PyBuffer_Release(&values);
    PyBuffer_Release(&keys);
    PyBuffer_Release(&out);
    if (failed) {
        return NULL;
    }
    Py_RETURN_NONE;
}
