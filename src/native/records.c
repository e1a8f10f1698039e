/* The walk of a Kafka batch's records (kafka/record_check.py's `walk_records`, its Python twin and spec).
 *
 * Every rule, every error and every message is the twin's: tests/test_native_twins.py feeds both the
 * same bytes, valid and hostile, and requires the same result or the same error. Varint values are
 * 128-bit: a varint may run to 10 bytes (70 bits), which Python reads exactly. A length that would move
 * the position past the data moves it to BEYOND instead, without overflowing. No byte is read without
 * checking its position against the end first. */

#include "native.h"

#include <stdint.h>

/* records.py: RECORD_BYTES_MIN less the length varint, NULL_LENGTH, VARLONG_SHIFT_LIMIT. */
#define RECORD_BODY_BYTES_MIN 6
#define NULL_LENGTH (-1)
#define VARLONG_SHIFT_LIMIT 70

__extension__ typedef __int128 i128;
__extension__ typedef unsigned __int128 u128;

typedef struct {
    const uint8_t *data;
    Py_ssize_t end;
} Bytes;

/* A position past the end of the data: where a length read from hostile bytes sends the walk. Any read
 * there runs off the end, and it compares above every end, as the twin's unbounded position does. */
#define BEYOND PY_SSIZE_T_MAX


typedef enum { READ_OK, READ_RAN_OFF, READ_FAILED } ReadStatus;

static PyObject *long_from_i128(i128 value) {
    if (value >= INT64_MIN && value <= INT64_MAX) {
        return PyLong_FromLongLong((long long)value);
    }
    u128 magnitude = value < 0 ? (u128)(-(value + 1)) + 1 : (u128)value;
    PyObject *high = PyLong_FromUnsignedLongLong((unsigned long long)(magnitude >> 64));
    PyObject *low = PyLong_FromUnsignedLongLong((unsigned long long)magnitude);
    PyObject *sixty_four = PyLong_FromLong(64);
    PyObject *shifted = high && sixty_four ? PyNumber_Lshift(high, sixty_four) : NULL;
    PyObject *whole = shifted && low ? PyNumber_Or(shifted, low) : NULL;
    Py_XDECREF(high);
    Py_XDECREF(low);
    Py_XDECREF(sixty_four);
    Py_XDECREF(shifted);
    if (whole == NULL || value >= 0) {
        return whole;
    }
    PyObject *negated = PyNumber_Negative(whole);
    Py_DECREF(whole);
    return negated;
}

/* A record error of the twin's: `kind` names the class in stratalog.kafka.records, `format` is a
 * PyUnicode_FromFormat format whose %S arguments are the values given (at most two). */
static void record_error(const char *kind, const char *format, Py_ssize_t index, int values, i128 first,
                         i128 second) {
    PyObject *a = values >= 1 ? long_from_i128(first) : NULL;
    PyObject *b = values >= 2 ? long_from_i128(second) : NULL;
    if ((values >= 1 && a == NULL) || (values >= 2 && b == NULL)) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        return;
    }
    PyObject *message = values == 0   ? PyUnicode_FromFormat(format, index)
                        : values == 1 ? PyUnicode_FromFormat(format, index, a)
                                      : PyUnicode_FromFormat(format, index, a, b);
    Py_XDECREF(a);
    Py_XDECREF(b);
    if (message != NULL) {
        native_raise(kind, message);
        Py_DECREF(message);
    }
}

static void ran_off(void) {
    PyObject *message = PyUnicode_FromString("a record runs past the end of the batch");
    if (message != NULL) {
        native_raise("CorruptRecordError", message);
        Py_DECREF(message);
    }
}

/* A varint of two or more bytes at data[at], its first byte `first` (>= 0x80): up to 9 bytes in 64 bits,
 * the 10th (bits 63 to 69) in 128. */
static ReadStatus read_long_varint(const Bytes *in, Py_ssize_t *p, uint8_t first, i128 *value) {
    Py_ssize_t at = *p;
    uint64_t raw = first & 0x7F;
    int shift = 7;
    for (;;) {
        at += 1;
        if (at >= in->end) {
            return READ_RAN_OFF;
        }
        uint8_t b = in->data[at];
        if (shift < 63) {
            raw |= (uint64_t)(b & 0x7F) << shift;
            if (b < 0x80) {
                *value = (i128)(raw >> 1) ^ -(i128)(raw & 1);
                *p = at + 1;
                return READ_OK;
            }
        } else {
            u128 whole = (u128)raw | ((u128)(b & 0x7F) << shift);
            if (b < 0x80) {
                *value = (i128)(whole >> 1) ^ -(i128)(whole & 1);
                *p = at + 1;
                return READ_OK;
            }
        }
        shift += 7;
        if (shift >= VARLONG_SHIFT_LIMIT) {
            PyObject *message =
                PyUnicode_FromFormat("a varint longer than %d bytes at byte %zd", VARLONG_SHIFT_LIMIT / 7, at);
            if (message != NULL) {
                native_raise("CorruptRecordError", message);
                Py_DECREF(message);
            }
            return READ_FAILED;
        }
    }
}

/* records.py's _read_varint: the zigzag varint at *p; *p moves past it. One and two bytes (most lengths
 * and deltas) inline. */
static inline ReadStatus read_varint(const Bytes *in, Py_ssize_t *p, i128 *value) {
    Py_ssize_t at = *p;
    if (at >= in->end) {
        return READ_RAN_OFF;
    }
    uint8_t b = in->data[at];
    if (b < 0x80) {
        *value = (i128)((b >> 1) ^ -(b & 1));
        *p = at + 1;
        return READ_OK;
    }
    if (at + 1 < in->end && in->data[at + 1] < 0x80) { /* two bytes: values of 64 bytes to 8 KiB */
        unsigned raw = (b & 0x7Fu) | ((unsigned)in->data[at + 1] << 7);
        *value = (i128)(raw >> 1) ^ -(i128)(raw & 1);
        *p = at + 2;
        return READ_OK;
    }
    return read_long_varint(in, p, b, value);
}

/* *p + `length` (>= 0), or BEYOND where that passes the end of the data. */
static inline Py_ssize_t skip(const Bytes *in, Py_ssize_t p, i128 length) {
    return length > (i128)(in->end - p) ? BEYOND : p + (Py_ssize_t)length;
}

static int is_utf8(const uint8_t *start, Py_ssize_t length) {
    Py_ssize_t i = 0;
    while (i < length && start[i] < 0x80) {
        i++;
    }
    if (i == length) {
        return 1;  /* ASCII: the common header key */
    }
    PyObject *decoded = PyUnicode_DecodeUTF8((const char *)start, length, "strict");
    if (decoded == NULL) {
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(decoded);
    return 1;
}

/* Read a varint or leave the walk: ran off the end (the twin's IndexError) or too long. */
#define READ(in, p, value)                                     \
    do {                                                       \
        ReadStatus status_ = read_varint((in), (p), (value));  \
        if (status_ == READ_RAN_OFF) {                         \
            ran_off();                                         \
            return -1;                                         \
        }                                                      \
        if (status_ == READ_FAILED) {                          \
            return -1;                                         \
        }                                                      \
    } while (0)

/* record_check.py's _walk_headers (record_end <= end, p < record_end). */
static int walk_headers(const Bytes *in, Py_ssize_t *pp, Py_ssize_t record_end, Py_ssize_t index) {
    Py_ssize_t p = *pp;
    i128 count, length;
    READ(in, &p, &count);
    if (!(0 <= count && count <= (i128)(record_end - p))) {
        record_error("CorruptRecordError", "record %zd: %S headers in %S bytes", index, 2, count,
                     (i128)(record_end - p));
        return -1;
    }
    for (i128 h = 0; h < count; h++) {
        READ(in, &p, &length);
        if (length < 0 || length > (i128)(record_end - p)) {
            record_error("CorruptRecordError", "record %zd: a header key of length %S", index, 1, length, 0);
            return -1;
        }
        if (!is_utf8(in->data + p, (Py_ssize_t)length)) {
            record_error("CorruptRecordError", "record %zd: a header key that is not UTF-8", index, 0, 0, 0);
            return -1;
        }
        p += (Py_ssize_t)length;
        READ(in, &p, &length);
        if (length >= 0) {
            p = skip(in, p, length);
        } else if (length != NULL_LENGTH) {
            record_error("InvalidRecordError", "record %zd: header value length %S", index, 1, length, 0);
            return -1;
        }
        if (p > record_end) {
            record_error("CorruptRecordError", "record %zd: a header runs past the record", index, 0, 0, 0);
            return -1;
        }
    }
    *pp = p;
    return 0;
}

/* record_check.py's _walk: returns 0 and the position after the last record, or -1 with an error set. */
static int walk(const Bytes *in, Py_ssize_t p, Py_ssize_t count, Py_ssize_t *after) {
    i128 length, value;
    for (Py_ssize_t i = 0; i < count; i++) {
        READ(in, &p, &length);
        if (length < RECORD_BODY_BYTES_MIN || length > (i128)(in->end - p)) {
            record_error("CorruptRecordError",
                         length < RECORD_BODY_BYTES_MIN ? "record %zd: length %S is shorter than any record"
                                                        : "record %zd: length %S runs past the batch",
                         i, 1, length, 0);
            return -1;
        }
        Py_ssize_t record_end = p + (Py_ssize_t)length;
        p += 1; /* attributes */
        READ(in, &p, &value); /* timestampDelta: any value */
        READ(in, &p, &value);
        if (value != i) {
            record_error("InvalidRecordError", "record %zd has offsetDelta %S: offsets must be dense", i, 1, value,
                         0);
            return -1;
        }
        READ(in, &p, &value); /* key length */
        if (value >= 0) {
            p = skip(in, p, value);
        } else if (value != NULL_LENGTH) {
            record_error("InvalidRecordError", "record %zd: key length %S", i, 1, value, 0);
            return -1;
        }
        READ(in, &p, &value); /* value length: running off here means the key ran past the data */
        if (value >= 0) {
            p = skip(in, p, value);
        } else if (value != NULL_LENGTH) {
            record_error("InvalidRecordError", "record %zd: value length %S", i, 1, value, 0);
            return -1;
        }
        if (p >= record_end) {
            record_error("CorruptRecordError", "record %zd: its key or value runs past the record", i, 0, 0, 0);
            return -1;
        }
        if (in->data[p]) { /* p < record_end <= end */
            if (walk_headers(in, &p, record_end, i) < 0) {
                return -1;
            }
        } else {
            p += 1;
        }
        if (p != record_end) {
            record_error("CorruptRecordError", "record %zd: its parts do not add up to its length", i, 0, 0, 0);
            return -1;
        }
    }
    *after = p;
    return 0;
}

/* args[1] and args[2]: a position, which must not be negative, and a count; 0, or -1 with the error set. */
static int position_and_count(PyObject *const *args, Py_ssize_t *position, Py_ssize_t *count) {
    *position = PyLong_AsSsize_t(args[1]);
    if (*position == -1 && PyErr_Occurred()) {
        return -1;
    }
    *count = PyLong_AsSsize_t(args[2]);
    if (*count == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (*position < 0) {
        PyErr_SetString(PyExc_ValueError, "position must not be negative");
        return -1;
    }
    return 0;
}

PyObject *native_walk_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "walk_records takes 3 arguments (data, position, count), not %zd", nargs);
        return NULL;
    }
    Py_ssize_t position, count;
    if (position_and_count(args, &position, &count) < 0) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Bytes in = {(const uint8_t *)view.buf, view.len};
    Py_ssize_t after = 0;
    int failed = walk(&in, position, count, &after);
    PyBuffer_Release(&view);
    if (failed) {
        return NULL;
    }
    return PyLong_FromSsize_t(after);
}

/* The second reading of index_kafka_records: the fields of `count` records the walk has checked. */
static int index_fields(const Bytes *in, Py_ssize_t p, Py_ssize_t count, i128 base_ts, int append,
                        long long append_ts, long long *columns) {
    i128 length, delta, value, key_bytes, value_bytes, header_count;
    for (Py_ssize_t i = 0; i < count; i++) {
        READ(in, &p, &length);
        Py_ssize_t record_end = skip(in, p, length);
        p += 1; /* attributes */
        READ(in, &p, &delta);
        READ(in, &p, &value); /* offsetDelta: the walk made it i */
        READ(in, &p, &key_bytes);
        Py_ssize_t key_start = p;
        if (key_bytes > 0) {
            p = skip(in, p, key_bytes);
        }
        READ(in, &p, &value_bytes);
        Py_ssize_t value_start = p;
        if (value_bytes < 0) {
            value_bytes = 0; /* a null value reads as an empty one */
        }
        p = skip(in, p, value_bytes);
        READ(in, &p, &header_count);
        i128 timestamp = append ? (i128)append_ts : base_ts + delta;
        if (timestamp < INT64_MIN || timestamp > INT64_MAX) {
            record_error("CorruptRecordError", "record %zd: timestamp %S does not fit an int64", i, 1, timestamp, 0);
            return -1;
        }
        long long row[INDEX_COLUMNS] = {(long long)timestamp, key_start,   (long long)key_bytes,   value_start,
                                        (long long)value_bytes, p, (long long)header_count};
        for (int c = 0; c < INDEX_COLUMNS; c++) {
            columns[(Py_ssize_t)c * count + i] = row[c];
        }
        p = record_end;
    }
    return 0;
}

PyObject *native_index_kafka_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "index_kafka_records takes 5 arguments (data, position, count, base_timestamp_ms, "
                     "append_timestamp_ms), not %zd", nargs);
        return NULL;
    }
    Py_ssize_t position, count;
    if (position_and_count(args, &position, &count) < 0) {
        return NULL;
    }
    long long base_ts = PyLong_AsLongLong(args[3]);
    int append = args[4] != Py_None;
    long long append_ts = append ? PyLong_AsLongLong(args[4]) : 0;
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (count < 0) {
        PyErr_SetString(PyExc_ValueError, "count must not be negative");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    Bytes in = {(const uint8_t *)view.buf, view.len};
    Py_ssize_t after = 0;
    PyObject *index = NULL;
    long long *columns = NULL;
    if (walk(&in, position, count, &after) == 0) {
        if (after != in.end) {
            PyObject *message = PyUnicode_FromFormat("%zd bytes after the last record", in.end - after);
            if (message != NULL) {
                native_raise("CorruptRecordError", message);
                Py_DECREF(message);
            }
        } else {
            index = native_new_index(count, &columns);
            if (index != NULL && index_fields(&in, position, count, base_ts, append, append_ts, columns) < 0) {
                Py_CLEAR(index);
            }
        }
    }
    PyBuffer_Release(&view);
    return index;
}
