/* The walk of a Kafka batch's records: Produce's check (kafka/record_check.py's `walk_records`) and the
 * index readers build columns from (kafka/record_index.py's `index_kafka_records`), one walk for both as
 * record_check.walk_fields is for their Python twins, which are their spec.
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

/* record_check.py's read_varint: the zigzag varint at *p; *p moves past it. One and two bytes (most lengths
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

/* record_check.py's walk_headers, from the header count (record_end <= end, p < record_end): *pp moves past
 * the headers; *count and *start are the count and where the first header starts. */
static int walk_headers(const Bytes *in, Py_ssize_t *pp, Py_ssize_t record_end, Py_ssize_t index, Py_ssize_t *count_out,
                        Py_ssize_t *start) {
    Py_ssize_t p = *pp;
    i128 count, length;
    READ(in, &p, &count);
    if (!(0 <= count && count <= (i128)(record_end - p))) {
        record_error("CorruptRecordError", "record %zd: %S headers in %S bytes", index, 2, count,
                     (i128)(record_end - p));
        return -1;
    }
    *count_out = (Py_ssize_t)count;
    *start = p;
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

/* How walk() reads offset deltas, and what it notes of each record. */
typedef struct {
    int gapped;            /* 0: record i has offsetDelta i (Produce); 1: deltas increase up to gaps_up_to */
    i128 gaps_up_to;       /* the batch's lastOffsetDelta */
    long long *columns;    /* NULL: check only; else the index, INDEX_COLUMNS x count, column after column */
    i128 base_ts;
    int append;            /* every record has append_ts (LogAppendTime) */
    long long append_ts;
    Py_ssize_t overflow;   /* the first record whose timestamp does not fit an int64, or -1 */
    i128 overflow_ts;
} Walk;

/* The index's columns, in kafka/record_index.py's order. */
enum { TIMESTAMP_MS, KEY_START, KEY_BYTES, VALUE_START, VALUE_BYTES, HEADERS_START, HEADER_COUNT, OFFSET_DELTA };

/* record_check.py's walk_fields: returns 0 and the position after the last record, or -1 with an error set.
 * With w->columns, each record's row of the index is written as it is read. */
static int walk(const Bytes *in, Py_ssize_t p, Py_ssize_t count, Walk *w, Py_ssize_t *after) {
    i128 length, delta, offset_delta, key_bytes, value_bytes, previous = -1;
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
        READ(in, &p, &delta); /* timestampDelta: any value */
        READ(in, &p, &offset_delta);
        if (!w->gapped && offset_delta != i) {
            record_error("InvalidRecordError", "record %zd has offsetDelta %S: offsets must be dense", i, 1,
                         offset_delta, 0);
            return -1;
        }
        if (w->gapped && !(previous < offset_delta && offset_delta <= w->gaps_up_to)) {
            record_error("InvalidRecordError",
                         "record %zd has offsetDelta %S: offset deltas must increase, up to the batch's "
                         "lastOffsetDelta %S", i, 2, offset_delta, w->gaps_up_to);
            return -1;
        }
        previous = offset_delta;
        READ(in, &p, &key_bytes);
        Py_ssize_t key_start = p;
        if (key_bytes >= 0) {
            p = skip(in, p, key_bytes);
        } else if (key_bytes != NULL_LENGTH) {
            record_error("InvalidRecordError", "record %zd: key length %S", i, 1, key_bytes, 0);
            return -1;
        }
        READ(in, &p, &value_bytes); /* running off here means the key ran past the data */
        Py_ssize_t value_start = p;
        if (value_bytes >= 0) {
            p = skip(in, p, value_bytes);
        } else if (value_bytes != NULL_LENGTH) {
            record_error("InvalidRecordError", "record %zd: value length %S", i, 1, value_bytes, 0);
            return -1;
        }
        if (p >= record_end) {
            record_error("CorruptRecordError", "record %zd: its key or value runs past the record", i, 0, 0, 0);
            return -1;
        }
        Py_ssize_t header_count = 0, headers_start = p + 1;
        if (in->data[p]) { /* p < record_end <= end */
            if (walk_headers(in, &p, record_end, i, &header_count, &headers_start) < 0) {
                return -1;
            }
        } else {
            p += 1;
        }
        if (p != record_end) {
            record_error("CorruptRecordError", "record %zd: its parts do not add up to its length", i, 0, 0, 0);
            return -1;
        }
        if (w->columns != NULL) {
            /* The walk has proved every length here within the record: each fits a long long. */
            i128 timestamp = w->append ? (i128)w->append_ts : w->base_ts + delta;
            int fits = timestamp >= INT64_MIN && timestamp <= INT64_MAX;
            if (!fits && w->overflow < 0) {
                w->overflow = i;
                w->overflow_ts = timestamp;
            }
            long long row[INDEX_COLUMNS] = {
                [TIMESTAMP_MS] = fits ? (long long)timestamp : 0, [KEY_START] = key_start,
                [KEY_BYTES] = (long long)key_bytes, [VALUE_START] = value_start,
                [VALUE_BYTES] = value_bytes < 0 ? 0 : (long long)value_bytes, /* a null value reads as empty */
                [HEADERS_START] = headers_start, [HEADER_COUNT] = header_count,
                [OFFSET_DELTA] = (long long)offset_delta};
            for (int c = 0; c < INDEX_COLUMNS; c++) {
                w->columns[(Py_ssize_t)c * count + i] = row[c];
            }
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
    Walk produced = {.gapped = 0, .columns = NULL, .overflow = -1};
    int failed = walk(&in, position, count, &produced, &after);
    PyBuffer_Release(&view);
    if (failed) {
        return NULL;
    }
    return PyLong_FromSsize_t(after);
}

/* RECORD_BYTES_MIN of records.py: a record's length varint and its shortest body. */
#define RECORD_BYTES_MIN (1 + RECORD_BODY_BYTES_MIN)

static void corrupt_record(PyObject *message) {
    if (message != NULL) {
        native_raise("CorruptRecordError", message);
        Py_DECREF(message);
    }
}

PyObject *native_index_kafka_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError,
                     "index_kafka_records takes 6 arguments (data, position, count, last_offset_delta, "
                     "base_timestamp_ms, append_timestamp_ms), not %zd", nargs);
        return NULL;
    }
    Py_ssize_t position, count;
    if (position_and_count(args, &position, &count) < 0) {
        return NULL;
    }
    long long last_offset_delta = PyLong_AsLongLong(args[3]);
    long long base_ts = PyLong_AsLongLong(args[4]);
    int append = args[5] != Py_None;
    long long append_ts = append ? PyLong_AsLongLong(args[5]) : 0;
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
    Walk w = {.gapped = 1, .gaps_up_to = last_offset_delta, .columns = NULL, .base_ts = base_ts, .append = append,
              .append_ts = append_ts, .overflow = -1};
    PyObject *index = NULL;
    /* One walk checks the records and fills the index. Records take RECORD_BYTES_MIN bytes at least: a count
     * the bytes cannot hold fails the walk, which then runs without an index rather than allocate one. */
    Py_ssize_t room = position < in.end ? (in.end - position) / RECORD_BYTES_MIN : 0;
    Py_ssize_t after = 0;
    if (count <= room && (index = native_new_index(count, &w.columns)) == NULL) {
        /* MemoryError is set */
    } else if (walk(&in, position, count, &w, &after) < 0) {
        Py_CLEAR(index);
    } else if (index == NULL) { /* cannot be: more records than the bytes hold fail the walk */
        PyErr_Format(PyExc_SystemError, "%zd records walked in %zd bytes", count, in.end - position);
    } else if (after != in.end) {
        corrupt_record(PyUnicode_FromFormat("%zd bytes after the last record", in.end - after));
        Py_CLEAR(index);
    } else if (w.overflow >= 0) {
        record_error("CorruptRecordError", "record %zd: timestamp %S does not fit an int64", w.overflow, 1,
                     w.overflow_ts, 0);
        Py_CLEAR(index);
    }
    PyBuffer_Release(&view);
    return index;
}
